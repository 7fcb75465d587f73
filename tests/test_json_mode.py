"""JSON mode (``response_format``) for the steps that want JSON, and strict yes/no fields:
over real HTTP to the OpenAI-compatible stub through litellm, and on real PostgreSQL."""

from __future__ import annotations

import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st

import django_rag as rag
from django_rag.agent import Context, steps
from django_rag.exceptions import LLMError, LLMResponseError
from django_rag.llm import get_llm, json_flag
from django_rag.rerankers import get_reranker
from django_rag.testing import ScriptedLLM
from tests.conftest import stub_llm
from tests.helpers import ingest_agent_corpus
from tests.stub_openai import Failure, Raw

JSON_OBJECT = {"type": "json_object"}


# --- json_flag: a yes/no field read strictly -------------------------------------------------------


@pytest.mark.parametrize(
    "value, expected",
    [(True, True), (False, False), (1, True), (0, False), ("yes", True), (" False ", False)],
)
def test_json_flag_reads_explicit_answers(value, expected):
    assert json_flag({"sufficient": value}, "sufficient") is expected


@pytest.mark.parametrize("data", [{}, {"sufficient": None}, {"sufficient": "maybe"}, {"ok": True}])
def test_json_flag_refuses_a_missing_or_unreadable_field(data):
    with pytest.raises(LLMResponseError, match="no readable 'sufficient'"):
        json_flag(data, "sufficient")


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=10,
)


@given(JSON_VALUES)
def test_json_flag_answers_a_bool_or_a_typed_error_for_any_value(value):
    try:
        result = json_flag({"flag": value}, "flag")
    except LLMResponseError:
        return
    assert isinstance(result, bool)
    assert result is (value in (True, 1) or str(value).strip().lower() in ("true", "yes", "1"))


# --- JSON mode over HTTP ---------------------------------------------------------------------------


def _formats(stub) -> list:
    return [r["body"].get("response_format") for r in stub.chat_requests]


@pytest.mark.django_db
def test_steps_that_want_json_send_json_mode_and_the_answer_does_not(stub_llm_server):
    ingest_agent_corpus()
    stub_llm_server.rules = {
        "sub-questions": '{"sub_questions": ["X200 warranty", "Z9 warranty"]}',
        "Reply with JSON only": '{"sufficient": true}',
    }
    stub_llm_server.default = "The X200 has a two-year warranty [1]."
    agent = (
        rag.Agent(
            "Which drill has the longer warranty?",
            llm=stub_llm(stub_llm_server, json_mode=None),  # auto: litellm lists it for gpt-4o
            limit=2,
        )
        .decompose()
        .search()
        .reason()
        .answer()
    )
    assert agent.context.sub_questions == ["X200 warranty", "Z9 warranty"]
    assert agent.context.warnings == []
    assert _formats(stub_llm_server) == [JSON_OBJECT, JSON_OBJECT, None]


@pytest.mark.django_db
def test_the_llm_reranker_asks_for_json_mode_over_http(stub_llm_server):
    ingest_agent_corpus()
    stub_llm_server.default = '{"1": 9, "2": 1}'
    results = rag.search("drill warranty", limit=2)
    llm = stub_llm(stub_llm_server, json_mode=True)
    reranker = get_reranker({"BACKEND": "llm", "OPTIONS": {"llm": llm}})
    reranked = reranker.rerank("drill warranty", results)
    assert reranked and reranked[0].chunk_id == results[0].chunk_id
    assert _formats(stub_llm_server) == [JSON_OBJECT]


def test_json_mode_is_off_by_default_and_needs_json_in_the_prompt(stub_llm_server):
    stub_llm_server.default = '{"ok": true}'
    default = get_llm(stub_llm(stub_llm_server))
    assert default.complete_json("Reply with JSON only.") == {"ok": True}
    auto = get_llm(stub_llm(stub_llm_server, json_mode=None))
    # OpenAI refuses JSON mode unless the messages say JSON: a custom prompt that does not
    # is sent without it.
    auto.complete("Say yes or no.", json_object=True)
    auto.complete("Reply with JSON only.", json_object=True)
    assert _formats(stub_llm_server) == [None, None, JSON_OBJECT]


