"""The steps after retrieval: ``answer`` (with optional self-correction), ``ground`` (which parts
of the answer the sources support) and ``global_answer`` (from the graph's communities).
"""

from __future__ import annotations

from typing import Any

from ..answers.grounding import get_grounder, ground_text
from ..answers.service import make_answer, parse_citations
from ..exceptions import LLMError, LLMResponseError
from ..graph.global_search import global_answer as answer_globally
from ..llm import Completion, get_llm, json_flag
from ..results import SearchResult
from ..signals import span
from . import prompts
from .components import Answerer, build, component_name
from .context import Context
from .step_base import fallback, step, step_llm


def _corrections(corrections: list[dict[str, str]]) -> list[str]:
    return [f"{c['feedback']} (replaced: {c['answer']})" for c in corrections]


@step(
    "answer",
    phase="answer",
    always=True,
    flags={"self_correct": "Self-correct"},
    produces={"corrections": ("Corrections", _corrections)},
)
def answer(
    ctx: Context,
    *,
    answerer: Any = None,
    prompt: Any = None,
    llm: Any = None,
    self_correct: bool = False,
    max_corrections: int = 2,
    judge_prompt: Any = None,
) -> None:
    """Write the answer from the retrieved chunks (none when retrieval was skipped).

    ``self_correct=True`` has the LLM check the answer against the chunks and rewrite it from
    the feedback, up to ``max_corrections`` times (``corrections`` keeps the history).
    """
    chunks = [] if ctx.skip_retrieval else ctx.chunks
    component = build(answerer, Answerer, llm=step_llm(ctx, llm), prompt=prompt)
    with span("agent.answer", question=ctx.question, answerer=component_name(component)) as s:
        if isinstance(component, Answerer):
            result = component(ctx.question, chunks, skip_retrieval=ctx.skip_retrieval)
        else:
            result = component(ctx.question, chunks)
        completion = result if isinstance(result, Completion) else Completion(str(result or ""))
        final = make_answer(ctx.question, completion, chunks)
        ctx.answer = final.text
        ctx.context_used = chunks
        ctx.correction_count = 0
        ctx.corrections = []
        if self_correct and chunks:
            _self_correct(ctx, chunks, max_corrections, judge_prompt, step_llm(ctx, llm))
        ctx.citations = parse_citations(ctx.answer, chunks)
        s.set(
            context_chunk_count=len(chunks),
            correction_count=ctx.correction_count,
            success=ctx.error is None,
        )


def _self_correct(ctx, chunks: list[SearchResult], max_corrections, judge_prompt, llm) -> None:
    model = get_llm(llm, feature="Answer self-correction")
    for attempt in range(1, max_corrections + 1):
        with span("agent.self_correct", attempt=attempt) as s:
            try:
                verdict = model.complete_json(
                    (judge_prompt or prompts.groundedness_prompt)(ctx.question, chunks, ctx.answer),
                    context=chunks,
                )
                grounded = json_flag(verdict, "grounded")
            except LLMError as exc:
                fallback(ctx, "answer", exc, "keeping the answer")
                s.set(result="eval_failed")
                return
            if grounded:
                s.set(result="accepted")
                return
            feedback = str(verdict.get("feedback") or "").strip() or (
                "Make sure every statement is supported by the sources and cited."
            )
            system, user = prompts.correction_messages(ctx.question, chunks, ctx.answer, feedback)
            try:
                corrected = model.complete(user, system=system, context=chunks).text.strip()
                if not corrected:
                    raise LLMResponseError("The LLM returned an empty corrected answer.")
            except LLMError as exc:
                ctx.error = exc
                ctx.failed_step = "answer"
                s.set(result="error")
                return
            ctx.corrections.append({"answer": ctx.answer, "feedback": feedback})
            ctx.answer = corrected
            ctx.correction_count += 1
            s.set(result="corrected")


def _grounding(grounding: Any) -> str:
    return f"score {grounding.score:.2f} ({grounding.grounder})"


@step("ground", phase="answer", produces={"grounding": ("Grounding", _grounding)})
def ground(ctx: Context, *, grounder: Any = True, llm: Any = None) -> None:
    """Check the answer against the chunks it was written from; sets ``grounding``.

    ``grounder`` is ``True`` (the ``GROUNDER`` setting), an alias (``"llm"``,
    ``"cross-encoder"``...), a spec, a function or a :class:`~.grounding.Grounder`. A failing
    grounder leaves ``grounding`` None and a warning, never a failed run.
    """
    if ctx.answer is None:
        ctx.warnings.append("ground: no answer to ground (run the answer step first)")
        return
    component = get_grounder(grounder, llm=step_llm(ctx, llm))
    failures: list[str] = []
    ctx.grounding = ground_text(
        ctx.answer, ctx.context_used, component, question=ctx.question, warnings=failures
    )
    ctx.warnings.extend(f"ground: {w}" for w in failures)


@step("global_answer", phase="answer", pipeline=False, label="Global answer")
def global_answer(
    ctx: Context, *, collection: Any = None, levels: Any = None, llm: Any = None
) -> None:
    """Answer a corpus-wide question from community summaries (GraphRAG's global mode)."""

    with span("agent.global_answer", question=ctx.question) as s:
        result = answer_globally(
            ctx.question,
            llm=step_llm(ctx, llm),
            collection=collection or ctx.collections or ctx.scope,
            levels=levels,
        )
        ctx.answer = result.text
        ctx.context_used = []
        ctx.citations = []
        s.set(success=True)
