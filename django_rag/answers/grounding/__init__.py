"""Grounding: which parts of an answer its sources support.

A grounder takes the answer text and the chunks it was written from and returns a
:class:`~django_rag.results.Grounding`: a score (0-1, higher is more faithful) and one
:class:`~django_rag.results.GroundedSpan` per claim or sentence, with character offsets into
the text, a verdict and the chunks behind it.

Built-ins:

- :class:`LLMGrounder` (``"llm"``): an LLM quotes the answer's claims and judges each against
  the numbered sources (score: the share of claims supported);
- :class:`CrossEncoderGrounder` (``"cross-encoder"``): a local sentence-transformers
  ``CrossEncoder`` scores (chunk, sentence) pairs: an NLI model's entailment/contradiction
  probabilities, or a relevance model's score against a threshold;
- :class:`EmbeddingGrounder` (``"embedding"``): cosine similarity of sentence and chunk
  embeddings (the configured embedder) against a threshold; a weak proxy for support.

A plain function ``func(text, chunks)`` or ``func(text, chunks, question)`` returning a
``Grounding`` (or a list of ``GroundedSpan``) is a grounder too. :func:`ground_answer` runs
one on an :class:`~django_rag.results.Answer` and never raises: a failure leaves
``answer.grounding`` None and a warning. :func:`attribute` links any spans to the chunks
whose words they share.

Where things are: :mod:`.base` (sentences, the ``Grounder`` base class, attribution),
:mod:`.llm` (the LLM judge and its reply's parser), :mod:`.local` (cross-encoder and embedding
grounders); building and running a grounder is here, and every public name is importable from
here.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from ...conf import build_component, get_setting, scrub_text
from ...exceptions import ConfigurationError, LLMResponseError
from ...results import VERDICTS, Answer, Grounding, SearchResult
from ...signals import span
from .base import CallableGrounder, Grounder, attribute, make_grounding, split_sentences
from .llm import LLMGrounder, grounding_prompt, parse_verdict
from .local import CrossEncoderGrounder, EmbeddingGrounder

logger = logging.getLogger(__name__)

ALIASES = {
    "llm": "django_rag.answers.grounding.LLMGrounder",
    "cross-encoder": "django_rag.answers.grounding.CrossEncoderGrounder",
    "nli": "django_rag.answers.grounding.CrossEncoderGrounder",
    "embedding": "django_rag.answers.grounding.EmbeddingGrounder",
}


def get_grounder(spec: Any = None, *, llm: Any = None) -> Grounder:
    """Build a grounder from ``spec`` (``True``/None: ``DJANGO_RAG["GROUNDER"]``): an alias
    (``"llm"``, ``"cross-encoder"``/``"nli"``, ``"embedding"``), a dotted path, a
    ``{"BACKEND": ..., "OPTIONS": {...}}`` dict, a :class:`Grounder` class or instance, or a
    function ``(text, chunks) -> Grounding``. ``llm`` is the LLM judge's model when the
    spec does not name one. A bad spec raises :class:`~django_rag.exceptions.ConfigurationError`.
    """
    setting = "ground"
    if spec is None or spec is True:
        spec, setting = get_setting("GROUNDER"), "GROUNDER"
    if spec is None or spec is False:
        raise ConfigurationError(setting, spec, "no grounder: set DJANGO_RAG['GROUNDER']")
    grounder = build_component(
        spec, setting=setting, base=Grounder, aliases=ALIASES, wrap_callable=CallableGrounder
    )
    if isinstance(grounder, LLMGrounder) and grounder.llm is None:
        grounder.llm = llm
    return grounder


def ground_text(
    text: str,
    chunks: Sequence[SearchResult],
    grounder: Any = True,
    *,
    question: str = "",
    llm: Any = None,
    warnings: list[str] | None = None,
) -> Grounding | None:
    """Run ``grounder`` on ``text`` (the answer to ``question``) against ``chunks``, and
    attribute each span to the chunks whose words it shares (:func:`attribute`).

    Never raises for a failing grounder: it returns None, logs the failure, records it on the
    ``agent.ground`` span and appends a ``"grounding failed: ..."`` line to ``warnings`` when
    a list is given. A bad spec still raises
    :class:`~django_rag.exceptions.ConfigurationError`."""
    component = grounder if isinstance(grounder, Grounder) else get_grounder(grounder, llm=llm)
    chunks = list(chunks)
    with span("agent.ground", grounder=component.name, chunks=len(chunks), question=question) as s:
        try:
            result = component.ground(text, chunks, question=question)
            if not isinstance(result, Grounding):
                raise LLMResponseError(
                    f"{component.name} returned {type(result).__name__}, not a Grounding"
                )
            for item in result.spans:
                if item.verdict not in VERDICTS:
                    raise LLMResponseError(
                        f"{component.name} returned verdict {item.verdict!r}; expected one of "
                        + ", ".join(VERDICTS)
                    )
        except Exception as exc:  # a grounder never breaks the answer it checks
            message = f"grounding failed: {type(exc).__name__}: {scrub_text(exc)[:300]}"
            logger.warning("django_rag %s", message)
            s.set(error=type(exc).__name__)
            if warnings is not None:
                warnings.append(message)
            return None
        attributed = attribute(result.spans, chunks)
        result.spans = [
            given if given.sources else found
            for given, found in zip(result.spans, attributed, strict=True)
        ]
        faithful = sum(item.verdict == "supported" for item in result.spans)
        s.set(
            score=result.score,
            spans=len(result.spans),
            faithful_span_count=faithful,
            hallucinated_span_count=len(result.spans) - faithful,
            warnings=len(result.warnings),
        )
        return result


def ground_answer(answer: Answer, grounder: Any = True, *, llm: Any = None) -> Answer:
    """Set ``answer.grounding`` (grounded against ``answer.chunks``); when the grounder fails
    it is None and ``answer.warnings`` says why, never an exception."""
    failures: list[str] = []
    answer.grounding = ground_text(
        answer.text,
        answer.chunks,
        grounder,
        question=answer.question,
        llm=llm,
        warnings=failures,
    )
    answer.warnings.extend(f"ground: {w}" for w in failures)
    return answer


__all__ = [
    "ALIASES",
    "CallableGrounder",
    "CrossEncoderGrounder",
    "EmbeddingGrounder",
    "Grounder",
    "LLMGrounder",
    "attribute",
    "get_grounder",
    "ground_answer",
    "ground_text",
    "grounding_prompt",
    "make_grounding",
    "parse_verdict",
    "split_sentences",
]
