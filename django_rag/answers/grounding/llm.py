"""The LLM grounder (``"llm"``): an LLM judges each numbered sentence's claims against the numbered
sources; its verdicts are parsed with size and depth caps like any LLM reply.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from ...exceptions import LLMResponseError
from ...llm import get_llm
from ...llm.prompting import quote
from ...results import GroundedSpan, Grounding, SearchResult
from ..prompts import DATA_NOTICE, sources_block
from .base import Grounder, make_grounding, split_sentences


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
        data = model.complete_json(self.prompt(question, chunks, sentences), expect=None)
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
