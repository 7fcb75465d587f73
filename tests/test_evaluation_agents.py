"""Evaluating agents: run_evaluation(retriever=...) with search, an agent configuration, the
Loop and a custom function, answers judged instead of regenerated, grounders for faithfulness,
custom judge prompts, errors per case, telemetry per case, rag_eval and the dashboard."""

import json
from io import StringIO

import pytest
from django.core.management import call_command
from django.test import override_settings

import django_rag as rag
from django_rag.evaluation import create_test_case, run_evaluation
from django_rag.exceptions import InvalidOption
from django_rag.models import Chunk, Run
from django_rag.results import SearchResult
from django_rag.testing import ScriptedLLM
from tests.test_evaluation import FACTS

pytestmark = pytest.mark.django_db

QUESTIONS = {
    "leave": "paid annual leave days",
    "saw": "circular saw depth wood",
    "drill": "drill motor watt warranty",
}


@pytest.fixture
def cases(db):
    documents = {
        key: rag.ingest(text, collection="kb", source_id=key) for key, text in FACTS.items()
    }
    for key, question in QUESTIONS.items():
        create_test_case(
            question,
            chunks=Chunk.objects.filter(document=documents[key]),
            collection="kb",
            reference_answer=f"about {key}",
        )
    return {key: Chunk.objects.get(document=doc).pk for key, doc in documents.items()}


# A phrase of the LLM grounding judge's prompt.
JUDGE = "Break the answer into its separate factual claims"


def judge(*verdicts):
    """The judge's reply: (claim quoted from the answer, verdict) pairs, each citing source 1."""
    return json.dumps(
        {"claims": [{"text": t, "verdict": v, "chunk_indices": [1]} for t, v in verdicts]}
    )


def test_search_is_the_default_and_recorded(cases):
    run = run_evaluation(mode="fulltext", collection="kb", limit=3)
    assert run.config["retriever"] == "search" and run.metrics["errors"] == 0
    assert run.metrics["mrr"] == 1.0


def test_an_agent_configuration_runs_its_steps_per_case(cases, events):
    llm = ScriptedLLM(
        rules={
            "Rewrite": "annual leave paid days",
            "You answer the user's question": "The answer [1].",
        },
        default="annual leave paid days",
    )
    run = run_evaluation(
        mode="fulltext",
        collection="kb",
        limit=3,
        llm=llm,
        retriever=["rewrite", ("search", {}), "answer"],
        evaluate_answers=True,
        judge_prompts={
            "faithfulness": lambda q, chunks, answer: f"MY FAITH {answer} {len(chunks)}",
            "correctness": lambda q, answer, reference: f"MY CORRECT {reference}",
        },
    )
    assert run.config["retriever"] == ["rewrite", "search", "answer"]
    assert run.config["custom_judge_prompts"] == ["correctness", "faithfulness"]
    # Every case was searched with the rewritten query: the leave document comes first.
    for record in run.results:
        assert record["retrieved"][0] == cases["leave"]
        assert record["answer"] == "The answer [1]." and record["answer_source"] == "retriever"
    prompts = [c["prompt"] for c in llm.calls]
    assert any(p.startswith("MY FAITH The answer [1].") for p in prompts)
    assert any(p == "MY CORRECT about saw" for p in prompts)
    # The judge answered nonsense: not scored, but the run completed.
    assert run.results[0]["faithfulness"] is None
    assert run.metrics["mrr"] == pytest.approx(1 / 3)
    per_case = [e for e in events if e[1] == "evaluation.case" and e[0] == "stop"]
    assert len(per_case) == 3 and {e[2]["retriever"] for e in per_case} == {"agent"}
    assert {e[2]["test_case_id"] for e in per_case} == {r["test_case_id"] for r in run.results}


