"""Grounding: which parts of an answer its sources support.

A grounder takes the answer text and the chunks it was written from and returns a
:class:`~django_rag.results.Grounding`: a score (the share of the answer's characters that are
supported) and one :class:`~django_rag.results.GroundedSpan` per sentence or claim, with
character offsets into the text, a verdict and the chunks behind it.

Built-ins:

- :class:`LLMGrounder` (``"llm"``): an LLM judges each numbered sentence's claims against
  the numbered sources;
- :class:`CrossEncoderGrounder` (``"cross-encoder"``): a local sentence-transformers
  ``CrossEncoder`` scores (chunk, sentence) pairs: an NLI model's entailment/contradiction
  probabilities, or a relevance model's score against a threshold;
- :class:`EmbeddingGrounder` (``"embedding"``): cosine similarity of sentence and chunk
  embeddings (the configured embedder) against a threshold; a weak proxy for support.

A plain function ``func(text, chunks)`` returning a ``Grounding`` (or a list of
``GroundedSpan``) is a grounder too. :func:`ground_answer` runs one on an
:class:`~django_rag.results.Answer` and never raises: failures become warnings.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable, Sequence
from typing import Any

from ..conf import build_component, get_setting, scrub_text
from ..exceptions import ConfigurationError, LLMResponseError
from ..llm import get_llm, parse_json
from ..llm.prompting import quote
from ..rerankers.cross_encoder import load_cross_encoder
from ..results import VERDICTS, Answer, GroundedSpan, Grounding, SearchResult
from ..signals import span
from .prompts import DATA_NOTICE, sources_block

logger = logging.getLogger(__name__)

# --- sentences ----------------------------------------------------------------------------------

# A sentence ends at . ! or ? (with closing quotes/brackets and [n] citations after it) followed
# by whitespace and something that can start a sentence, or at a line break.
#
# Answers are model output, so every pattern here is linear: a match may start only at the
# first character of a run that its first quantifier would consume (the lookbehinds), so no
# run is rescanned from each of its positions, and the parts that follow one another cannot
# match the same character, so a failed attempt backtracks at most once over what it read.
_END = re.compile(
    r"(?<![.!?])[.!?]+[\"')\]]*(?:\s*\[\d+(?:\s*[,;]\s*\d+)*\])*(?=\s+[\"'(\[]?[A-Z0-9*•-])|\n+"
)
_WORDY = re.compile(r"\w")
_CITES = re.compile(r"(?<!\s)\s*\[\d+(?:\s*[,;]\s*\d+)*\]")


def split_sentences(text: str) -> list[tuple[int, int]]:
    """``(start, end)`` offsets of the sentences of ``text``, whitespace trimmed; pieces with
    no letter or digit (a stray "[1]" or bullet) are left out."""
    pieces, start = [], 0
    for match in _END.finditer(text):
        pieces.append((start, match.end()))
        start = match.end()
    pieces.append((start, len(text)))
    sentences = []
    for begin, end in pieces:
        piece = text[begin:end]
        stripped = piece.strip()
        if not stripped or not _WORDY.search(_CITES.sub("", stripped)):
            continue
        begin += len(piece) - len(piece.lstrip())
        sentences.append((begin, begin + len(stripped)))
    return sentences


def _claim_text(text: str) -> str:
    """A sentence without its [n] citation markers (what a model should judge)."""
    return _CITES.sub("", text).strip()


def make_grounding(
    spans: Sequence[GroundedSpan], grounder: str, warnings: Sequence[str] = ()
) -> Grounding:
    """A :class:`Grounding` whose score is the share of the spans' characters supported."""
    spans = sorted(spans, key=lambda s: (s.start, s.end))
    total = sum(max(0, s.end - s.start) for s in spans)
    supported = sum(max(0, s.end - s.start) for s in spans if s.verdict == "supported")
    score = supported / total if total else 0.0
    return Grounding(score=score, spans=list(spans), grounder=grounder, warnings=list(warnings))


# --- the protocol -------------------------------------------------------------------------------


