"""The Loop's Arcana semantics (issue 37 item 3): the collection argument, keep_sources="best"
by default, nothing found, the answer model's view of the conversation, grounding spans that
name their search, per-role temperatures and function controllers that get the options.
Real PostgreSQL chunks; only the LLMs are scripted."""

import pytest

import django_rag as rag
from django_rag.agent.loop import Loop
from django_rag.exceptions import InvalidOption
from django_rag.llm import CallableLLM
from django_rag.results import GroundedSpan
from django_rag.testing import ScriptedLLM

REFUNDS = "Refunds are paid within 14 days of the return reaching our warehouse."
SHIPPING = "Shipping is free for orders over 50 euros; other orders pay a flat 4 euro fee."
SALARY = "The refunds team lead earns 90000 euros a year."
SECRET = "The board meets in secret on refunds every Friday; the code word is heron."


@pytest.fixture
def corpus(db):
    rag.ingest(REFUNDS, collection="policies", source_id="refunds", title="Refund policy")
    rag.ingest(SHIPPING, collection="policies", source_id="shipping", title="Shipping")
    rag.ingest(SALARY, collection="hr", source_id="salaries", title="Salaries")
    rag.ingest(SECRET, collection="board", source_id="board", title="Board")


def recording_controller(script, seen):
    """A function controller ``(messages, tools, options)`` that records what it is given."""
    replies = list(script)

    def chat(messages, tools, options):
        seen.append({"tools": tools, "options": options, "messages": messages})
        return replies.pop(0)

    return CallableLLM(lambda prompt: "unused", chat=chat)


# --- 1. the collection argument -----------------------------------------------------------------


def test_one_collection_search_has_no_collection_argument(corpus):
    seen = []
    llm = recording_controller(
        [[("search", {"query": "refunds warehouse"})], [("answer", {"text": "14 days [1]."})]],
        seen,
    )
    result = Loop("refunds?", collection="policies", llm=llm, mode="fulltext").run()
    search = next(t for t in seen[0]["tools"] if t["function"]["name"] == "search")
    assert set(search["function"]["parameters"]["properties"]) == {"query", "limit"}
    assert result.stop_reason == "answer" and result.citations[0].chunk.source_id == "refunds"
    # Several collections: the model chooses among them.
    seen.clear()
    llm = recording_controller([[("give_up", {"reason": "no"})]], seen)
    Loop("refunds?", collection=["policies", "hr"], llm=llm).run()
    search = next(t for t in seen[0]["tools"] if t["function"]["name"] == "search")
    assert search["function"]["parameters"]["properties"]["collection"]["enum"] == [
        "policies",
        "hr",
    ]


def test_one_collection_a_named_collection_is_ignored_with_a_note(corpus):
    llm = ScriptedLLM(
        ("search", {"query": "refunds code word", "collection": "board"}),
        ("answer", {"text": "14 days [1]."}),
    )
    result = Loop("refunds?", collection="policies", llm=llm, mode="fulltext").run()
    step = result.tool_calls[0]
    assert step.error is None and step.chunk_ids
    assert step.result.startswith("Searched 'policies', the only collection you may search.")
    assert {c.collection for c in result.chunks} == {"policies"}
    assert "heron" not in str(result.messages)
    assert any("only collection you may search" in w for w in result.warnings)


def test_a_collection_outside_several_is_replaced_by_the_first_allowed(corpus):
    llm = ScriptedLLM(
        ("search", {"query": "refunds lead code word", "collection": "board" + "x" * 500}),
        ("answer", {"text": "The lead earns 90000 euros [1]."}),
    )
    result = Loop(
        "What does the refunds lead earn?", collection=["hr", "policies"], llm=llm, mode="fulltext"
    ).run()
    step = result.tool_calls[0]
    assert step.error is None, step.error
    assert [c.source_id for c in result.chunks] == ["salaries"]  # "hr", the first allowed
    assert "is not a collection you may search: searched 'hr' instead" in step.result
    assert "x" * 101 not in step.result  # the model's name is bounded in the note
    assert "heron" not in str(result.messages)
    assert result.warnings and "searched 'hr' instead" in result.warnings[0]
    # A name that is not a string is still refused by the argument check.
    bad = ScriptedLLM(
        ("search", {"query": "refunds", "collection": ["board"]}), ("give_up", {"reason": "x"})
    )
    refused = Loop("refunds?", collection=["hr", "policies"], llm=bad).run()
    assert refused.tool_calls[0].error and refused.chunks == []


# --- 2. keep_sources ----------------------------------------------------------------------------