def test_the_loop_retriever_and_its_answer_is_judged_by_a_grounder(cases):
    def controller(messages):
        if not any(m["role"] == "tool" for m in messages):
            return ("search", {"query": messages[1]["content"], "limit": 3})
        return ("answer", {"text": "It is in the sources [1]. Also the moon is cheese."})

    llm = ScriptedLLM(
        rules={
            JUDGE: judge(
                ("It is in the sources", "supported"), ("the moon is cheese", "unsupported")
            )
        },
        default=controller,
    )
    run = run_evaluation(
        mode="fulltext",
        collection="kb",
        limit=3,
        llm=llm,
        retriever="loop",
        evaluate_answers=True,
        grounder="llm",
    )
    assert run.config["retriever"] == "loop" and run.config["grounder"] == "LLMGrounder"
    assert run.metrics["mrr"] == 1.0
    record = run.results[0]
    assert record["answer"].startswith("It is in the sources [1].")
    assert record["faithfulness"] == 5.0  # one claim of two supported
    assert record["grounding"]["spans"][1]["verdict"] == "unsupported"
    assert "1 of 2 spans supported" in record["faithfulness_reasoning"]
    assert run.metrics["faithfulness"] == 5.0


def test_a_custom_retriever_function_with_and_without_an_answer(cases):
    calls = []

    def retriever(question, *, collection, limit):
        calls.append((question, collection, limit))
        if "saw" in question:
            raise RuntimeError("my index is down")
        chunk = Chunk.objects.get(pk=cases["drill"])
        return [SearchResult(chunk_id=chunk.pk, text=chunk.text, score=1.0)], "Drill [1]."

    run = run_evaluation(collection="kb", limit=2, retriever=retriever)
    assert run.config["retriever"].endswith("retriever")
    assert calls[0][1:] == (["kb"], 2)
    by_question = {r["question"]: r for r in run.results}
    assert by_question[QUESTIONS["drill"]]["mrr"] == 1.0
    assert by_question[QUESTIONS["leave"]]["mrr"] == 0.0
    assert by_question[QUESTIONS["drill"]]["answer"] == "Drill [1]."
    broken = by_question[QUESTIONS["saw"]]
    assert broken["error"] == "RuntimeError: my index is down" and broken["retrieved"] == []
    assert run.metrics["errors"] == 1 and run.status == "completed"
    with pytest.raises(RuntimeError, match="index is down"):
        run_evaluation(collection="kb", retriever=retriever, fail_fast=True)
    assert Run.objects.filter(status="failed").count() == 1

    # Results only: evaluate_answers writes the answer from the results.
    llm = ScriptedLLM(
        rules={
            "You answer the user's question": "Written [1].",
            "Rate how faithful": '{"score": 6, "reasoning": "ok"}',
            "same facts as the reference": '{"score": 3}',
        }
    )
    judged = run_evaluation(
        collection="kb",
        retriever=lambda question, **kw: {"results": retriever("drill", **kw)[0]},
        evaluate_answers=True,
        llm=llm,
    )
    assert {r["answer"] for r in judged.results} == {"Written [1]."}
    assert judged.metrics["faithfulness"] == 6.0 and judged.metrics["correctness"] == 3.0
    assert "answer_source" not in judged.results[0]


def test_bad_retriever_and_judge_options_are_rejected(cases):
    for retriever, message in [
        ("nonsense", "retriever must be"),
        (["fly"], "unknown agent step 'fly'"),
        (["rewrite", "answer"], "needs a 'search' step"),
        ([42], "a name or a"),
    ]:
        with pytest.raises(InvalidOption, match=message):
            run_evaluation(collection="kb", retriever=retriever, llm=ScriptedLLM())
    with pytest.raises(InvalidOption, match="unknown judge prompt 'style'"):
        run_evaluation(collection="kb", judge_prompts={"style": str})
    with pytest.raises(InvalidOption, match="must be a function"):
        run_evaluation(collection="kb", judge_prompts={"faithfulness": "text"})
    assert Run.objects.count() == 0
    bad_return = run_evaluation(collection="kb", retriever=lambda q, **kw: 42)
    assert "must return a list of SearchResult" in bad_return.results[0]["error"]


