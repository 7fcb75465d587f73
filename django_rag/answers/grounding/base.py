"""What every grounder shares: an answer cut into sentences (linear-time patterns: answers are
model output), the :class:`Grounder` base class, and the :class:`Grounding` built from spans.
"""

from __future__ import annotations

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