WEAK_THEN_STRONG = (
    ("search", {"query": "fee", "limit": 1}),  # one term: a weak score (shipping)
    ("search", {"query": "refunds paid days warehouse", "limit": 1}),  # a strong one
)


def test_keep_sources_best_is_the_default_and_writes_from_the_strongest_first(corpus):
    writer = ScriptedLLM("Refunds take 14 days [2].")
    loop = Loop(
        "refunds?",
        llm=ScriptedLLM(*WEAK_THEN_STRONG),
        answer_llm=writer,
        max_iterations=2,
        mode="fulltext",
    )
    assert loop.keep_sources == "best"
    result = loop.run()
    assert result.chunks[1].score > result.chunks[0].score
    prompt = writer.calls[0]["prompt"]
    # Numbers kept (citations resolve), order by score: [2] (strong) before [1] (weak).
    assert prompt.index('<source id="2"') < prompt.index('<source id="1"')
    assert result.citations[0].chunk.source_id == "refunds"


def test_keep_sources_first_keeps_the_first_found_in_number_order(corpus):
    writer = ScriptedLLM("Shipping costs 4 euros [1].")
    result = Loop(
        "refunds?",
        llm=ScriptedLLM(*WEAK_THEN_STRONG),
        answer_llm=writer,
        max_iterations=2,
        mode="fulltext",
        keep_sources="first",
    ).run()
    prompt = writer.calls[0]["prompt"]
    assert prompt.index('<source id="1"') < prompt.index('<source id="2"')
    # At the cap, "first" drops the stronger newcomer; "best" sets the weak one aside.
    capped = dict(
        max_iterations=2, max_chunks=1, mode="fulltext", answer_llm=ScriptedLLM(default="x")
    )
    first = Loop("refunds?", llm=ScriptedLLM(*WEAK_THEN_STRONG), keep_sources="first", **capped)
    best = Loop("refunds?", llm=ScriptedLLM(*WEAK_THEN_STRONG), **capped)
    assert [c.source_id for c in first.run().chunks] == ["shipping"]
    assert best.run().set_aside == [1] and result.set_aside == []


# --- 3. nothing found ---------------------------------------------------------------------------


def test_nothing_found_skips_the_synthesis_and_the_grounder(corpus):
    grounded = []

    def grounder(text, chunks):
        grounded.append(text)
        return []

    # No default reply: a synthesis call would fail the test.
    llm = ScriptedLLM(("search", {"query": "zzyzx"}), ("search", {"query": "qwxv"}))
    result = Loop("warranty?", llm=llm, max_iterations=2, mode="fulltext", ground=grounder).run()
    assert result.stop_reason == "max_iterations" and result.text == "" and result.chunks == []
    assert len(llm.calls) == 2
    assert "nothing was found: no answer was written" in result.warnings
    assert [step.name for step in result.tool_calls] == ["search", "search"]
    # An answer written with nothing found is not grounded either.
    llm = ScriptedLLM(("search", {"query": "zzyzx"}), ("answer", {"text": "No warranty."}))
    result = Loop("warranty?", llm=llm, mode="fulltext", ground=grounder).run()
    assert result.text == "No warranty." and result.grounding is None and grounded == []


def test_a_synthesis_leaves_a_step_in_the_trace(corpus):
    llm = ScriptedLLM(
        ("search", {"query": "refunds warehouse", "limit": 1}), "Refunds take 14 days [1]."
    )
    result = Loop("refunds?", llm=llm, max_iterations=1, mode="fulltext").run()
    assert result.text == "Refunds take 14 days [1]."
    step = result.tool_calls[-1]
    assert step.name == "synthesis" and step.error is None and step.iteration == 1
    assert step.result == "Synthesized from 1 source(s)."
    assert step.chunk_ids == [result.chunks[0].chunk_id]
    assert result.to_dict()["tool_calls"][-1]["name"] == "synthesis"
    # A failed synthesis is in the trace too.
    failing = ScriptedLLM(
        ("search", {"query": "refunds warehouse"}), rules={"Question:": RuntimeError("down")}
    )
    failed = Loop("refunds?", llm=failing, max_iterations=1, mode="fulltext").run()
    assert failed.tool_calls[-1].name == "synthesis" and "down" in failed.tool_calls[-1].error


# --- 4. the answer model sees the conversation --------------------------------------------------


