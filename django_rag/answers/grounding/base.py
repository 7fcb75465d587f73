"""What every grounder shares: an answer cut into sentences (linear-time patterns: answers are
model output), the :class:`Grounder` base class, the :class:`Grounding` built from spans, and
the attribution of spans to the chunks whose words they share.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from collections.abc import Callable, Sequence
from typing import Any

from ...exceptions import LLMResponseError
from ...results import GroundedSpan, Grounding, SearchResult

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


def claim_text(text: str) -> str:
    """A sentence without its [n] citation markers (what a model should judge)."""
    return _CITES.sub("", text).strip()


def make_grounding(
    spans: Sequence[GroundedSpan],
    grounder: str,
    warnings: Sequence[str] = (),
    *,
    score: float | None = None,
) -> Grounding:
    """A :class:`Grounding` of ``spans`` (sorted by offset). Without ``score``, the score is the
    share of the spans' characters that are supported, and 1.0 without spans (an answer that
    says nothing says nothing unsupported)."""
    spans = sorted(spans, key=lambda s: (s.start, s.end))
    if score is None:
        total = sum(max(0, s.end - s.start) for s in spans)
        supported = sum(max(0, s.end - s.start) for s in spans if s.verdict == "supported")
        score = supported / total if total else 1.0
    return Grounding(score=score, spans=list(spans), grounder=grounder, warnings=list(warnings))


_WORD = re.compile(r"\w+")


def _words(text: str) -> set[str]:
    return set(_WORD.findall(text.lower()))


def attribute(
    spans: Sequence[GroundedSpan], chunks: Sequence[SearchResult], *, min_score: float = 0.1
) -> list[GroundedSpan]:
    """``spans`` with ``sources`` set to the chunks whose words they share, best first.

    A chunk's score is the share of the span's distinct words (lowercased ``\\w+`` tokens,
    any script) that the chunk contains, so a long chunk is not favoured for being long;
    chunks scoring below ``min_score`` are left out. A span with no words, or no chunks,
    gets no sources. Works on any grounder's spans; the originals are not changed.
    """
    chunk_words = [(chunk.chunk_id, _words(chunk.text or "")) for chunk in chunks]
    attributed = []
    for span in spans:
        words = _words(span.text)
        sources = []
        if words:
            for chunk_id, vocabulary in chunk_words:
                score = len(words & vocabulary) / len(words)
                if score >= min_score and score > 0:
                    sources.append({"chunk_id": chunk_id, "score": score})
            sources.sort(key=lambda source: -source["score"])
        attributed.append(dataclasses.replace(span, sources=sources))
    return attributed


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


def _question_style(func: Callable[..., Any]) -> str:
    """How ``func`` takes the question: ``"keyword"`` (a ``question`` parameter after the
    first two, or ``**kwargs``), ``"positional"`` (a third required positional parameter, or
    ``*args``) or ``""`` (``text, chunks`` only: the two-argument grounders, and those whose
    third parameter has a default of their own, are called as they always were)."""
    try:
        parameters = list(inspect.signature(func).parameters.values())
    except (TypeError, ValueError):  # some builtins have no signature: call them the old way
        return ""
    kind = inspect.Parameter
    if any(p.name == "question" and p.kind != kind.POSITIONAL_ONLY for p in parameters[2:]) or any(
        p.kind == kind.VAR_KEYWORD for p in parameters
    ):
        return "keyword"
    required = [
        p
        for p in parameters
        if p.kind in (kind.POSITIONAL_ONLY, kind.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    ]
    if len(required) >= 3 or any(p.kind == kind.VAR_POSITIONAL for p in parameters):
        return "positional"
    return ""


class CallableGrounder(Grounder):
    """Wraps ``func(text, chunks)`` or ``func(text, chunks, question)`` (also
    ``question=`` as a keyword) returning a :class:`Grounding` or a list of spans. The
    question is passed when the signature has room for it."""

    def __init__(self, func: Callable[..., Any]):
        self.func = func
        self.question_style = _question_style(func)

    @property
    def name(self) -> str:
        return getattr(self.func, "__qualname__", "custom_function")

    def ground(self, text, chunks, *, question: str = "") -> Grounding:
        if self.question_style == "keyword":
            result = self.func(text, list(chunks), question=question)
        elif self.question_style == "positional":
            result = self.func(text, list(chunks), question)
        else:
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
