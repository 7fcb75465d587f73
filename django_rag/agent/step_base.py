"""What every agent step shares: the :func:`step` decorator (the deadline, a failure recorded on
the context instead of raised, telemetry, LLM usage) and the registry it fills (:data:`STEPS`:
each step's name, phase, options and the context fields it produces), the fallback note, and
the check that an LLM's query can be searched.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from ..conf import get_setting, scrub_text
from ..exceptions import InvalidInput, InvalidOption
from ..llm import collect_usage, deadline
from ..llm.errors import AgentTimeout
from ..validation import clean_query
from .context import Context

# The name the step runner has always logged under (the steps were one module).
logger = logging.getLogger("django_rag.agent.steps")


#: The phases of a pipeline, in the order they run, with the title the Ask page gives them.
#: A step's ``phase`` is one of these names.
PHASES = {
    "query": "Before the search",
    "search": "The search",
    "results": "After the search",
    "answer": "The answer",
}


@dataclass(frozen=True)
class Output:
    """A context attribute a step sets, with the label its trace shows it under.

    ``show`` turns the value into what the trace displays (a string or a list of strings);
    without it the dashboard displays the value by its type.
    """

    field: str
    label: str
    show: Callable[[Any], Any] | None = None


@dataclass(frozen=True)
class StepSpec:
    """A registered step: its name, phase, the options it takes and what it produces.

    Calling the spec runs the step (``STEPS["rerank"](ctx, threshold=7)``).
    ``always``: a pipeline runs it whatever is ticked (``search``, ``answer``);
    ``pipeline=False``: not one of the pipeline's steps (``global_answer`` answers from the
    graph instead); ``flags``: boolean options the Ask page offers as checkboxes of their own
    (``answer``'s ``self_correct``), name -> label.
    """

    name: str
    run: Callable[..., Context]
    phase: str
    label: str
    outputs: tuple[Output, ...]
    options: tuple[str, ...]
    always: bool = False
    pipeline: bool = True
    flags: tuple[tuple[str, str], ...] = ()

    def __call__(self, ctx: Context, **options: Any) -> Context:
        return self.run(ctx, **options)

    @property
    def doc(self) -> str:
        return inspect.getdoc(self.run) or ""

    @property
    def summary(self) -> str:
        """The first line of the step's docstring."""
        return self.doc.split("\n", 1)[0]


class StepRegistry(dict[str, StepSpec]):
    """Every agent step by name, in registration order (the order a pipeline runs them within
    a phase). Registering or removing one tells the listeners (``Agent`` adds a chain method
    per step)."""

    def __init__(self) -> None:
        super().__init__()
        self._listeners: list[Callable[[StepRegistry], None]] = []

    def listen(self, listener: Callable[[StepRegistry], None]) -> None:
        """Call ``listener(registry)`` now and after every change."""
        self._listeners.append(listener)
        listener(self)

    def add(self, spec: StepSpec) -> None:
        known = self.get(spec.name)
        if known is not None and known.run.__wrapped__ is not spec.run.__wrapped__:
            raise ImproperlyConfigured(
                f"an agent step named {spec.name!r} is already registered "
                f"({known.run.__module__}.{known.run.__qualname__}); choose another name"
            )
        self[spec.name] = spec
        try:
            self._changed()
        except Exception:  # a listener refused it (a name Agent already uses): undo
            if known is None:
                del self[spec.name]
            else:
                self[spec.name] = known
            self._changed()
            raise

    def remove(self, name: str) -> None:
        """Unregister a step (tests that register one remove it after)."""
        self.pop(name, None)
        self._changed()

    def in_order(self) -> list[StepSpec]:
        """The steps in the order a pipeline runs them: by phase, then registration."""
        rank = {phase: i for i, phase in enumerate(PHASES)}
        return sorted(self.values(), key=lambda spec: rank[spec.phase])

    def pipeline(self, chosen: set[str] | frozenset[str]) -> list[StepSpec]:
        """The steps a pipeline runs when the ``chosen`` ones are asked for: those plus the
        ones it always runs (``search``, ``answer``), in order."""
        return [s for s in self.in_order() if s.pipeline and (s.always or s.name in chosen)]

    def _changed(self) -> None:
        for listener in self._listeners:
            listener(self)


#: The one registry of agent steps: the ``Agent``'s chain methods, the Ask page's steps and
#: trace, and the evaluation's agent configurations all read it.
STEPS = StepRegistry()


def step(
    name: str,
    *,
    phase: str,
    label: str | None = None,
    produces: dict[str, str | tuple[str, Callable[[Any], Any]]] | None = None,
    always: bool = False,
    pipeline: bool = True,
    flags: dict[str, str] | None = None,
) -> Callable:
    """Register ``func(ctx, *, options...)`` as the agent step ``name``.

    ``phase`` is one of :data:`PHASES`; ``produces`` maps each context attribute the step
    sets to its trace label (or to ``(label, show)``, ``show`` turning the value into text).
    The step gets its deadline check, failure recording, telemetry usage and an ``Agent``
    chain method of the same name; see CONTRIBUTING.md, "Adding an agent step".
    """
    if not name.isidentifier() or name.startswith("_"):
        raise ImproperlyConfigured(f"an agent step name must be a public identifier, got {name!r}")
    if phase not in PHASES:
        raise ImproperlyConfigured(
            f"the {name} step's phase must be one of {', '.join(PHASES)}, got {phase!r}"
        )
    outputs = tuple(
        Output(field, *(spec if isinstance(spec, tuple) else (spec,)))
        for field, spec in (produces or {}).items()
    )

    def decorator(func: Callable[..., None]) -> Callable[..., Context]:
        signature = inspect.signature(func).parameters.values()
        takes_any = any(p.kind is p.VAR_KEYWORD for p in signature)
        accepted = sorted(p.name for p in signature if p.kind is p.KEYWORD_ONLY)

        @functools.wraps(func)
        def run(ctx: Context, **options: Any) -> Context:
            unknown = [option for option in options if option not in accepted]
            if unknown and not takes_any:
                # A mistake at the call site, not a failure of the run: raised, not recorded.
                close = difflib.get_close_matches(unknown[0], accepted, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise InvalidOption(
                    f"the {name} step got an unknown option {unknown[0]!r}{hint} (its options: "
                    f"{', '.join(accepted) or 'none'})"
                )
            if ctx.error is not None:
                return ctx
            if ctx.deadline_at is not None and time.monotonic() >= ctx.deadline_at:
                ctx.error = AgentTimeout(
                    f"The agent run passed its deadline ({ctx.deadline:g}s) before the {name} "
                    "step, which did not run (nor did the steps after it). Raise "
                    "DJANGO_RAG['AGENT_DEADLINE'] or Agent(deadline=...), or use fewer steps."
                )
                ctx.failed_step = name
                ctx.warnings.append(f"{name}: skipped, the agent's deadline had passed")
                logger.warning("django_rag agent step %s skipped: deadline passed", name)
                return ctx
            # LLM calls inside the step get at most what is left of the run's deadline.
            with collect_usage() as usage, deadline(at=ctx.deadline_at):
                try:
                    func(ctx, **options)
                except Exception as exc:
                    ctx.error = exc
                    ctx.failed_step = name
                    logger.warning(
                        "django_rag agent step %s failed: %s: %s",
                        name,
                        type(exc).__name__,
                        scrub_text(exc)[:500],
                    )
            ctx.usage.add(usage)
            return ctx

        run.step_name = name
        parameters = inspect.signature(func).parameters.values()
        spec = StepSpec(
            name=name,
            run=run,
            phase=phase,
            label=label or name.replace("_", " ").capitalize(),
            outputs=outputs,
            options=tuple(p.name for p in parameters if p.kind is p.KEYWORD_ONLY),
            always=always,
            pipeline=pipeline,
            flags=tuple((flags or {}).items()),
        )
        STEPS.add(spec)
        run.spec = spec
        return run

    return decorator


def fallback(ctx: Context, name: str, exc: Exception, what: str) -> None:
    message = scrub_text(exc)[:500]
    ctx.warnings.append(f"{name}: {message} ({what})")
    logger.info("django_rag agent step %s fell back: %s", name, message)


def step_llm(ctx: Context, llm: Any) -> Any:
    return llm if llm is not None else ctx.llm


def usable_query(ctx: Context, name: str, query: Any, what: str, instead: str) -> str | None:
    """``query`` (an LLM's rewrite, expansion, sub-question or follow-up) when it can be
    searched, else None with a warning: empty, longer than ``MAX_QUERY_CHARS`` or not valid
    text, it is not used (``instead`` says what is)."""
    if not isinstance(query, str) or not query.strip():
        if query:  # an empty answer is the step's own fallback, not a warning
            ctx.warnings.append(f"{name}: the {what} was not text ({instead})")
        return None
    try:
        cleaned = clean_query(query.strip())
    except InvalidInput as exc:
        if len(query) > get_setting("MAX_QUERY_CHARS"):
            reason = (
                f"{len(query):,} characters, more than MAX_QUERY_CHARS "
                f"({get_setting('MAX_QUERY_CHARS'):,})"
            )
        else:
            reason = scrub_text(exc)[:200]
        ctx.warnings.append(f"{name}: the {what} was unusable: {reason} ({instead})")
        logger.info("django_rag agent step %s: unusable %s: %s", name, what, reason)
        return None
    return cleaned or None