class Grounder:
    """Base class: :meth:`ground` returns the :class:`Grounding` of ``text`` against ``chunks``.

    Subclasses implement :meth:`ground`; ``question`` is given when known (an LLM judge may
    use it). Calling the grounder calls :meth:`ground`.
    """

    @property
    def name(self) -> str:
        return type(self).__name__

    def ground(self, text: str, chunks: Sequence[SearchResult], *, question: str = "") -> Grounding:
        raise NotImplementedError

    def __call__(self, text: str, chunks: Sequence[SearchResult], **kw: Any) -> Grounding:
        return self.ground(text, chunks, **kw)

    def __repr__(self) -> str:
        return f"<{self.name}>"


class CallableGrounder(Grounder):
    """Wraps ``func(text, chunks)`` returning a :class:`Grounding` or a list of spans."""

    def __init__(self, func: Callable[..., Any]):
        self.func = func

    @property
    def name(self) -> str:
        return getattr(self.func, "__qualname__", "custom_function")

    def ground(self, text, chunks, *, question: str = "") -> Grounding:
        result = self.func(text, list(chunks))
        if isinstance(result, Grounding):
            if not result.grounder:
                result.grounder = self.name
            return result
        if isinstance(result, list | tuple) and all(isinstance(s, GroundedSpan) for s in result):
            return make_grounding(result, self.name)
        raise LLMResponseError(
            f"grounder {self.name} returned {type(result).__name__}; a grounder returns a "
            "Grounding or a list of GroundedSpan"
        )


# --- the LLM judge ------------------------------------------------------------------------------


def grounding_prompt(question: str, chunks: Sequence[SearchResult], sentences: list[str]) -> str:
    """The default LLM judge prompt: numbered sources, numbered answer sentences, JSON out."""
    numbered = "\n".join(f"{n}. {quote(s)}" for n, s in enumerate(sentences, start=1))
    return (
        "Check an answer against its sources. For every numbered sentence of the answer, list "
        "the factual claims it makes and judge each one against the sources only (not your "
        'own knowledge): "supported" when a source states it or it follows directly from '
        'one, "contradicted" when a source says otherwise, "unsupported" when no source '
        "says it. Give the numbers of the sources that support (or contradict) each claim. "
        "A sentence that makes no claim (a greeting, 'I don't know') is supported. "
        + DATA_NOTICE
        + "\n\n"
        + sources_block(chunks)
        + (f"\n\nQuestion: {quote(question)}" if question else "")
        + f"\n\n<answer_sentences>\n{numbered}\n</answer_sentences>\n\n"
        'Reply with JSON only: {"claims": [{"sentence": <number>, "claim": "...", '
        '"verdict": "supported|unsupported|contradicted", "sources": [<numbers>]}]}'
    )


_VERDICT_WORDS = {
    "supported": "supported",
    "support": "supported",
    "supports": "supported",
    "entailed": "supported",
    "entailment": "supported",
    "yes": "supported",
    "true": "supported",
    "grounded": "supported",
    "contradicted": "contradicted",
    "contradict": "contradicted",
    "contradicts": "contradicted",
    "contradiction": "contradicted",
    "refuted": "contradicted",
    "false": "contradicted",
    "unsupported": "unsupported",
    "not supported": "unsupported",
    "not_supported": "unsupported",
    "neutral": "unsupported",
    "no": "unsupported",
    "unknown": "unsupported",
    "ungrounded": "unsupported",
}
_SEVERITY = {"supported": 0, "unsupported": 1, "contradicted": 2}


def parse_verdict(value: Any) -> str | None:
    """``"supported"``, ``"unsupported"`` or ``"contradicted"`` from what a model wrote
    (booleans, synonyms, any case); None when it cannot tell."""
    if isinstance(value, bool):
        return "supported" if value else "unsupported"
    if not isinstance(value, str) or len(value) > 100:  # no verdict is longer
        return None
    word = re.sub(r"[\s-]+", " ", value.strip().lower()).strip(" .!\"'")
    return _VERDICT_WORDS.get(word) or _VERDICT_WORDS.get(word.replace(" ", "_"))


def _numbers(value: Any) -> list[int]:
    """Source numbers from ``[1, 2]``, ``"1, 2"``, ``"[1][3]"``, ``3``..."""
    if value is None or isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [value] if abs(value) < 10**9 else []
    if isinstance(value, float):
        return [int(value)] if value.is_integer() and abs(value) < 1e9 else []
    if isinstance(value, str):
        # A source or sentence number has a few digits; longer runs are not numbers of ours.
        return [int(n) for n in re.findall(r"\d+", value) if len(n) <= 9]
    if isinstance(value, list | tuple):
        return [n for item in value for n in _numbers(item)]
    return []


