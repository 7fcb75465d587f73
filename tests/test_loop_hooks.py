"""The Loop's hooks (issue 25, Arcana parity): system_prompt, synthesizer,
fallback_synthesis, an answer_llm that sees what the tools found, keep_sources="best", and
Arcana's defaults (10 turns, 30 sources)."""

import pytest

import django_rag as rag
from django_rag.agent.loop import KEEP_SOURCES, Loop, LoopResult, Tool, ToolError, ToolStep
from django_rag.exceptions import InvalidOption
from django_rag.testing import ScriptedLLM

REFUNDS = "Refunds are paid within 14 days of the return reaching our warehouse."
SHIPPING = "Shipping is free for orders over 50 euros; other orders pay a flat 4 euro fee."
RETURNS = "Returns are accepted within 30 days; refunds follow the refund policy."


@pytest.fixture
def corpus(db):
    rag.ingest(REFUNDS, collection="policies", source_id="refunds", title="Refund policy")
    rag.ingest(SHIPPING, collection="policies", source_id="shipping", title="Shipping")
    rag.ingest(RETURNS, collection="policies", source_id="returns", title="Returns")


def test_public_names_still_import_from_the_loop_module():
    assert {Loop, LoopResult, Tool, ToolError, ToolStep}
    assert KEEP_SOURCES == ("first", "best")


def test_arcana_defaults_ten_turns_and_thirty_sources(corpus):
    # Ten different searches: a repeated one would stop the run early (repeated_calls).
    searches = [("search", {"query": f"refunds {turn}"}) for turn in range(10)]
    loop = Loop("refunds?", llm=ScriptedLLM(*searches, default="Refunds take 14 days [1]."))
    assert loop.max_iterations == 10 and loop.max_chunks == 30
    result = loop.run()
    assert result.stop_reason == "max_iterations" and result.iterations == 10


def test_system_prompt_replaces_the_built_in_one(corpus):
    llm = ScriptedLLM(("answer", {"text": "Hi."}))
    Loop("refunds?", llm=llm, system_prompt="You are the refunds desk.").run()
    assert llm.calls[0]["messages"][0] == {"role": "system", "content": "You are the refunds desk."}

    seen = []

    def prompt(loop):
        seen.append(loop)
        return f"Answer within {loop.max_iterations} turns about {loop.question}"

    llm = ScriptedLLM(("answer", {"text": "Hi."}))
    loop = Loop("refunds?", llm=llm, system_prompt=prompt, max_iterations=3)
    loop.run()
    assert seen == [loop]
    assert llm.calls[0]["messages"][0]["content"] == "Answer within 3 turns about refunds?"
    with pytest.raises(InvalidOption, match="system_prompt must be a non-empty string"):
        Loop("q", llm=llm, system_prompt="  ")
    with pytest.raises(InvalidOption, match="must return a non-empty string"):
        Loop("q", llm=ScriptedLLM("x"), system_prompt=lambda loop: None).run()


def test_a_synthesizer_writes_the_answer_when_the_turns_run_out(corpus):
    received = []

    def synthesizer(question, sources, messages):
        received.append((question, sources, messages))
        return f"{len(sources)} source(s) say 14 days [1]."

    controller = ScriptedLLM(default=("search", {"query": "warehouse", "limit": 1}))
    result = Loop(
        "refunds?", llm=controller, synthesizer=synthesizer, max_iterations=2, mode="fulltext"
    ).run()
    assert result.stop_reason == "max_iterations" and result.text == "1 source(s) say 14 days [1]."
    question, sources, messages = received[0]
    assert question == "refunds?" and [s.source_id for s in sources] == ["refunds"]
    assert messages[0]["role"] == "system" and messages[1]["content"] == "refunds?"
    assert len(controller.calls) == 2  # the controller wrote nothing more
    assert result.citations[0].chunk.source_id == "refunds"

    def broken(question, sources, messages):
        raise RuntimeError("synthesizer down")

    failed = Loop(
        "refunds?",
        llm=ScriptedLLM(default=("search", {"query": "refunds"})),
        synthesizer=broken,
        max_iterations=1,
    ).run()
    assert failed.stop_reason == "max_iterations" and failed.text == ""
    assert "synthesizer down" in str(failed.error)
    empty = Loop(
        "refunds?",
        llm=ScriptedLLM(default=("search", {"query": "refunds"})),
        synthesizer=lambda q, s, m: "  ",
        max_iterations=1,
    ).run()
    assert isinstance(empty.error, InvalidOption) and empty.text == ""
    with pytest.raises(InvalidOption, match="synthesizer must be a function"):
        Loop("q", llm=controller, synthesizer="write it")


