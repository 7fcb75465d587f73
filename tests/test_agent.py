"""The agentic pipeline: every step, its fallbacks, custom components, errors and telemetry."""

import pytest

import django_rag as rag
from django_rag.agent import Agent, Context, Retrieval, steps
from django_rag.agent.components import Rewriter
from django_rag.exceptions import LLMError, LLMNotConfigured, UnknownCollection
from django_rag.retrieval.results import SearchResult
from django_rag.testing import ScriptedLLM
from tests.helpers import (
    AGENT_DOCS,
    ANSWER,
    CORRECT,
    DECOMPOSE,
    EXPAND,
    GATE,
    JUDGE,
    REQUERY,
    RERANK,
    REWRITE,
    SELECT,
    SUFFICIENT,
    ingest_agent_corpus,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def corpus():
    ingest_agent_corpus()


def variants(payload: str):
    """The ways an LLM writes JSON (all parseable), and the ways it fails."""
    return {
        "valid": payload,
        "fenced": f"```json\n{payload}\n```",
        "prose": f"Here is my assessment: {payload} Let me know if you need more.",
    }


FAILURES = {"garbage": "I think so, maybe.", "exception": LLMError("boom"), "empty": ""}


# --- gate ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("form", ["valid", "fenced", "prose"])
def test_gate_skips_retrieval_for_general_questions(form, corpus):
    payload = '{"needs_retrieval": false, "reasoning": "Arithmetic."}'
    llm = ScriptedLLM(rules={GATE: variants(payload)[form], ANSWER: "4", "helpful assistant": "4"})
    agent = Agent("What is 2 + 2?", llm=llm).gate().search().answer()
    ctx = agent.context
    assert ctx.skip_retrieval is True and ctx.gate_reasoning == "Arithmetic."
    assert ctx.results == [] and ctx.context_used == []
    assert ctx.answer == "4"
    assert "general knowledge" in llm.calls[-1]["system"]  # the no-context prompt


@pytest.mark.parametrize("failure", FAILURES)
def test_gate_failures_default_to_retrieval(failure, corpus):
    llm = ScriptedLLM(rules={GATE: FAILURES[failure]})
    ctx = steps.gate(Context("What is the X100's motor power?", llm=llm))
    assert ctx.skip_retrieval is False and ctx.error is None
    assert ctx.warnings and ctx.warnings[0].startswith("gate:")


def test_gate_true_keeps_retrieval(corpus):
    llm = ScriptedLLM('{"needs_retrieval": "true", "reasoning": "Product data."}')
    ctx = steps.gate(Context("X100 weight?", llm=llm))
    assert ctx.skip_retrieval is False and ctx.gate_reasoning == "Product data."


# --- rewrite / expand / decompose ------------------------------------------------------------------


def test_rewrite_expand_and_the_query_used_by_search(corpus):
    llm = ScriptedLLM(
        rules={REWRITE: "X100 drill weight\n", EXPAND: "X100 drill weight mass kilograms"}
    )
    ctx = steps.rewrite(
        Context("Hi there! Could you tell me what the X100 weighs? Thanks", llm=llm)
    )
    assert ctx.rewritten_query == "X100 drill weight" and ctx.query == "X100 drill weight"
    steps.expand(ctx)
    assert ctx.expanded_query == "X100 drill weight mass kilograms"
    assert "X100 drill weight" in llm.calls[-1]["prompt"]  # expand saw the rewritten query
    steps.search(ctx)
    assert ctx.queries_tried == ["X100 drill weight mass kilograms"]
    assert ctx.chunks[0].source_id == "x100"


@pytest.mark.parametrize("failure", FAILURES)
def test_rewrite_and_expand_fall_back_to_the_question(failure, corpus):
    llm = ScriptedLLM(rules={REWRITE: FAILURES[failure], EXPAND: FAILURES[failure]})
    ctx = steps.expand(steps.rewrite(Context("X100 weight", llm=llm)))
    if failure == "garbage":  # any text is a valid rewrite
        assert ctx.rewritten_query == "I think so, maybe."
    else:
        assert ctx.rewritten_query is None and ctx.expanded_query is None
        assert ctx.query == "X100 weight" and len(ctx.warnings) == 2
    assert ctx.error is None


@pytest.mark.parametrize("form", ["valid", "fenced", "prose"])
def test_decompose_splits_and_search_runs_each_sub_question(form, corpus):
    payload = '{"sub_questions": ["X100 motor power", "X200 motor power", "X100 motor power"]}'
    llm = ScriptedLLM(rules={DECOMPOSE: variants(payload)[form]})
    ctx = steps.search(steps.decompose(Context("Compare the X100 and X200 motors", llm=llm)))
    assert ctx.sub_questions == ["X100 motor power", "X200 motor power"]
    assert [r.question for r in ctx.results][:1] == ["X100 motor power"]
    assert ctx.queries_tried == ["X100 motor power", "X200 motor power"]
    assert {"x100", "x200"} <= {c.source_id for c in ctx.chunks}
    ids = [c.chunk_id for c in ctx.chunks]
    assert len(ids) == len(set(ids))  # a chunk found by both sub-questions appears once


@pytest.mark.parametrize("failure", [*FAILURES, "other_key", "empty_list"])
def test_decompose_falls_back_to_the_query(failure, corpus):
    response = {
        **FAILURES,
        "other_key": '{"questions": ["only this"]}',
        "empty_list": '{"sub_questions": []}',
    }[failure]
    ctx = steps.decompose(Context("X100 weight", llm=ScriptedLLM(response)))
    expected = ["only this"] if failure == "other_key" else ["X100 weight"]
    assert ctx.sub_questions == expected and ctx.error is None


# --- select and search scope -------------------------------------------------------------------


@pytest.mark.parametrize("form", ["valid", "fenced", "prose"])
def test_select_offers_descriptions_and_validates_names(form, corpus):
    payload = '{"collections": ["products", "secret"], "reasoning": "Tools."}'
    llm = ScriptedLLM(rules={SELECT: variants(payload)[form]})
    ctx = steps.select(Context("X200 warranty?", llm=llm))
    assert ctx.collections == ["products"] and ctx.selection_reasoning == "Tools."
    assert "- products: Manuals of our power tools" in llm.calls[0]["prompt"]
    assert "- hr: Human resources policies" in llm.calls[0]["prompt"]
    assert any("secret" in warning for warning in ctx.warnings)
    steps.search(ctx)
    assert {r.collection for r in ctx.results} == {"products"}
    assert {c.collection for c in ctx.chunks} == {"products"}


@pytest.mark.parametrize("failure", [*FAILURES, "none_valid"])
def test_select_falls_back_to_every_offered_collection(failure, corpus):
    response = {**FAILURES, "none_valid": '{"collections": ["nope"]}'}[failure]
    ctx = steps.select(Context("q", llm=ScriptedLLM(response)), collections=["hr", "products"])
    assert ctx.collections == ["hr", "products"] and ctx.error is None


def test_custom_selector_receives_the_user_context(corpus):
    seen = {}

    def only_allowed(question, collections, context):
        seen["offered"] = collections
        return [name for name, _ in collections if name in context["allowed"]], "policy"

    ctx = steps.select(Context("leave days"), selector=only_allowed, context={"allowed": {"hr"}})
    assert ctx.collections == ["hr"] and ctx.selection_reasoning == "policy"
    assert ("hr", "Human resources policies") in seen["offered"]


def test_search_scope_priority(corpus):
    ctx = Context("drill motor", collections=["hr"])
    steps.search(ctx, collection="products")  # explicit beats selected
    assert ctx.search_scope == ["products"]
    ctx = steps.search(Context("drill motor", collections=["hr"]))  # selected beats default
    assert ctx.search_scope == ["hr"]
    ctx = steps.search(Context("drill motor"))  # default: every collection
    assert ctx.search_scope == [None] and ctx.chunks
    ctx = steps.search(Context("drill"), collections=["products", "hr"], mode="fulltext")
    assert [r.collection for r in ctx.results] == ["products"]  # hr has no drill
    assert ctx.search_options == {"mode": "fulltext"}


def test_search_with_an_unknown_collection_fails_the_step_and_later_steps_pass(corpus):
    llm = ScriptedLLM()
    agent = Agent("drill", llm=llm).search(collection="missing").rerank().answer()
    ctx = agent.context
    assert isinstance(ctx.error, UnknownCollection) and ctx.failed_step == "search"
    assert ctx.answer is None and llm.calls == []  # rerank and answer did not run


def test_search_self_correct_requeries_until_sufficient(corpus):
    llm = ScriptedLLM(
        '{"sufficient": false, "missing": "the saw depth"}',
        "circular saw cutting depth",
        '{"sufficient": true}',
    )
    ctx = steps.search(
        Context("How deep does it cut?", llm=llm, limit=1), self_correct=True, mode="fulltext"
    )
    assert ctx.queries_tried == ["How deep does it cut?", "circular saw cutting depth"]
    assert ctx.search_iterations == 1
    assert "saw" in {c.source_id for c in ctx.chunks}
    assert "the saw depth" in llm.calls[1]["prompt"]


def test_search_self_correct_stops_at_max_iterations_and_on_repeats(corpus):
    insufficient = '{"sufficient": false, "missing": "more"}'
    llm = ScriptedLLM(rules={SUFFICIENT: insufficient, REQUERY: lambda p: f"q{len(p)}"})
    ctx = steps.search(Context("drill", llm=llm), self_correct=True, max_iterations=2)
    assert ctx.search_iterations == 2 and len(ctx.queries_tried) == 3
    repeat = ScriptedLLM(rules={SUFFICIENT: insufficient, REQUERY: "drill"})
    ctx = steps.search(Context("drill", llm=repeat), self_correct=True)
    assert ctx.search_iterations == 0


# --- reason ---------------------------------------------------------------------------------------


def test_reason_follows_up_in_the_same_scope_without_repeating(corpus):
    llm = ScriptedLLM(
        '{"sufficient": false, "missing": "warranty", "follow_up_query": "X200 warranty"}',
        '```json\n{"sufficient": false, "follow_up_query": "X200 warranty"}\n```',
    )
    calls = []

    def searcher(query, collection, **options):
        calls.append((query, collection, options["limit"]))
        return rag.search(query, collection=collection, **options)

    ctx = Context("Which drill has the longer warranty?", llm=llm, limit=2)
    steps.search(ctx, searcher=searcher, collection="products")
    steps.reason(ctx, max_iterations=3)
    assert ctx.reason_iterations == 1  # the second follow-up repeats the first: stop
    assert calls == [
        ("Which drill has the longer warranty?", "products", 2),
        ("X200 warranty", "products", 2),  # the first search's searcher and scope
    ]
    assert ctx.queries_tried == ["Which drill has the longer warranty?", "X200 warranty"]


@pytest.mark.parametrize("response", ['{"sufficient": true}', *FAILURES.values()])
def test_reason_stops_when_sufficient_or_unparseable(response, corpus):
    ctx = steps.search(Context("drill motor", llm=ScriptedLLM(response)))
    before = len(ctx.chunks)
    steps.reason(ctx)
    assert ctx.reason_iterations == 0 and len(ctx.chunks) == before and ctx.error is None


# --- rerank ----------------------------------------------------------------------------------------


def test_rerank_with_the_llm_keeps_scores_at_or_above_the_threshold(corpus):
    def scores(prompt):
        # Score passages by whether they mention X200.
        import re

        ids = re.findall(r'<passage id="(\d+)">\n([^<]*)', prompt)
        return "{" + ", ".join(f'"{i}": {9 if "X200" in t else 2}' for i, t in ids) + "}"

    llm = ScriptedLLM(rules={RERANK: scores})
    ctx = steps.search(Context("drill motor watt", llm=llm, limit=3), collection="products")
    steps.rerank(ctx)
    assert [c.source_id for c in ctx.chunks] == ["x200"]
    assert list(ctx.rerank_scores.values()) == [9.0]
    assert ctx.results[0].collection == "reranked"
    # What the threshold dropped is recorded with its score (the Ask page shows it).
    assert ctx.rerank_dropped and all(c.rerank_score == 2.0 for c in ctx.rerank_dropped)
    assert all(c.source_id != "x200" for c in ctx.rerank_dropped)


@pytest.mark.parametrize("failure", FAILURES)
def test_rerank_failures_keep_the_chunks(failure, corpus):
    ctx = steps.search(Context("drill", llm=ScriptedLLM(FAILURES[failure]), limit=3))
    before = [c.chunk_id for c in ctx.chunks]
    steps.rerank(ctx)
    assert [c.chunk_id for c in ctx.chunks] == before and ctx.rerank_scores == {}


def test_rerank_with_a_scoring_function_and_top_k(corpus):
    ctx = steps.search(Context("drill", limit=3), collection="products")
    steps.rerank(ctx, reranker=lambda q, results: [len(r.text) for r in results], top_k=1)
    longest = max(AGENT_DOCS["products"].values(), key=len)
    assert [c.text for c in ctx.chunks] == [longest]
    # top_k drops the others, scores kept, best first.
    assert len(ctx.rerank_dropped) == 2
    dropped = [c.rerank_score for c in ctx.rerank_dropped]
    assert dropped == sorted(dropped, reverse=True) and max(dropped) <= len(longest)


def test_rerank_records_what_a_components_own_top_k_and_threshold_drop(corpus):
    from django_rag.rerankers import CallableReranker

    ctx = steps.search(Context("drill", limit=3), collection="products")
    reranker = CallableReranker(
        lambda q, results: [None if "saw" in r.text else len(r.text) for r in results],
        top_k=1,
        threshold=60,
    )
    steps.rerank(ctx, reranker=reranker)
    kept = ctx.chunks
    assert len(kept) == 1 and kept[0].rerank_score >= 60
    # The others are recorded, scored or not, and the reranker's own rerank() agrees.
    fresh = steps.search(Context("drill", limit=3), collection="products").chunks
    assert len(fresh) == 3
    assert {c.chunk_id for c in kept + ctx.rerank_dropped} == {c.chunk_id for c in fresh}
    assert [c.chunk_id for c in reranker.rerank("drill", fresh)] == [kept[0].chunk_id]
    assert [c.rerank_score is None for c in ctx.rerank_dropped] == [False, True]  # the saw


# --- answer ----------------------------------------------------------------------------------------


def test_answer_uses_deduplicated_context_and_cites(corpus):
    llm = ScriptedLLM(rules={ANSWER: "The X200 has a 1200 watt motor [1]."})
    ctx = Context("X200 motor power?", llm=llm)
    chunk = rag.search("X200 motor", collection="products", limit=1)[0]
    ctx.results = [Retrieval("a", "products", [chunk]), Retrieval("b", "products", [chunk])]
    steps.answer(ctx)
    assert ctx.context_used == [chunk] and llm.calls[0]["prompt"].count("<source id=") == 1
    assert ctx.citations[0].chunk_id == chunk.chunk_id
    assert ctx.to_answer().citations[0].source_id == "x200"


@pytest.mark.parametrize("failure", ["exception", "empty"])
def test_answer_failures_are_step_errors(failure, corpus):
    ctx = steps.search(Context("drill", llm=ScriptedLLM(FAILURES[failure])))
    steps.answer(ctx)
    assert ctx.failed_step == "answer" and isinstance(ctx.error, LLMError)
    assert ctx.answer is None


def test_answer_self_correct_rewrites_until_grounded(corpus):
    llm = ScriptedLLM(
        "The X200 weighs 5 kg [1].",
        '{"grounded": false, "feedback": "The weight is not in the sources."}',
        "The X200 has a 1200 watt motor and a two year warranty [1].",
        '```json\n{"grounded": true}\n```',
    )
    ctx = steps.search(Context("Tell me about the X200", llm=llm, limit=1), collection="products")
    steps.answer(ctx, self_correct=True)
    assert ctx.answer.startswith("The X200 has a 1200 watt motor")
    assert ctx.correction_count == 1
    assert ctx.corrections == [
        {"answer": "The X200 weighs 5 kg [1].", "feedback": "The weight is not in the sources."}
    ]
    assert CORRECT in llm.calls[2]["prompt"] and "weighs 5 kg" in llm.calls[2]["prompt"]


@pytest.mark.parametrize("failure", ["garbage", "exception", "empty"])
def test_answer_self_correct_accepts_when_the_judge_fails(failure, corpus):
    llm = ScriptedLLM("X200: 1200 W [1].", FAILURES[failure])
    ctx = steps.search(Context("X200", llm=llm, limit=1), collection="products")
    steps.answer(ctx, self_correct=True)
    assert ctx.answer == "X200: 1200 W [1]." and ctx.correction_count == 0 and ctx.error is None


def test_answer_self_correct_bounded_and_correction_errors(corpus):
    never = '{"grounded": false}'
    llm = ScriptedLLM(rules={JUDGE: never, CORRECT: "fixed [1].", ANSWER: "first [1]."})
    ctx = steps.search(Context("X200", llm=llm, limit=1), collection="products")
    steps.answer(ctx, self_correct=True, max_corrections=2)
    assert ctx.correction_count == 2 and ctx.corrections[0]["feedback"]  # generic feedback
    broken = ScriptedLLM(rules={JUDGE: never, CORRECT: LLMError("down"), ANSWER: "first [1]."})
    ctx = steps.search(Context("X200", llm=broken, limit=1), collection="products")
    steps.answer(ctx, self_correct=True)
    assert ctx.failed_step == "answer" and ctx.answer == "first [1]."


# --- custom components, functional form, usage, telemetry ------------------------------------------


def test_every_step_takes_a_custom_function(corpus):
    ctx = Context("Hello, what about drills?")
    steps.gate(ctx, gatekeeper=lambda q: (True, "always"))
    steps.rewrite(ctx, rewriter=lambda q: "drills")
    steps.select(ctx, selector=lambda q, cols, context: ["products"])
    steps.expand(ctx, expander=lambda q: q + " drill")
    steps.decompose(ctx, decomposer=lambda q: [q, "saw"])
    steps.search(ctx, searcher=lambda q, c, **o: rag.search(q, collection=c, mode="fulltext"))
    steps.reason(ctx, prompt=lambda q, chunks: "unused", llm=ScriptedLLM('{"sufficient": true}'))
    steps.rerank(ctx, reranker=lambda q, results: [1.0] * len(results))
    steps.answer(ctx, answerer=lambda q, chunks: f"{len(chunks)} chunks")
    assert ctx.error is None, ctx.error
    assert ctx.gate_reasoning == "always" and ctx.query == "drills drill"
    assert ctx.sub_questions == ["drills drill", "saw"]
    assert {c.source_id for c in ctx.chunks} == {"x100", "x200", "saw"}
    assert ctx.answer == "3 chunks"


def test_custom_component_classes_and_prompts(corpus):
    class Shouty(Rewriter):
        def __call__(self, question):
            return self.complete(self.prompt(question)).upper()

    llm = ScriptedLLM("drill weight")
    ctx = steps.rewrite(
        Context("how heavy is the drill", llm=llm), rewriter=Shouty, prompt=lambda q: f"REW {q}"
    )
    assert ctx.rewritten_query == "DRILL WEIGHT"
    assert llm.calls[0]["prompt"] == "REW how heavy is the drill"
    step_llm = ScriptedLLM('{"needs_retrieval": false}')
    ctx = steps.gate(Context("2+2", llm=ScriptedLLM()), llm=step_llm)  # per-step llm wins
    assert ctx.skip_retrieval and len(step_llm.calls) == 1


def test_a_failing_custom_component_records_the_error(corpus):
    def broken(question):
        raise KeyError("bug in my rewriter")

    agent = Agent("drill", llm=ScriptedLLM()).rewrite(rewriter=broken).search()
    assert agent.failed_step == "rewrite" and isinstance(agent.error, KeyError)
    assert agent.context.results == []


def test_no_llm_anywhere_is_a_step_error(corpus):
    ctx = steps.rewrite(Context("drill"))
    assert isinstance(ctx.error, LLMNotConfigured)


def test_full_pipeline_fluent_and_functional_agree(corpus):
    def script():
        return ScriptedLLM(
            rules={
                GATE: '{"needs_retrieval": true}',
                REWRITE: "X200 drill warranty",
                SELECT: '{"collections": ["products"]}',
                EXPAND: "X200 drill warranty guarantee",
                DECOMPOSE: '{"sub_questions": ["X200 warranty"]}',
                SUFFICIENT: '{"sufficient": true}',
                RERANK: '{"1": 9, "2": 8, "3": 1}',
                JUDGE: '{"grounded": true}',
                ANSWER: "Two years [1].",
            },
            cost_per_call=0.01,
        )

    agent = (
        Agent("Hi! What warranty does the X200 have?", llm=script(), limit=3)
        .gate()
        .rewrite()
        .select()
        .expand()
        .decompose()
        .search()
        .reason()
        .rerank()
        .answer(self_correct=True)
    )
    ctx = agent.context
    assert ctx.error is None and ctx.answer == "Two years [1]."
    assert ctx.collections == ["products"] and ctx.sub_questions == ["X200 warranty"]
    assert ctx.citations[0].chunk.source_id == "x200"
    assert ctx.usage.calls == 9 and ctx.usage.cost == pytest.approx(0.09)
    assert agent.result.text == "Two years [1]." and agent.usage is ctx.usage

    functional = Context("Hi! What warranty does the X200 have?", llm=script(), limit=3)
    for name in ["gate", "rewrite", "select", "expand", "decompose", "search", "reason", "rerank"]:
        steps.STEPS[name](functional)
    steps.answer(functional, self_correct=True)
    assert functional.answer == ctx.answer
    assert [c.chunk_id for c in functional.context_used] == [c.chunk_id for c in ctx.context_used]


def test_step_telemetry_names_components_and_reports_outcomes(corpus, events):
    # The table of every event and its metadata is in test_telemetry.py.
    llm = ScriptedLLM(
        rules={GATE: '{"needs_retrieval": true}', JUDGE: '{"grounded": true}', ANSWER: "ok [1]"}
    )
    Agent("drill?", llm=llm).gate().search().answer(self_correct=True)
    gate_stop = next(m for k, n, m in events if (k, n) == ("stop", "agent.gate"))
    assert gate_stop["gatekeeper"] == "Gatekeeper" and gate_stop["skip_retrieval"] is False
    assert "question" not in gate_stop  # raw text stays out by default
    answer_stop = next(m for k, n, m in events if (k, n) == ("stop", "agent.answer"))
    assert answer_stop["success"] is True and answer_stop["correction_count"] == 0


def test_a_step_error_emits_an_exception_event(corpus, events):
    steps.search(Context("drill"), collection="missing")
    failed = [(n, m) for k, n, m in events if k == "exception"]
    assert failed[-1][0] == "agent.search"
    assert isinstance(failed[-1][1]["exception"], UnknownCollection)


def test_custom_functions_are_named_in_telemetry(corpus, events):
    steps.gate(Context("x"), gatekeeper=lambda q: True)
    stop = next(m for k, n, m in events if (k, n) == ("stop", "agent.gate"))
    assert stop["gatekeeper"] == "custom_function"


def test_context_validation():
    from django_rag.exceptions import InvalidInput

    with pytest.raises(InvalidInput):
        Agent("   ")
    result = SearchResult(chunk_id=1, text="t", score=1.0)
    ctx = Context("q", results=[Retrieval("q", None, [result, result])])
    assert ctx.chunks == [result] and ctx.to_answer() is None


def test_full_pipeline_through_litellm_over_http(corpus, stub_llm_server):
    from tests.conftest import stub_llm
    from tests.stub_openai import Failure

    stub_llm_server.rules = {
        GATE: '```json\n{"needs_retrieval": true, "reasoning": "product question"}\n```',
        REWRITE: "X200 warranty",
        DECOMPOSE: '{"sub_questions": ["X200 warranty"]}',
        SUFFICIENT: '{"sufficient": true}',
        RERANK: '{"1": 10, "2": 3, "3": 2}',
        JUDGE: '{"grounded": true}',
        "</sources>\n\nQuestion:": "The X200 comes with a two year warranty [1].",
    }
    stub_llm_server.chat = [Failure(429, retry_after=0)]  # the first call is rate limited
    llm = stub_llm(stub_llm_server)
    ctx = (
        Agent("Hello! What warranty does the X200 have?", llm=llm, limit=3)
        .gate()
        .rewrite()
        .decompose()
        .search(collection="products")
        .reason()
        .rerank()
        .answer(self_correct=True)
        .context
    )
    assert ctx.error is None, ctx.error
    assert ctx.gate_reasoning == "product question" and ctx.rewritten_query == "X200 warranty"
    assert ctx.answer == "The X200 comes with a two year warranty [1]."
    assert ctx.citations[0].chunk.source_id == "x200"
    assert ctx.usage.calls == 7 and ctx.usage.cost > 0
    assert len(stub_llm_server.chat_requests) == 8  # seven calls, one of them retried