class LLMGrounder(Grounder):
    """An LLM judges the claims of each sentence: supported, unsupported or contradicted,
    with the numbers of the sources behind each. A sentence's verdict is its worst claim's;
    a sentence the judge skipped is unsupported (with a warning).

    ``prompt(question, chunks, sentences)`` replaces the prompt (it must ask for the same
    JSON). The output is parsed tolerantly: a bare list, ``claims``/``sentences``/
    ``verdicts`` keys, verdict synonyms, source numbers as strings.
    """

    def __init__(self, *, llm: Any = None, prompt: Callable[..., str] | None = None):
        self.llm = llm
        self.prompt = prompt or grounding_prompt

    def ground(self, text, chunks, *, question: str = "") -> Grounding:
        chunks = list(chunks)
        offsets = split_sentences(text)
        if not offsets:
            return make_grounding([], self.name, ["the answer has no sentence to ground"])
        model = get_llm(self.llm, feature="The LLM grounder")
        sentences = [text[a:b] for a, b in offsets]
        data = parse_json(
            model.complete(self.prompt(question, chunks, sentences)).text, expect=None
        )
        claims = self._claims(data)
        verdicts: dict[int, str] = {}
        sources: dict[int, list[int]] = {}
        warnings = []
        for claim in claims:
            numbers = _numbers(claim.get("sentence", claim.get("id")))
            verdict = parse_verdict(claim.get("verdict", claim.get("label")))
            if not numbers or not 1 <= numbers[0] <= len(offsets) or verdict is None:
                warnings.append(f"a claim the judge returned was not understood: {claim!r:.200}")
                continue
            n = numbers[0]
            if _SEVERITY[verdict] >= _SEVERITY.get(verdicts.get(n, "supported"), 0):
                if verdict != verdicts.get(n):
                    sources[n] = []
                verdicts[n] = verdict
                cited = _numbers(claim.get("sources", claim.get("source")))
                sources.setdefault(n, []).extend(c for c in cited if 1 <= c <= len(chunks))
        spans = []
        for n, (start, end) in enumerate(offsets, start=1):
            if n not in verdicts:
                warnings.append(f"the judge gave no verdict for sentence {n}")
            ids = [chunks[c - 1].chunk_id for c in dict.fromkeys(sources.get(n, []))]
            spans.append(
                GroundedSpan(start, end, text[start:end], verdicts.get(n, "unsupported"), ids)
            )
        return make_grounding(spans, self.name, warnings)

    @staticmethod
    def _claims(data: Any) -> list[dict[str, Any]]:
        if isinstance(data, dict):
            for key in ("claims", "sentences", "verdicts", "results"):
                if isinstance(data.get(key), list):
                    data = data[key]
                    break
            else:
                data = [data] if "verdict" in data else None
        if not isinstance(data, list):
            raise LLMResponseError("The grounding judge's JSON had no list of claims.")
        return [item for item in data if isinstance(item, dict)]


# --- local models -------------------------------------------------------------------------------


def _softmax(row: Sequence[float]) -> list[float]:
    top = max(row)
    exps = [math.exp(v - top) for v in row]
    total = sum(exps)
    return [v / total for v in exps]


def _span_for(
    text: str,
    start: int,
    end: int,
    chunks: Sequence[SearchResult],
    support: Sequence[float],
    contradiction: Sequence[float | None],
    threshold: float,
    contradiction_threshold: float,
) -> GroundedSpan:
    supporting = [i for i, value in enumerate(support) if value >= threshold]
    if supporting:
        ids = [chunks[i].chunk_id for i in sorted(supporting, key=lambda i: -support[i])]
        return GroundedSpan(start, end, text[start:end], "supported", ids, float(max(support)))
    against = [
        i
        for i, value in enumerate(contradiction)
        if value is not None and value >= contradiction_threshold
    ]
    if against:
        ids = [chunks[i].chunk_id for i in sorted(against, key=lambda i: -contradiction[i])]
        best = max(contradiction[i] for i in against)
        return GroundedSpan(start, end, text[start:end], "contradicted", ids, float(best))
    best = max(support) if support else None
    return GroundedSpan(
        start, end, text[start:end], "unsupported", [], None if best is None else float(best)
    )


