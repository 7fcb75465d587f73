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
        """``(number, chunk)`` of the sources held, in number order."""
        return [(number, self.chunks[number - 1]) for number in sorted(self.held)]

    def findings(self, tool_calls: list[ToolStep]) -> list[str]:
        """What the tools returned in this conversation, for whoever writes the answer: each
        search (its query and the sources it returned) and each custom tool's result. The
        controller's draft answer is left out: the answer is written from the evidence."""
        lines = []
        for step in tool_calls:
            if step.name in ("answer", "give_up"):
                continue
            if step.name == "search":
                numbers = [self.numbers[i] for i in step.chunk_ids if i in self.numbers]
                where = step.arguments.get("collection")
                if step.error:
                    outcome = f"failed ({step.error})"
                else:
                    outcome = ", ".join(f"[{n}]" for n in numbers) or "nothing found"
                searched = json.dumps(step.arguments.get("query", ""))
                if where:
                    searched += f" in {json.dumps(where)}"
                lines.append(f"search {searched}: {outcome}")
                continue
            if step.chunk_ids:
                continue  # a tool that returned search results: they are numbered sources
            text = step.result
            if len(text) > MAX_FINDING_CHARS:
                text = text[:MAX_FINDING_CHARS] + f" [cut: {len(step.result):,} characters]"
            lines.append(
                f"{step.name}({json.dumps(step.arguments, default=str)[:1000]}) returned: {text}"
            )
        return lines


def strength(chunk: SearchResult) -> float:
    """How strong a source is for ``keep_sources="best"``: its rerank score when it has one,
    else its score."""
    value = chunk.rerank_score if chunk.rerank_score is not None else chunk.score
    return float(value or 0.0)
