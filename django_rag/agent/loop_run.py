"""One run of a :class:`~django_rag.agent.loop.Loop`: the controller's turns, the tool calls,
the sources and the final answer (:class:`Run`)."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..answers.service import parse_citations
from ..conf import scrub_text
from ..exceptions import (
    AgentTimeout,
    InvalidOption,
    LLMAuthenticationError,
    LLMError,
    LLMTimeout,
)
from ..llm import ToolCall, ToolCompletion, tool_message
from ..llm.parsing import value_too_large
from ..results import SearchResult
from ..retrieval.service import search_request
from ..signals import span
from ..validation import clean_collection_names, clean_query
from . import prompts
from .loop_tools import LoopResult, ToolError, ToolStep, _check_arguments

if TYPE_CHECKING:
    from .loop import Loop

logger = logging.getLogger("django_rag.agent.loop")

#: The longest custom tool result the answer's writer is shown (each; the controller saw it
#: all, up to ``max_tool_result_chars``).
MAX_FINDING_CHARS = 10_000
#: Searches repeated with the same arguments after which a run stops and writes its answer
#: from what it found (``stop_reason="repeated_calls"``).
MAX_REPEATED_SEARCHES = 2
#: The ``tool_choice`` of the turn after a text answer was sent back: call ``search``.
SEARCH_CALL = {"type": "function", "function": {"name": "search"}}


class Run:
    """The state of one run of a :class:`Loop`."""

    def __init__(self, loop: Loop):
        self.loop_ = loop
        self.deadline_at = (
            None if loop.deadline is None else time.monotonic() + float(loop.deadline)
        )
        self.chunks: list[SearchResult] = []
        self.numbers: dict[Any, int] = {}
        # The numbers of the sources held (at most max_chunks); the others were set aside.
        self.held: list[int] = []
        self.tools = {tool.name: tool for tool in loop.tools}
        self.schemas = loop._schemas()
        self.parameters = {s["function"]["name"]: s["function"]["parameters"] for s in self.schemas}
        # The collection scope is enforced by search() itself (with a message naming the
        # collections allowed), not only by the schema's enum, which a model may ignore.
        search_parameters = json.loads(json.dumps(self.parameters["search"]))
        search_parameters["properties"]["collection"].pop("enum", None)
        self.parameters["search"] = search_parameters
        self.result = LoopResult(
            question=loop.question,
            text="",
            collections=None if loop.scope is None else list(loop.scope),
            model=loop.llm.model_name,
        )
        self.result.messages = [
            {"role": "system", "content": loop._system()},
            *loop.history,
            {"role": "user", "content": loop.question},
        ]
        self.done = False
        self.sent_back = False  # a text answer before any search was sent back once
        self.force_search = False  # the turn after that asks for a search call
        self.searches: dict[str, int] = {}  # each search's arguments -> the turn it ran
        self.repeats = 0

    # --- the controller's turns

    def loop(self) -> None:
        loop, result = self.loop_, self.result
        while not self.done:
            if result.iterations >= loop.max_iterations:
                result.stop_reason = "max_iterations"
                if loop.fallback_synthesis:
                    self.synthesise()
                return
            if self.deadline_passed():
                return
            result.iterations += 1
            try:
                reply = self.controller_turn()
            except LLMError as exc:
                self.fail(exc)
                return
            except Exception as exc:  # a custom backend's bug is a provider failure too
                self.fail(
                    LLMError(
                        f"The controller LLM {loop.llm.model_name!r} raised "
                        f"{type(exc).__name__}: {scrub_text(exc)[:500]}",
                        model=loop.llm.model_name,
                    )
                )
                return
            calls = list(reply.tool_calls)
            dropped = len(calls) - loop.max_tool_calls
            if dropped > 0:
                # Only the calls that are run stay in the conversation (each needs a result).
                calls = calls[: loop.max_tool_calls]
                reply.tool_calls = calls
                result.warnings.append(
                    f"the model asked for {len(calls) + dropped} tool calls in one reply; "
                    f"the {dropped} after the first {loop.max_tool_calls} were not run"
                )
            result.messages.append(reply.message())
            if not calls:
                if reply.text.strip():
                    if self.answers_unread(reply.text):
                        continue
                    # A model that answers in plain text has answered.
                    result.warnings.append("the model answered in text, not with the answer tool")
                    self.set_answer(reply.text)
                    return
                result.messages.append(
                    {"role": "user", "content": "Call one of the tools: search, answer or give_up."}
                )
                continue
            timed_out = False
            for index, call in enumerate(calls):
                if not self.done and not timed_out and self.deadline_passed():
                    timed_out = True
                if timed_out:
                    step = self.step(call, "Not run: the loop's deadline had passed.")
                elif self.done:
                    step = self.step(call, "Not run: the conversation had already ended.")
                else:
                    step = self.call(call)
                if dropped > 0 and index == len(calls) - 1:
                    step.result += (
                        f"\n(Your reply asked for {len(calls) + dropped} tool calls; only the "
                        f"first {loop.max_tool_calls} were run. Ask for at most "
                        f"{loop.max_tool_calls} at a time.)"
                    )
                result.tool_calls.append(step)
                result.messages.append(tool_message(call.id, step.result))
            if timed_out:
                return
            cut_short = result.iterations < loop.max_iterations
            if self.repeats >= MAX_REPEATED_SEARCHES and not self.done and cut_short:
                result.stop_reason = "repeated_calls"
                result.warnings.append(
                    f"the model repeated a search it had run {self.repeats} times; the answer "
                    "was written from the sources found"
                )
                if loop.fallback_synthesis:
                    self.synthesise()
                return

    def controller_turn(self) -> ToolCompletion:
        """One controller call. The turn after a text answer was sent back asks for a
        ``search`` call (``tool_choice``); a provider (or a custom backend) that fails on that
        option is asked again without it."""
        loop = self.loop_
        if not self.force_search:
            return loop.llm.chat(self.result.messages, tools=self.schemas)
        self.force_search = False
        try:
            return loop.llm.chat(self.result.messages, tools=self.schemas, tool_choice=SEARCH_CALL)
        except (LLMTimeout, LLMAuthenticationError):
            raise
        except Exception as exc:
            logger.info(
                "django_rag loop: the forced search call failed (%s: %s); asking without it",
                type(exc).__name__,
                scrub_text(exc)[:300],
            )
            return loop.llm.chat(self.result.messages, tools=self.schemas)

    def answers_unread(self, text: str) -> bool:
        """Whether a text answer came before any search, with turns left: it is sent back
        once, asking for a search (small models answer from memory on their first turn; a
        model that answers in text again has answered)."""
        loop, result = self.loop_, self.result
        if (
            self.sent_back
            or result.iterations >= loop.max_iterations
            or any(step.name == "search" for step in result.tool_calls)
        ):
            return False
        self.sent_back = True
        self.force_search = True
        result.warnings.append("the model answered before searching; it was asked to search")
        result.messages.append(
            {
                "role": "user",
                "content": "Do not answer from memory: call search first, then answer with "
                "the answer tool, citing the sources as [n].",
            }
        )
        return True

    def deadline_passed(self) -> bool:
        """True (and the run stopped on its deadline) once the deadline has passed."""
        if self.deadline_at is None or time.monotonic() < self.deadline_at:
            return False
        result = self.result
        result.stop_reason = "deadline"
        result.error = AgentTimeout(
            f"The loop passed its deadline ({self.loop_.deadline:g}s) after "
            f"{result.iterations} turn(s) and {len(result.tool_calls)} tool call(s). Raise "
            "DJANGO_RAG['AGENT_DEADLINE'] or Loop(deadline=...), or lower max_iterations."
        )
        return True

    def fail(self, exc: Exception) -> None:
        passed = self.deadline_at is not None and time.monotonic() >= self.deadline_at
        # A call cut short by the loop's own deadline is the deadline, not a provider failure.
        self.result.stop_reason = "deadline" if isinstance(exc, LLMTimeout) and passed else "error"
        self.result.error = exc
        logger.warning(
            "django_rag loop stopped on an LLM error: %s: %s",
            type(exc).__name__,
            scrub_text(exc)[:500],
        )

    def step(self, call: ToolCall, result: str, error: str | None = None, **extra) -> ToolStep:
        return ToolStep(
            self.result.iterations, call.id, call.name, call.arguments, result, error, **extra
        )

    def call(self, call: ToolCall) -> ToolStep:
        started = time.perf_counter()
        arguments = call.arguments
        with span(
            "agent.loop.tool",
            tool=call.name,
            call_id=call.id,
            iteration=self.result.iterations,
            query=arguments.get("query") if call.name == "search" else None,
            collection=arguments.get("collection") if call.name == "search" else None,
        ) as s:
            try:
                if call.error:
                    raise ToolError(f"{call.error}; send the arguments as a JSON object")
                if call.name not in self.parameters:
                    raise ToolError(
                        f"there is no tool {call.name!r}; the tools are "
                        + ", ".join(self.parameters)
                    )
                problem = _check_arguments(arguments, self.parameters[call.name])
                if problem:
                    raise ToolError(f"bad arguments for {call.name}: {problem}")
                repeated = self.repeated(call)
                if repeated:
                    step = self.step(call, repeated)
                else:
                    text, found = self.dispatch(call.name, arguments)
                    step = self.step(call, text)
                    if found is not None:
                        step.chunk_ids, step.new_chunk_ids = found
            except Exception as exc:
                message = (
                    scrub_text(exc)[:1000]
                    if isinstance(exc, ToolError)
                    else (f"{type(exc).__name__}: {scrub_text(exc)[:1000]}")
                )
                if not isinstance(exc, ToolError):
                    logger.warning("django_rag loop tool %s failed: %s", call.name, message)
                step = self.step(call, f"Error: {message}", message)
            step.result = self.capped(step.result)
            step.duration = time.perf_counter() - started
            s.set(
                error=step.error is not None,
                chunk_count=len(step.chunk_ids),
                new_chunk_count=len(step.new_chunk_ids),
            )
        return step

    def repeated(self, call: ToolCall) -> str | None:
        """The note sent instead of running a search the model already ran with the same
        arguments (small models loop on one call); None for a new call. Only ``search`` is
        checked: a custom tool may be meant to run twice."""
        if call.name != "search":
            return None
        key = json.dumps(call.arguments, sort_keys=True, default=str)
        turn = self.searches.get(key)
        if turn is None:
            self.searches[key] = self.result.iterations
            return None
        self.repeats += 1
        return (
            f"Not run: you already searched with these arguments (turn {turn}); its results "
            "are above. Answer with the answer tool, citing the sources as [n], or search for "
            "something different."
        )

    def capped(self, text: str) -> str:
        """``text`` cut at ``max_tool_result_chars``, with a note saying so."""
        limit = self.loop_.max_tool_result_chars
        if len(text) <= limit:
            return text
        return (
            text[:limit] + f"\n[Truncated: the result had {len(text):,} characters; only the first "
            f"{limit:,} are shown.]"
        )

    def dispatch(self, name: str, arguments: dict[str, Any]) -> tuple[str, Any]:
        if name == "search":
            return self.search(**arguments)
        if name == "answer":
            text = arguments["text"].strip()
            if not text:
                raise ToolError("answer needs a non-empty text")
            self.set_answer(text)
            return "Answer recorded.", None
        if name == "give_up":
            reason = arguments["reason"].strip() or "The model gave up without a reason."
            self.result.stop_reason = "give_up"
            self.result.give_up_reason = reason
            self.result.text = reason
            self.done = True
            return "Stopped.", None
        value = self.tools[name].function(**arguments)
        if isinstance(value, list) and value and all(isinstance(v, SearchResult) for v in value):
            return self.register(value)
        if isinstance(value, str):
            return value, None
        problem = value_too_large(value)
        if problem:
            raise ToolError(f"the tool's result cannot be sent: {problem}")
        return json.dumps(value, default=str), None

    def search(
        self, query: str, limit: int | None = None, collection: str | None = None
    ) -> tuple[str, Any]:
        loop = self.loop_
        if not query.strip():
            raise ToolError("search needs a non-empty query")
        if limit is None:
            limit = loop.limit
        if limit < 1:
            raise ToolError(f"limit must be at least 1, got {limit}")
        limit = min(limit, loop.max_limit)
        request = replace(loop.request, query=clean_query(query), limit=limit)
        if collection is not None:
            if loop.scope is not None and collection not in loop.scope:
                # The scope is enforced here, not by the schema: a model may name anything.
                raise ToolError(
                    f"collection {collection!r} is not one you may search; choose from "
                    + ", ".join(loop.scope)
                )
            request = replace(
                request,
                collections=tuple(clean_collection_names(collection) or ()),
                collection_ids=(
                    (loop.collection_ids[collection],) if loop.scope is not None else None
                ),
            )
        found, _ = search_request(request, **loop.components)
        return self.register(found)

    def register(self, found: list[SearchResult]) -> tuple[str, tuple[list, list]]:
        """Number the chunks (a chunk seen before keeps its number), holding at most
        ``max_chunks``: past it a new chunk is dropped, or with ``keep_sources="best"`` it
        sets aside the weakest held source when it scores higher."""
        loop = self.loop_
        numbered, ids, new, dropped, set_aside = [], [], [], 0, []
        for chunk in found:
            number = self.numbers.get(chunk.chunk_id)
            if number is not None:
                numbered.append((number, chunk, True))
                ids.append(chunk.chunk_id)
                continue
            if len(self.held) >= loop.max_chunks:
                weakest = min(self.held, key=lambda n: (_strength(self.chunks[n - 1]), -n))
                if loop.keep_sources != "best" or _strength(chunk) <= _strength(
                    self.chunks[weakest - 1]
                ):
                    dropped += 1
                    continue
                self.held.remove(weakest)
                set_aside.append(weakest)
                self.result.set_aside.append(weakest)
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
                f"Source(s) {listed} set aside for stronger ones (at most {loop.max_chunks} "
                "are kept): do not rely on them."
            )
        if dropped:
            notes.append(
                f"{dropped} more result(s) dropped: the limit of {loop.max_chunks} "
                "sources is reached. Answer from the sources you have."
            )
        return (text + "\n" if text else "") + " ".join(notes), (ids, new)

    def set_answer(self, text: str) -> None:
        self.result.stop_reason = "answer"
        self.result.text = text.strip()
        self.done = True

    # --- the end

    def held_sources(self) -> list[tuple[int, SearchResult]]:
        """``(number, chunk)`` of the sources held, in number order."""
        return [(number, self.chunks[number - 1]) for number in sorted(self.held)]

    def findings(self) -> list[str]:
        """What the tools returned in this conversation, for whoever writes the answer: each
        search (its query and the sources it returned) and each custom tool's result. The
        controller's draft answer is left out: the answer is written from the evidence."""
        lines = []
        for step in self.result.tool_calls:
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

    def synthesise(self, *, rewrite: bool = False) -> None:
        """Write the answer from the sources held and what the tools found: when the turns
        ran out (the ``synthesizer``, else the ``answer_llm`` or the controller), or, with
        ``rewrite``, the ``answer_llm``'s version of the controller's answer (kept when the
        writer fails or writes nothing)."""
        loop = self.loop_
        sources = self.held_sources()
        if loop.synthesizer is not None and not rewrite:
            self.synthesise_with(loop.synthesizer, [chunk for _, chunk in sources])
            return
        llm = loop.answer_llm or loop.llm
        system, user = prompts.loop_answer_messages(loop.question, sources, self.findings())
        try:
            completion = llm.complete(user, system=system, context=[c for _, c in sources])
        except LLMError as exc:
            self.result.error = exc
            logger.warning(
                "django_rag loop could not write its answer: %s: %s",
                type(exc).__name__,
                scrub_text(exc)[:500],
            )
            return
        if rewrite and not completion.text.strip():
            self.result.warnings.append("the answer_llm wrote nothing: the draft answer is kept")
            return
        self.result.text = completion.text.strip()
        self.result.model = completion.model or llm.model_name

    def synthesise_with(self, synthesizer: Any, sources: list[SearchResult]) -> None:
        """The ``synthesizer`` hook's answer; its failure (an exception, or no text) is
        recorded on the result, never raised."""
        try:
            text = synthesizer(self.loop_.question, sources, list(self.result.messages))
            if not isinstance(text, str) or not text.strip():
                raise InvalidOption(
                    f"the synthesizer must return a non-empty string, got {text!r}"[:300]
                )
        except Exception as exc:
            self.result.error = exc
            logger.warning(
                "django_rag loop's synthesizer failed: %s: %s",
                type(exc).__name__,
                scrub_text(exc)[:500],
            )
            return
        self.result.text = text.strip()
        self.result.model = getattr(synthesizer, "__qualname__", type(synthesizer).__name__)

    def finish(self) -> None:
        result = self.result
        if result.stop_reason == "answer" and self.loop_.answer_llm is not None:
            self.synthesise(rewrite=True)
        result.chunks = list(self.chunks)
        if result.stop_reason != "give_up":
            result.citations = parse_citations(result.text, result.chunks)


def _strength(chunk: SearchResult) -> float:
    """How strong a source is for ``keep_sources="best"``: its rerank score when it has one,
    else its score."""
    value = chunk.rerank_score if chunk.rerank_score is not None else chunk.score
    return float(value or 0.0)