def test_a_provider_refusing_json_mode_is_called_again_without_it(stub_llm_server, caplog):
    stub_llm_server.chat = [Failure(400, "response_format is not supported by this model")]
    stub_llm_server.default = '{"ok": true}'
    llm = get_llm(stub_llm(stub_llm_server, json_mode=True))
    with caplog.at_level(logging.WARNING, logger="django_rag.llm.litellm"):
        assert llm.complete("Reply with JSON only.", json_object=True).text == '{"ok": true}'
        llm.complete("Reply with JSON only.", json_object=True)
    assert _formats(stub_llm_server) == [JSON_OBJECT, None, None]
    assert "refused JSON mode" in caplog.text


@pytest.mark.parametrize(
    "failure",
    [Failure(400, "the prompt is longer than the context window"), Failure(401, "bad key")],
)
def test_other_failures_are_not_retried_without_json_mode(stub_llm_server, failure):
    stub_llm_server.chat = [failure]
    llm = get_llm(stub_llm(stub_llm_server, json_mode=True))
    with pytest.raises(LLMError):
        llm.complete("Reply with JSON only.", json_object=True)
    assert _formats(stub_llm_server) == [JSON_OBJECT]


def test_json_mode_must_be_a_bool_or_none():
    from django_rag.llm.litellm import LiteLLM

    with pytest.raises(ValueError, match="json_mode"):
        LiteLLM(model="openai/x", json_mode="yes")


# --- a verdict without its yes/no field is a reported fallback, not a silent "yes" ---------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    "step, reply, note",
    [
        ("reason", '{"answer_found": true}', "reason:"),
        ("gate", '{"reasoning": "general knowledge"}', "gate:"),
        ("answer", '{"feedback": "fine"}', "answer:"),
    ],
)
def test_a_verdict_missing_its_field_is_a_reported_fallback(step, reply, note):
    ingest_agent_corpus()
    llm = ScriptedLLM(reply, "The X200 drill [1].", reply)
    ctx = Context("drill motor", llm=llm)
    if step == "gate":
        steps.gate(ctx)
        assert ctx.skip_retrieval is False  # the fallback retrieves
    elif step == "reason":
        steps.search(ctx)
        before = len(ctx.chunks)
        steps.reason(ctx)
        assert len(ctx.chunks) == before
    else:
        steps.search(ctx)
        llm = ScriptedLLM("The X200 drill [1].", reply)
        ctx.llm = llm
        steps.answer(ctx, self_correct=True)
        assert ctx.answer == "The X200 drill [1]." and ctx.error is None
    assert any(w.startswith(note) and "no readable" in w for w in ctx.warnings), ctx.warnings


# --- a reply cut at the token limit ----------------------------------------------------------------


def _cut(content: str) -> Raw:
    return Raw(
        {
            "id": "cut",
            "object": "chat.completion",
            "model": "gpt-4o-mini",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content},
                    "finish_reason": "length",
                }
            ],
            "usage": {"prompt_tokens": 10, "completion_tokens": 512, "total_tokens": 522},
        }
    )


def test_json_cut_at_the_token_limit_says_so_instead_of_parsing_a_fragment(stub_llm_server):
    """A 1.5B model in JSON mode pretty-prints a graph past max_tokens: the fragment's first
    whole inner object must not be taken for the answer."""
    from django_rag.graph.extractors import LLMGraphExtractor

    stub_llm_server.chat = [
        _cut(
            '{\n  "entities": [\n    {"name": "Band of Skulls", "type": "organization"},\n    {"na'
        ),
        _cut('{"entities": [{"name": "Southampton", "type": "location"}], "relationships": []}'),
    ]
    extractor = LLMGraphExtractor(llm=stub_llm(stub_llm_server))
    with pytest.raises(LLMResponseError, match="cut at its token limit \\(512 tokens\\)"):
        extractor.extract("Band of Skulls are an English rock band from Southampton.")
    # Cut after the JSON ended (trailing prose or nothing): the JSON is whole and is used.
    extraction = extractor.extract("Southampton is a city.")
    assert [e.name for e in extraction.entities] == ["Southampton"]