def test_the_answer_model_sees_the_whole_conversation_bounded(corpus):
    def lookup(code: str) -> str:
        """Look a code up."""
        return "L" * 50_000

    controller = ScriptedLLM(
        "From memory: 30 days.",  # sent back once with a nudge to search
        ToolTurn("I will search the refund policy first.", ("search", {"query": "refunds"})),
        ("lookup", {"code": "A1"}),
        ("answer", {"text": "Refunds take 14 days [1]."}),
    )
    writer = ScriptedLLM("Refunds are paid within 14 days [1].")
    result = Loop(
        "refunds?",
        llm=controller,
        answer_llm=writer,
        tools=[lookup],
        history=[{"role": "user", "content": "I returned a kettle."}],
        mode="fulltext",
    ).run()
    prompt = writer.calls[0]["prompt"]
    order = [
        "user: I returned a kettle.",
        "assistant: I will search the refund policy first.",
        'search "refunds": [1]',
        'lookup({"code": "A1"}) returned: LLL',
        "draft answer: Refunds take 14 days [1].",
    ]
    positions = [prompt.index(part) for part in order]
    assert positions == sorted(positions)
    # The loop's own nudge to the controller and the question (asked apart) are left out.
    assert "Do not answer from memory" not in prompt and "user: refunds?" not in prompt
    assert "assistant: From memory: 30 days." in prompt
    assert "L" * 10_001 not in prompt and "[cut: 50,000 characters]" in prompt
    assert result.text == "Refunds are paid within 14 days [1]."


def ToolTurn(text, *calls):  # noqa: N802 - reads as a reply
    """A controller reply with text and tool calls."""
    from django_rag.llm import ToolCall, ToolCompletion

    return ToolCompletion(
        text,
        tool_calls=[ToolCall.parse(f"t{i}", name, args) for i, (name, args) in enumerate(calls)],
        finish_reason="tool_calls",
    )


# --- 5. grounding spans name their search -------------------------------------------------------


def test_grounding_span_sources_name_the_search_that_found_them(corpus):
    def grounder(text, chunks):
        return [GroundedSpan(0, len(text), text, "supported")]

    llm = ScriptedLLM(
        ("search", {"query": "shipping fee", "limit": 1}),
        ("search", {"query": "refunds warehouse days", "limit": 1}),
        ("answer", {"text": "Refunds are paid within 14 days of the return [2]."}),
    )
    result = Loop("refunds?", llm=llm, mode="fulltext", ground=grounder).run()
    assert [c.source_id for c in result.chunks] == ["shipping", "refunds"]
    sources = result.grounding.spans[0].sources
    refunds = next(s for s in sources if s["chunk_id"] == result.chunks[1].chunk_id)
    assert refunds["search_iteration"] == 2
    assert refunds["search_query"] == "refunds warehouse days"
    assert result.to_dict()["grounding"]["spans"][0]["sources"][0]["search_query"]


# --- 6. per-role temperatures -------------------------------------------------------------------


def test_per_role_temperatures_reach_their_calls(corpus):
    controller = ScriptedLLM(("search", {"query": "refunds"}), ("answer", {"text": "14 days [1]."}))
    writer = ScriptedLLM("Refunds take 14 days [1].")
    Loop(
        "refunds?",
        llm=controller,
        answer_llm=writer,
        temperature=0.7,
        controller_temperature=0.0,
        mode="fulltext",
    ).run()
    assert [call["options"] for call in controller.calls] == [{"temperature": 0.0}] * 2
    assert writer.calls[0]["options"] == {"temperature": 0.7}  # the general one
    fallback = ScriptedLLM(("search", {"query": "refunds"}), "Refunds take 14 days [1].")
    Loop(
        "refunds?",
        llm=fallback,
        max_iterations=1,
        answer_temperature=1.5,
        fallback_temperature=0.2,
        mode="fulltext",
    ).run()
    assert fallback.calls[0]["options"] == {} and fallback.calls[1]["options"] == {
        "temperature": 0.2
    }
    for bad in (-0.1, 2.5, "hot", True):
        with pytest.raises(InvalidOption, match="answer_temperature must be a number"):
            Loop("q", llm=controller, answer_temperature=bad)


# --- 7. function controllers receive the options ------------------------------------------------


def test_a_function_controller_receives_the_options_by_arity(corpus):
    seen = []
    llm = recording_controller(
        [[("search", {"query": "refunds"})], [("answer", {"text": "14 days [1]."})]], seen
    )
    result = Loop("refunds?", llm=llm, controller_temperature=0.3, mode="fulltext").run()
    assert result.stop_reason == "answer"
    assert [call["options"] for call in seen] == [{"temperature": 0.3}] * 2
    # A two-argument controller is called as before.
    replies = [[("give_up", {"reason": "not covered"})]]
    two = CallableLLM(lambda p: "", chat=lambda messages, tools: replies.pop(0))
    assert Loop("refunds?", llm=two, temperature=0.3).run().stop_reason == "give_up"