def test_rag_eval_run_with_an_agent_and_a_grounder(cases, settings):
    settings.DJANGO_RAG = {
        **settings.DJANGO_RAG,
        "LLM": "tests.test_evaluation_agents.scripted_llm",
    }
    out = StringIO()
    call_command(
        "rag_eval",
        "run",
        "--collection",
        "kb",
        "--mode",
        "fulltext",
        "--retriever",
        "agent",
        "--steps",
        "search,answer",
        "--evaluate-answers",
        "--grounder",
        "llm",
        "--format",
        "json",
        stdout=out,
    )
    data = json.loads(out.getvalue())
    run = Run.objects.get(pk=data["id"])
    assert run.config["retriever"] == ["search", "answer"]
    assert run.config["grounder"] == "LLMGrounder"
    assert run.metrics["faithfulness"] == 10.0
    out = StringIO()
    call_command(
        "rag_eval",
        "run",
        "--collection",
        "kb",
        "--retriever",
        "loop",
        "--format",
        "json",
        stdout=out,
    )
    assert Run.objects.get(pk=json.loads(out.getvalue())["id"]).config["retriever"] == "loop"


def scripted_llm(prompt):
    """The LLM rag_eval uses in the test above (a dotted-path callable)."""
    if JUDGE in prompt:
        return judge(("From the sources", "supported"))
    if "tool_calls" in prompt:  # the Loop's prompted tool protocol
        return '{"tool_calls": [{"name": "give_up", "arguments": {"reason": "nothing"}}]}'
    return "From the sources [1]."


# --- the dashboard ------------------------------------------------------------------------------


def test_dashboard_runs_an_agent_evaluation_and_shows_each_case(staff, cases):
    from tests.helpers import url
    from tests.test_dashboard import SCOPED, llm_settings

    page = staff.get(url("evaluation")).content.decode()
    for needle in (
        'name="retriever"',
        '<option value="loop">',
        'name="steps"',
        'name="evaluate_answers"',
        '<option value="cross-encoder">',
    ):
        assert needle in page
    llm = ScriptedLLM(
        rules={
            JUDGE: judge(("From the kb", "supported"), ("The moon is cheese", "contradicted")),
            "You answer the user's question": "From the kb [1]. The moon is cheese.",
            "same facts as the reference": '{"score": 5, "reasoning": "half"}',
        }
    )
    with llm_settings(llm):
        staff.post(
            url("evaluation"),
            {
                "action": "run",
                "mode": "fulltext",
                "collection": "kb",
                "retriever": "agent",
                "steps": "search, answer",
                "evaluate_answers": "1",
                "grounder": "llm",
            },
            follow=True,
        )
    run = Run.objects.get()
    assert run.status == "completed", run.error
    assert run.config["retriever"] == ["search", "answer"]
    assert run.config["grounder"] == "LLMGrounder" and run.config["evaluate_answers"]
    body = staff.get(url("evaluation_run", run.pk)).content.decode()
    assert "agent: search, answer" in body and '<th class="num">Faithfulness</th>' in body
    assert '<mark class="grounding-supported" title="supported: chunks' in body
    assert '<mark class="grounding-contradicted"' in body and "The moon is cheese</mark>" in body
    assert "(the retriever's)" in body and "1 of 2 spans supported" in body

    # Bad steps are refused with a message; no run starts.
    with llm_settings(llm):
        page = staff.post(
            url("evaluation"),
            {"action": "run", "collection": "kb", "retriever": "agent", "steps": "fly"},
            follow=True,
        ).content.decode()
    assert "unknown agent step" in page and Run.objects.count() == 1
    page = staff.post(
        url("evaluation"), {"action": "run", "collection": "kb", "retriever": "hack"}, follow=True
    ).content.decode()
    assert "Unknown retriever" in page and Run.objects.count() == 1

    # A retriever error shows on the run page.
    Run.objects.filter(pk=run.pk).update(
        results=[{**run.results[0], "error": "RuntimeError: index down", "retrieved": []}]
    )
    body = staff.get(url("evaluation_run", run.pk)).content.decode()
    assert "Retriever error: RuntimeError: index down" in body and 'id="case-errors"' in body
    # A scoped user cannot evaluate a collection outside their scope.
    with override_settings(DJANGO_RAG=SCOPED):
        staff.post(url("evaluation"), {"action": "run", "collection": "kb", "retriever": "loop"})
    assert Run.objects.count() == 1
