"""The running half of a :class:`~django_rag.agent.loop.Loop` (:class:`LoopRun`, which the
Loop mixes in): the controller's turns, the tool calls, the sources and the final answer, with
the state of the run on the Loop itself."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import replace
from typing import Any

from ..answers.grounding import ground_answer
from ..answers.service import parse_citations
from ..conf import scrub_text
from ..exceptions import AgentTimeout, InvalidOption, LLMAuthenticationError, LLMError, LLMTimeout
from ..llm import LLM, ToolCall, ToolCompletion, collect_usage, deadline, tool_message
from ..llm.parsing import value_too_large
from ..results import SearchResult
from ..retrieval.request import SearchRequest
from ..retrieval.service import search_request
from ..signals import span
from ..validation import clean_collection_names, clean_query
from . import prompts
from .loop_sources import Sources, attribute_searches
from .loop_tools import (
    LoopResult,
    Tool,
    ToolError,
    ToolStep,
    builtin_schemas,
    cap_result,
    check_arguments,
)

logger = logging.getLogger("django_rag.agent.loop")

#: Searches repeated with the same arguments after which a run stops and writes its answer
#: from what it found (``stop_reason="repeated_calls"``).
MAX_REPEATED_SEARCHES = 2
#: The ``tool_choice`` of the turn after a text answer was sent back: call ``search``.
SEARCH_CALL = {"type": "function", "function": {"name": "search"}}


class LoopRun:
    """The running half of :class:`~django_rag.agent.loop.Loop`, which mixes it in: :meth:`run`
    and the state of one run (the conversation, the sources, the tool calls so far), reset
    when a run starts. The options it reads are the Loop's, checked by ``Loop.__init__``.

    A Loop holds the state of its run, so one Loop runs one conversation at a time (make a
    Loop per concurrent run); running it again starts afresh.
    """

    # The options (set and checked by Loop.__init__).
    question: str
    history: list[dict[str, str]]
    scope: list[str] | None
    descriptions: dict[str, str]
    collection_ids: dict[str, int]
    request: SearchRequest
    components: dict[str, Any]
    llm: LLM
    answer_llm: LLM | None
    tools: list[Tool]
    system_prompt: Any
    synthesizer: Any
    fallback_synthesis: bool
    keep_sources: str
    temperatures: dict[str, float | None]
    max_iterations: int
    limit: int
    max_limit: int
    max_chunks: int
    max_tool_calls: int
    max_tool_result_chars: int
    deadline: float | None
    grounder: Any
    result: LoopResult | None

    def run(self) -> LoopResult:
        """Run the loop; returns (and keeps in ``self.result``) a :class:`LoopResult`."""
        self._start()
        with span(
            "agent.loop",
            question=self.question,
            model=self.llm.model_name,
            max_iterations=self.max_iterations,
            collections=self.scope,
            tools=[tool.name for tool in self.tools],
        ) as s:
            with collect_usage() as usage, deadline(at=self._deadline_at):
                self._turns()
                self._finish()
                # Nothing found, nothing to ground against (Arcana skips it too).
                if self.grounder is not None and self._result.text and self._sources.held:
                    ground_answer(self._result, self.grounder)
                    attribute_searches(self._result)
            result = self._result
            result.usage = usage
            s.set(
                iterations=result.iterations,
                stop_reason=result.stop_reason,
                tool_call_count=len(result.tool_calls),
                chunk_count=len(result.chunks),
                citation_count=len(result.citations),
                error=None if result.error is None else type(result.error).__name__,
                answer=result.text,
                prompt_tokens=usage.prompt_tokens,
                completion_tokens=usage.completion_tokens,
                cost=usage.cost,
                grounding_score=None if result.grounding is None else result.grounding.score,
            )
        self.result = result
        return result

    # --- the run's state

    def _start(self) -> None:
        """The state of a new run: the schemas and the conversation so far."""
        system = self._system_message()
        self._deadline_at = (
            None if self.deadline is None else time.monotonic() + float(self.deadline)
        )
        self._sources = Sources(self.max_chunks, self.keep_sources)
        self._tools_by_name = {tool.name: tool for tool in self.tools}
        self._schemas = builtin_schemas(self.scope, self.limit, self.max_limit) + [
            tool.schema() for tool in self.tools
        ]
        self._parameters = {
            s["function"]["name"]: s["function"]["parameters"] for s in self._schemas
        }
        # The collection scope is enforced by search() itself (a name outside it is replaced
        # by an allowed one, with a note), not by the schema's enum, which a model may
        # ignore; a ``collection`` argument is accepted even where the schema has none.
        search_parameters = json.loads(json.dumps(self._parameters["search"]))
        search_parameters["properties"]["collection"] = {"type": "string"}
        self._parameters["search"] = search_parameters
        self._result = LoopResult(
            question=self.question,
            text="",
            collections=None if self.scope is None else list(self.scope),
            model=self.llm.model_name,
        )
        self._result.messages = [
            {"role": "system", "content": system},
            *self.history,
            {"role": "user", "content": self.question},
        ]
        self._done = False
        self._sent_back = False  # a text answer before any search was sent back once
        self._force_search = False  # the turn after that asks for a search call
        self._searches: dict[str, int] = {}  # each search's arguments -> the turn it ran
        self._repeats = 0

    def _system_message(self) -> str:
        if self.system_prompt is not None:
            text = self.system_prompt(self) if callable(self.system_prompt) else self.system_prompt
            if not isinstance(text, str) or not text.strip():
                raise InvalidOption(
                    "the system_prompt function must return a non-empty string, got "
                    f"{type(text).__name__}"
                )
            return text
        described = None
        if self.scope is not None:
            described = [(name, self.descriptions.get(name, "")) for name in self.scope]
        return prompts.loop_system(
            described, self.max_iterations, [tool.name for tool in self.tools]
        )

    # --- the controller's turns

    def _turns(self) -> None:
        result = self._result
        while not self._done:
            if result.iterations >= self.max_iterations:
                result.stop_reason = "max_iterations"
                self._fallback()
                return
            if self._deadline_passed():
                return
            result.iterations += 1
            try:
                reply = self._controller_turn()
            except LLMError as exc:
                self._fail(exc)
                return
            except Exception as exc:  # a custom backend's bug is a provider failure too
                self._fail(
                    LLMError(
                        f"The controller LLM {self.llm.model_name!r} raised "
                        f"{type(exc).__name__}: {scrub_text(exc)[:500]}",
                        model=self.llm.model_name,
                    )
                )
                return
            calls = list(reply.tool_calls)
            dropped = len(calls) - self.max_tool_calls
            if dropped > 0:
                # Only the calls that are run stay in the conversation (each needs a result).
                calls = calls[: self.max_tool_calls]
                reply.tool_calls = calls
                result.warnings.append(
                    f"the model asked for {len(calls) + dropped} tool calls in one reply; "
                    f"the {dropped} after the first {self.max_tool_calls} were not run"
                )
            result.messages.append(reply.message())
            if not calls:
                if reply.text.strip():
                    if self._answers_unread(reply.text):
                        continue
                    # A model that answers in plain text has answered.
                    result.warnings.append("the model answered in text, not with the answer tool")
                    self._set_answer(reply.text)
                    return
                result.messages.append(
                    {"role": "user", "content": "Call one of the tools: search, answer or give_up."}
                )
                continue
            timed_out = False
            for index, call in enumerate(calls):
                if not self._done and not timed_out and self._deadline_passed():
                    timed_out = True
                if timed_out:
                    step = self._step(call, "Not run: the loop's deadline had passed.")
                elif self._done:
                    step = self._step(call, "Not run: the conversation had already ended.")
                else:
                    step = self._call(call)
                if dropped > 0 and index == len(calls) - 1:
                    step.result += (
                        f"\n(Your reply asked for {len(calls) + dropped} tool calls; only the "
                        f"first {self.max_tool_calls} were run. Ask for at most "
                        f"{self.max_tool_calls} at a time.)"
                    )
                result.tool_calls.append(step)
                result.messages.append(tool_message(call.id, step.result))
            if timed_out:
                return
            cut_short = result.iterations < self.max_iterations
            if self._repeats >= MAX_REPEATED_SEARCHES and not self._done and cut_short:
                result.stop_reason = "repeated_calls"
                result.warnings.append(
                    f"the model repeated a search it had run {self._repeats} times; the answer "
                    "was written from the sources found"
                )
                self._fallback()
                return

    def _controller_turn(self) -> ToolCompletion:
        """One controller call. The turn after a text answer was sent back asks for a
        ``search`` call (``tool_choice``); a provider (or a custom backend) that fails on that
        option is asked again without it."""
        options = self._temperature("controller")
        if not self._force_search:
            return self.llm.chat(self._result.messages, tools=self._schemas, **options)
        self._force_search = False
        try:
            return self.llm.chat(
                self._result.messages, tools=self._schemas, tool_choice=SEARCH_CALL, **options
            )
        except (LLMTimeout, LLMAuthenticationError):
            raise
        except Exception as exc:
            logger.info(
                "django_rag loop: the forced search call failed (%s: %s); asking without it",
                type(exc).__name__,
                scrub_text(exc)[:300],
            )
            return self.llm.chat(self._result.messages, tools=self._schemas, **options)

    def _temperature(self, role: str) -> dict[str, float]:
        """The ``temperature`` option of one role's LLM calls (``controller``, ``answer`` or
        ``fallback``): the role's own, else the loop's ``temperature``, else none is sent."""
        value = self.temperatures.get(role)
        if value is None:
            value = self.temperatures.get("all")
        return {} if value is None else {"temperature": value}

    def _answers_unread(self, text: str) -> bool:
        """Whether a text answer came before any search, with turns left: it is sent back
        once, asking for a search (small models answer from memory on their first turn; a
        model that answers in text again has answered)."""
        result = self._result
        if (
            self._sent_back
            or result.iterations >= self.max_iterations
            or any(step.name == "search" for step in result.tool_calls)
        ):
            return False
        self._sent_back = True
        self._force_search = True
        result.warnings.append("the model answered before searching; it was asked to search")
        result.messages.append(
            {
                "role": "user",
                "content": "Do not answer from memory: call search first, then answer with "
                "the answer tool, citing the sources as [n].",
            }
        )
        return True

    def _deadline_passed(self) -> bool:
        """True (and the run stopped on its deadline) once the deadline has passed."""
        if self._deadline_at is None or time.monotonic() < self._deadline_at:
            return False
        result = self._result
        result.stop_reason = "deadline"
        result.error = AgentTimeout(
            f"The loop passed its deadline ({self.deadline:g}s) after "
            f"{result.iterations} turn(s) and {len(result.tool_calls)} tool call(s). Raise "
            "DJANGO_RAG['AGENT_DEADLINE'] or Loop(deadline=...), or lower max_iterations."
        )
        return True

    def _fail(self, exc: Exception) -> None:
        passed = self._deadline_at is not None and time.monotonic() >= self._deadline_at
        # A call cut short by the loop's own deadline is the deadline, not a provider failure.
        self._result.stop_reason = "deadline" if isinstance(exc, LLMTimeout) and passed else "error"
        self._result.error = exc
        logger.warning(
            "django_rag loop stopped on an LLM error: %s: %s",
            type(exc).__name__,
            scrub_text(exc)[:500],
        )

    def _step(self, call: ToolCall, result: str, error: str | None = None, **extra) -> ToolStep:
        return ToolStep(
            self._result.iterations, call.id, call.name, call.arguments, result, error, **extra
        )

    def _call(self, call: ToolCall) -> ToolStep:
        started = time.perf_counter()
        arguments = call.arguments
        with span(
            "agent.loop.tool",
            tool=call.name,
            call_id=call.id,
            iteration=self._result.iterations,
            query=arguments.get("query") if call.name == "search" else None,
            collection=arguments.get("collection") if call.name == "search" else None,
        ) as s:
            try:
                if call.error:
                    raise ToolError(f"{call.error}; send the arguments as a JSON object")
                if call.name not in self._parameters:
                    raise ToolError(
                        f"there is no tool {call.name!r}; the tools are "
                        + ", ".join(self._parameters)
                    )
                problem = check_arguments(arguments, self._parameters[call.name])
                if problem:
                    raise ToolError(f"bad arguments for {call.name}: {problem}")
                repeated = self._repeated(call)
                if repeated:
                    step = self._step(call, repeated)
                else:
                    text, found = self._dispatch(call.name, arguments)
                    step = self._step(call, text)
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
                step = self._step(call, f"Error: {message}", message)
            step.result = cap_result(step.result, self.max_tool_result_chars)
            step.duration = time.perf_counter() - started
            s.set(
                error=step.error is not None,
                chunk_count=len(step.chunk_ids),
                new_chunk_count=len(step.new_chunk_ids),
            )
        return step

    def _repeated(self, call: ToolCall) -> str | None:
        """The note sent instead of running a search the model already ran with the same
        arguments (small models loop on one call); None for a new call. Only ``search`` is
        checked: a custom tool may be meant to run twice."""
        if call.name != "search":
            return None
        key = json.dumps(call.arguments, sort_keys=True, default=str)
        turn = self._searches.get(key)
        if turn is None:
            self._searches[key] = self._result.iterations
            return None
        self._repeats += 1
        return (
            f"Not run: you already searched with these arguments (turn {turn}); its results "
            "are above. Answer with the answer tool, citing the sources as [n], or search for "
            "something different."
        )

    def _dispatch(self, name: str, arguments: dict[str, Any]) -> tuple[str, Any]:
        if name == "search":
            return self._search(**arguments)
        if name == "answer":
            text = arguments["text"].strip()
            if not text:
                raise ToolError("answer needs a non-empty text")
            self._set_answer(text)
            return "Answer recorded.", None
        if name == "give_up":
            reason = arguments["reason"].strip() or "The model gave up without a reason."
            self._result.stop_reason = "give_up"
            self._result.give_up_reason = reason
            self._result.text = reason
            self._done = True
            return "Stopped.", None
        value = self._tools_by_name[name].function(**arguments)
        if isinstance(value, list) and value and all(isinstance(v, SearchResult) for v in value):
            return self._sources.add(value)
        if isinstance(value, str):
            return value, None
        problem = value_too_large(value)
        if problem:
            raise ToolError(f"the tool's result cannot be sent: {problem}")
        return json.dumps(value, default=str), None

    def _search(
        self, query: str, limit: int | None = None, collection: str | None = None
    ) -> tuple[str, Any]:
        if not query.strip():
            raise ToolError("search needs a non-empty query")
        if limit is None:
            limit = self.limit
        if limit < 1:
            raise ToolError(f"limit must be at least 1, got {limit}")
        limit = min(limit, self.max_limit)
        request = replace(self.request, query=clean_query(query), limit=limit)
        note = ""
        if collection is not None and self.scope is not None:
            # The scope is enforced here, not by the schema: a model may name anything. A
            # name outside it is replaced (never searched), and the model is told so.
            if len(self.scope) == 1:
                if collection != self.scope[0]:
                    note = f"Searched {self.scope[0]!r}, the only collection you may search."
                collection = None  # the request's scope is that collection already
            elif collection not in self.scope:
                note = (
                    f"{collection[:100]!r} is not a collection you may search: searched "
                    f"{self.scope[0]!r} instead (you may search "
                    + ", ".join(repr(name) for name in self.scope)
                    + ")."
                )
                collection = self.scope[0]
            if note:
                self._result.warnings.append(f"search: {note}")
        if collection is not None:
            request = replace(
                request,
                collections=tuple(clean_collection_names(collection) or ()),
                collection_ids=(
                    (self.collection_ids[collection],) if self.scope is not None else None
                ),
            )
        found, _ = search_request(request, **self.components)
        text, ids = self._sources.add(found)
        return (f"{note}\n{text}" if note else text), ids

    def _set_answer(self, text: str) -> None:
        self._result.stop_reason = "answer"
        self._result.text = text.strip()
        self._done = True

    # --- the end

    def _fallback(self) -> None:
        """The answer written when the turns run out (or the model repeats itself): from the
        sources held, and only when there are some (nothing found, nothing to write from);
        a synthesis that ran leaves a ``synthesis`` step in ``tool_calls``."""
        if not self.fallback_synthesis:
            return
        held = self._sources.held_sources()
        if not held:
            self._result.warnings.append("nothing was found: no answer was written")
            return
        error_before = self._result.error
        self._synthesise()
        failed = self._result.error is not error_before
        step = ToolStep(
            self._result.iterations,
            "synthesis",
            "synthesis",
            {},
            (
                f"Synthesis failed: {scrub_text(self._result.error)[:500]}"
                if failed
                else f"Synthesized from {len(held)} source(s)."
            ),
            scrub_text(self._result.error)[:1000] if failed else None,
            chunk_ids=[chunk.chunk_id for _, chunk in held],
        )
        self._result.tool_calls.append(step)

    def _synthesise(self, *, rewrite: bool = False) -> None:
        """Write the answer from the sources held and what the tools found: when the turns
        ran out (the ``synthesizer``, else the ``answer_llm`` or the controller), or, with
        ``rewrite``, the ``answer_llm``'s version of the controller's answer (kept when the
        writer fails or writes nothing)."""
        sources = self._sources.held_sources()
        if self.synthesizer is not None and not rewrite:
            self._synthesise_with(self.synthesizer, [chunk for _, chunk in sources])
            return
        llm = self.answer_llm or self.llm
        system, user = prompts.loop_answer_messages(
            self.question,
            sources,
            self._sources.transcript(
                self._result.messages, self._result.tool_calls, len(self.history)
            ),
        )
        try:
            completion = llm.complete(
                user,
                system=system,
                context=[c for _, c in sources],
                **self._temperature("answer" if rewrite else "fallback"),
            )
        except LLMError as exc:
            self._result.error = exc
            logger.warning(
                "django_rag loop could not write its answer: %s: %s",
                type(exc).__name__,
                scrub_text(exc)[:500],
            )
            return
        if rewrite and not completion.text.strip():
            self._result.warnings.append("the answer_llm wrote nothing: the draft answer is kept")
            return
        self._result.text = completion.text.strip()
        self._result.model = completion.model or llm.model_name

    def _synthesise_with(self, synthesizer: Any, sources: list[SearchResult]) -> None:
        """The ``synthesizer`` hook's answer; its failure (an exception, or no text) is
        recorded on the result, never raised."""
        try:
            text = synthesizer(self.question, sources, list(self._result.messages))
            if not isinstance(text, str) or not text.strip():
                raise InvalidOption(
                    f"the synthesizer must return a non-empty string, got {text!r}"[:300]
                )
        except Exception as exc:
            self._result.error = exc
            logger.warning(
                "django_rag loop's synthesizer failed: %s: %s",
                type(exc).__name__,
                scrub_text(exc)[:500],
            )
            return
        self._result.text = text.strip()
        self._result.model = getattr(synthesizer, "__qualname__", type(synthesizer).__name__)

    def _finish(self) -> None:
        result = self._result
        if result.stop_reason == "answer" and self.answer_llm is not None:
            self._synthesise(rewrite=True)
        result.chunks = list(self._sources.chunks)
        result.set_aside = list(self._sources.set_aside)
        if result.stop_reason != "give_up":
            result.citations = parse_citations(result.text, result.chunks)