class CrossEncoderGrounder(Grounder):
    """Scores every (chunk, sentence) pair with a sentence-transformers ``CrossEncoder``
    (any model name or local path; loaded lazily, once per process).

    With an NLI model (several labels) the scores are softmaxed: a sentence is supported when
    a chunk entails it with probability >= ``threshold`` (default 0.5), contradicted when one
    contradicts it with probability >= ``contradiction_threshold`` (default 0.5), else
    unsupported. The labels are found in the model's ``id2label`` (names containing "entail"
    and "contradict"); ``labels={"entailment": 1, "contradiction": 0}`` sets them. With a
    relevance model (one score per pair) a sentence is supported when its best chunk scores
    >= ``threshold`` (default 0.5; the score is the model's output, a probability for models
    with a sigmoid head), never contradicted.
    """

    def __init__(
        self,
        *,
        model: str = "cross-encoder/nli-deberta-v3-xsmall",
        threshold: float | None = None,
        contradiction_threshold: float = 0.5,
        labels: dict[str, int] | None = None,
        batch_size: int = 32,
        max_length: int = 512,
        device: str | None = None,
    ):
        for name, value in (
            ("threshold", threshold),
            ("contradiction_threshold", contradiction_threshold),
        ):
            if value is not None and (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
            ):
                raise ConfigurationError("GROUNDER", value, f"{name} must be a finite number")
        if labels is not None and (
            not isinstance(labels, dict)
            or "entailment" not in labels
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in labels.values())
        ):
            raise ConfigurationError(
                "GROUNDER", labels, 'labels must be like {"entailment": 1, "contradiction": 0}'
            )
        self.model_name = model
        self.threshold = 0.5 if threshold is None else float(threshold)
        self.contradiction_threshold = float(contradiction_threshold)
        self.labels = labels
        self.batch_size = batch_size
        self.max_length = max_length
        self.device = device

    @property
    def model(self):
        return load_cross_encoder(
            self.model_name, max_length=self.max_length, device=self.device, kind="grounder"
        )

    def _label_indices(self, model, width: int) -> tuple[int, int | None]:
        if self.labels is not None:
            entail, contra = self.labels["entailment"], self.labels.get("contradiction")
        else:
            config = getattr(getattr(model, "model", None), "config", None)
            names = {
                int(i): str(name).lower()
                for i, name in (getattr(config, "id2label", None) or {}).items()
            }
            entail = next((i for i, n in names.items() if "entail" in n), None)
            contra = next((i for i, n in names.items() if "contradict" in n), None)
            if entail is None:
                raise ConfigurationError(
                    "GROUNDER",
                    self.model_name,
                    "the model's labels name no entailment class; pass labels={'entailment': "
                    "i, 'contradiction': j}",
                )
        for index in (entail, contra):
            if index is not None and not 0 <= index < width:
                raise ConfigurationError(
                    "GROUNDER", self.labels, f"label index {index} is outside 0..{width - 1}"
                )
        return entail, contra

    def ground(self, text, chunks, *, question: str = "") -> Grounding:
        chunks = list(chunks)
        offsets = split_sentences(text)
        if not offsets:
            return make_grounding([], self.name, ["the answer has no sentence to ground"])
        if not chunks:
            spans = [GroundedSpan(a, b, text[a:b], "unsupported", []) for a, b in offsets]
            return make_grounding(spans, self.name, ["no sources to ground the answer in"])
        model = self.model
        pairs = [(chunk.text, _claim_text(text[a:b])) for a, b in offsets for chunk in chunks]
        raw = model.predict(pairs, batch_size=self.batch_size, show_progress_bar=False)
        rows = [list(map(float, row)) if hasattr(row, "__len__") else [float(row)] for row in raw]
        width = len(rows[0])
        if width == 1:
            support = [row[0] for row in rows]
            contradiction: list[float | None] = [None] * len(rows)
        else:
            entail, contra = self._label_indices(model, width)
            # Logits are softmaxed; a model whose head already gives probabilities is not.
            probabilities = [
                row if all(0 <= v <= 1 for v in row) and abs(sum(row) - 1) < 1e-4 else _softmax(row)
                for row in rows
            ]
            support = [p[entail] for p in probabilities]
            contradiction = [None if contra is None else p[contra] for p in probabilities]
        spans = []
        for s, (start, end) in enumerate(offsets):
            window = slice(s * len(chunks), (s + 1) * len(chunks))
            spans.append(
                _span_for(
                    text,
                    start,
                    end,
                    chunks,
                    support[window],
                    contradiction[window],
                    self.threshold,
                    self.contradiction_threshold,
                )
            )
        return make_grounding(spans, f"{self.name}({self.model_name})")