def test_fallback_synthesis_off_leaves_no_answer(corpus):
    controller = ScriptedLLM(default=("search", {"query": "refunds"}))
    result = Loop("refunds?", llm=controller, max_iterations=2, fallback_synthesis=False).run()
    assert result.stop_reason == "max_iterations" and result.text == "" and result.citations == []
    assert len(controller.calls) == 2 and result.chunks


def test_the_answer_llm_sees_the_whole_conversation(corpus):
    def order_status(order_id: int) -> str:
        """An order's delivery status."""
        return f"Order {order_id}: returned to the warehouse on 3 May."

    controller = ScriptedLLM(
        [("search", {"query": "warehouse", "limit": 1}), ("order_status", {"order_id": 12})],
        ("answer", {"text": "draft answer [1]"}),
    )
    writer = ScriptedLLM("Your refund arrives within 14 days of 3 May [1].")
    result = Loop(
        "When is my refund for order 12?",
        llm=controller,
        answer_llm=writer,
        tools=[order_status],
        mode="fulltext",
    ).run()
    prompt = writer.calls[0]["prompt"]
    assert '<source id="1" title="Refund policy">' in prompt
    assert "Order 12: returned to the warehouse on 3 May." in prompt  # the custom tool's result
    assert 'search "warehouse": [1]' in prompt  # the search and what it returned
    assert "draft answer: draft answer [1]" in prompt  # the controller's draft, as Arcana
    assert prompt.index('search "warehouse"') < prompt.index("order_status(")  # in order
    assert prompt.rstrip().endswith("Question: When is my refund for order 12?")
    assert result.text == "Your refund arrives within 14 days of 3 May [1]."
    assert result.citations[0].chunk.source_id == "refunds"
    # A writer that answers nothing leaves the controller's draft.
    kept = Loop(
        "refunds?",
        llm=ScriptedLLM(("search", {"query": "refunds"}), ("answer", {"text": "draft [1]"})),
        answer_llm=ScriptedLLM("   "),
    ).run()
    assert kept.text == "draft [1]" and "wrote nothing" in kept.warnings[0]


def test_keep_sources_best_sets_the_weakest_aside(corpus):
    script = (
        ("search", {"query": "fee", "limit": 1}),  # one term: a weak score
        ("search", {"query": "refunds paid days warehouse", "limit": 1}),
        ("answer", {"text": "Refunds take 14 days [2]."}),
    )
    first = Loop(
        "refunds?", llm=ScriptedLLM(*script), max_chunks=1, mode="fulltext", keep_sources="first"
    ).run()
    assert [c.source_id for c in first.chunks] == ["shipping"]
    assert "dropped" in first.tool_calls[1].result and first.set_aside == []

    result = Loop(
        "refunds?", llm=ScriptedLLM(*script), max_chunks=1, mode="fulltext", keep_sources="best"
    ).run()
    assert [c.source_id for c in result.chunks] == ["shipping", "refunds"]  # numbers kept
    assert result.chunks[1].score > result.chunks[0].score
    assert result.set_aside == [1] and "[1] set aside" in result.tool_calls[1].result
    assert [c.chunk.source_id for c in result.citations] == ["refunds"]
    assert result.to_dict()["set_aside"] == [1]
    # The answer written from the sources shows only those held, with their numbers.
    writer = ScriptedLLM("Refunds take 14 days [2].")
    Loop(
        "refunds?",
        llm=ScriptedLLM(*script),
        answer_llm=writer,
        max_chunks=1,
        mode="fulltext",
        keep_sources="best",
    ).run()
    assert '<source id="2" title="Refund policy">' in writer.calls[0]["prompt"]
    assert '<source id="1"' not in writer.calls[0]["prompt"]
    with pytest.raises(InvalidOption, match="keep_sources must be one of first, best"):
        Loop("q", llm=writer, keep_sources="top")
