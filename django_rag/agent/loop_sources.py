"""The numbered sources of one :class:`~django_rag.agent.loop.Loop` run (:class:`Sources`):
every chunk the tools found gets a number the model cites as ``[n]``; at most ``max_chunks``
are held, and what the tools found is summed up for whoever writes the answer."""

from __future__ import annotations

import json
from typing import Any

from ..results import SearchResult
from . import prompts
from .loop_tools import ToolStep

#: The longest custom tool result the answer's writer is shown (each; the controller saw it
#: all, up to ``max_tool_result_chars``).
MAX_FINDING_CHARS = 10_000
#: The most characters of conversation the answer's writer is shown (the latest kept).
MAX_TRANSCRIPT_CHARS = 60_000


class Sources:
    """The sources of one run: ``chunks`` in the order found (source ``[n]`` is
    ``chunks[n - 1]``), ``numbers`` (chunk id -> n), the numbers ``held`` (at most
    ``max_chunks``) and those ``set_aside`` for stronger ones (``keep_sources="best"``)."""

    def __init__(self, max_chunks: int, keep_sources: str):
        self.max_chunks = max_chunks
        self.keep_sources = keep_sources
        self.chunks: list[SearchResult] = []
        self.numbers: dict[Any, int] = {}
        self.held: list[int] = []
        self.set_aside: list[int] = []

    def add(self, found: list[SearchResult]) -> tuple[str, tuple[list, list]]:
        """Number the chunks (a chunk seen before keeps its number), holding at most
        ``max_chunks``: past it a new chunk is dropped, or with ``keep_sources="best"`` it
        sets aside the weakest held source when it scores higher. Returns the text the model
        is sent and ``(chunk ids, new chunk ids)``."""
        numbered, ids, new, dropped, set_aside = [], [], [], 0, []
        for chunk in found:
            number = self.numbers.get(chunk.chunk_id)
            if number is not None:
                numbered.append((number, chunk, True))
                ids.append(chunk.chunk_id)
                continue
            if len(self.held) >= self.max_chunks:
                weakest = min(self.held, key=lambda n: (strength(self.chunks[n - 1]), -n))
                if self.keep_sources != "best" or strength(chunk) <= strength(
                    self.chunks[weakest - 1]
                ):
                    dropped += 1
                    continue
                self.held.remove(weakest)
                set_aside.append(weakest)
                self.set_aside.append(weakest)
            self.chunks.append(chunk)
            number = self.numbers[chunk.chunk_id] = len(self.chunks)
            self.held.append(number)
            numbered.append((number, chunk, False))
            ids.append(chunk.chunk_id)
            new.append(chunk.chunk_id)
        if not numbered and not dropped:
            return "No results.", (ids, new)
        text = prompts.loop_sources(numbered) if numbered else ""
        notes = [f"{len(new)} new source(s), {len(ids) - len(new)} found earlier."]
        if set_aside:
            listed = ", ".join(f"[{n}]" for n in sorted(set_aside))
            notes.append(
                f"Source(s) {listed} set aside for stronger ones (at most {self.max_chunks} "
                "are kept): do not rely on them."
            )
        if dropped:
            notes.append(
                f"{dropped} more result(s) dropped: the limit of {self.max_chunks} "
                "sources is reached. Answer from the sources you have."
            )
        return (text + "\n" if text else "") + " ".join(notes), (ids, new)

    def held_sources(self) -> list[tuple[int, SearchResult]]:
        """``(number, chunk)`` of the sources held: strongest first with
        ``keep_sources="best"`` (Arcana's order), in number order with ``"first"``."""
        held = [(number, self.chunks[number - 1]) for number in sorted(self.held)]
        if self.keep_sources == "best":
            held.sort(key=lambda pair: (-strength(pair[1]), pair[0]))
        return held

    def transcript(
        self, messages: list[dict[str, Any]], tool_calls: list[ToolStep], history: int
    ) -> list[str]:
        """The conversation so far, for whoever writes the answer: the ``history`` earlier
        turns (they follow the system message; the question after them is asked apart),
        what the controller said, each tool call and what it returned (a search as the
        numbers of the sources it returned that are still held: their texts come with the
        sources) and its draft answer. The loop's own nudges to the controller are left out.
        Each entry is cut at ``MAX_FINDING_CHARS``, the whole at ``MAX_TRANSCRIPT_CHARS``
        (the latest entries are kept)."""
        steps = {step.id: step for step in tool_calls}
        lines = [
            f"{m['role']}: {_cut(m['content'])}"
            for m in messages[1 : 1 + history]
            if (m.get("content") or "").strip()
        ]
        for message in messages[2 + history :]:
            role = message.get("role")
            content = message.get("content") or ""
            if role == "assistant" and content.strip():
                lines.append(f"assistant: {_cut(content)}")
            if role != "tool":
                continue
            step = steps.get(message.get("tool_call_id"))
            if step is not None:
                lines.append(self._entry(step))
        total, kept = 0, []
        for line in reversed(lines):
            total += len(line)
            if total > MAX_TRANSCRIPT_CHARS:
                kept.append(f"[{len(lines) - len(kept)} earlier entries left out]")
                break
            kept.append(line)
        return kept[::-1]

    def _entry(self, step: ToolStep) -> str:
        """One tool call and what it returned, as the writer of the answer sees it."""
        arguments = step.arguments
        if step.name == "answer":
            return f"draft answer: {_cut(str(arguments.get('text', '')))}"
        if step.name == "give_up":
            return f"gave up: {_cut(str(arguments.get('reason', '')))}"
        if step.error:
            called = json.dumps(arguments, default=str)[:1000]
            return f"{step.name}({called}) failed: {_cut(step.error)}"
        if step.name == "search" or step.chunk_ids:
            held = set(self.held)
            numbers = [self.numbers[i] for i in step.chunk_ids if i in self.numbers]
            outcome = ", ".join(f"[{n}]" for n in numbers if n in held) or "nothing kept"
            if step.name != "search":
                return f"{step.name}: {outcome}"
            searched = json.dumps(str(arguments.get("query", ""))[:1000])
            if arguments.get("collection"):
                searched += f" in {json.dumps(str(arguments['collection'])[:200])}"
            return f"search {searched}: {outcome}"
        called = json.dumps(arguments, default=str)[:1000]
        return f"{step.name}({called}) returned: {_cut(step.result)}"


def _cut(text: str) -> str:
    if len(text) <= MAX_FINDING_CHARS:
        return text
    return text[:MAX_FINDING_CHARS] + f" [cut: {len(text):,} characters]"


def attribute_searches(result: Any) -> None:
    """Each grounding span's sources with the search that found their chunk first:
    ``search_iteration`` (the controller turn) and ``search_query`` (None for a chunk no
    search returned, such as a custom tool's)."""
    grounding = result.grounding
    if grounding is None:
        return
    first: dict[Any, ToolStep] = {}
    for step in result.tool_calls:
        if step.name != "search":
            continue
        for chunk_id in step.chunk_ids:
            first.setdefault(chunk_id, step)
    for span in grounding.spans:
        for source in span.sources:
            step = first.get(source.get("chunk_id"))
            source["search_iteration"] = None if step is None else step.iteration
            source["search_query"] = None if step is None else step.arguments.get("query")


def strength(chunk: SearchResult) -> float:
    """How strong a source is for ``keep_sources="best"``: its rerank score when it has one,
    else its score."""
    value = chunk.rerank_score if chunk.rerank_score is not None else chunk.score
    return float(value or 0.0)