class EmbeddingGrounder(Grounder):
    """A sentence is supported when its embedding's cosine similarity to a chunk's is >=
    ``threshold`` (default 0.6). It measures topical closeness, not entailment: a negated or
    altered claim close to its source passes. Use it only when no NLI model is available."""

    def __init__(self, *, embedder: Any = None, threshold: float = 0.6):
        if isinstance(threshold, bool) or not isinstance(threshold, int | float):
            raise ConfigurationError("GROUNDER", threshold, "threshold must be a number")
        self.embedder = embedder
        self.threshold = float(threshold)

    def ground(self, text, chunks, *, question: str = "") -> Grounding:
        from ..embeddings import get_embedder

        chunks = list(chunks)
        offsets = split_sentences(text)
        if not offsets:
            return make_grounding([], self.name, ["the answer has no sentence to ground"])
        if not chunks:
            spans = [GroundedSpan(a, b, text[a:b], "unsupported", []) for a, b in offsets]
            return make_grounding(spans, self.name, ["no sources to ground the answer in"])
        embedder = get_embedder(self.embedder)
        sentence_vectors = embedder.embed_documents([_claim_text(text[a:b]) for a, b in offsets])
        chunk_vectors = embedder.embed_documents([chunk.text for chunk in chunks])

        def cosine(x, y):
            dot = sum(a * b for a, b in zip(x, y, strict=True))
            norm = math.sqrt(sum(a * a for a in x)) * math.sqrt(sum(b * b for b in y))
            return dot / norm if norm else 0.0

        spans = []
        for (start, end), vector in zip(offsets, sentence_vectors, strict=True):
            similarity = [cosine(vector, other) for other in chunk_vectors]
            spans.append(
                _span_for(
                    text,
                    start,
                    end,
                    chunks,
                    similarity,
                    [None] * len(chunks),
                    self.threshold,
                    1.0,
                )
            )
        return make_grounding(spans, f"{self.name}({embedder.model_name})")


# --- building and running -----------------------------------------------------------------------

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
) -> Grounding:
    """Run ``grounder`` on ``text``; never raises for a failing grounder: the result then has
    score 0, no spans and a warning saying why. A bad spec still raises
    :class:`~django_rag.exceptions.ConfigurationError`."""
    component = grounder if isinstance(grounder, Grounder) else get_grounder(grounder, llm=llm)
    with span("agent.ground", grounder=component.name, chunks=len(chunks)) as s:
        try:
            result = component.ground(text, list(chunks), question=question)
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
            return Grounding(score=0.0, spans=[], grounder=component.name, warnings=[message])
        s.set(score=result.score, spans=len(result.spans), warnings=len(result.warnings))
        return result


def ground_answer(answer: Answer, grounder: Any = True, *, llm: Any = None) -> Answer:
    """Attach ``answer.grounding`` (grounded against ``answer.chunks``); failures add a
    warning to ``answer.warnings`` and the grounding's, never an exception."""
    result = ground_text(answer.text, answer.chunks, grounder, question=answer.question, llm=llm)
    answer.grounding = result
    answer.warnings.extend(f"ground: {w}" for w in result.warnings if "failed" in w)
    return answer


__all__ = [
    "ALIASES",
    "CallableGrounder",
    "CrossEncoderGrounder",
    "EmbeddingGrounder",
    "Grounder",
    "LLMGrounder",
    "get_grounder",
    "ground_answer",
    "ground_text",
    "grounding_prompt",
    "make_grounding",
    "parse_verdict",
    "split_sentences",
]
