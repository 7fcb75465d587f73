"""The local-model lane (benchmarks/local_llm.py): the tool-call parsing of its server always;
the real model only when asked (``DJANGO_RAG_LOCAL_LLM=1``) and assembled, else skipped with
the reason (docs/llm.md#run-a-local-model)."""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks import local_llm
from benchmarks.local_llm import ChatFormat, parse_tool_calls, template_messages

ROOT = Path(__file__).resolve().parent.parent


def test_a_tool_call_block_becomes_an_openai_tool_call():
    text, calls = parse_tool_calls(
        'Let me look.\n<tool_call>\n{"name": "search", "arguments": {"query": "Jaws"}}\n'
        "</tool_call>"
    )
    assert text == "Let me look."
    assert [c["function"]["name"] for c in calls] == ["search"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"query": "Jaws"}
    assert calls[0]["id"].startswith("call_") and calls[0]["type"] == "function"


def test_several_blocks_an_unclosed_last_one_and_a_bad_one():
    text, calls = parse_tool_calls(
        '<tool_call>{"name": "a", "arguments": {"x": 1}}</tool_call>'
        "<tool_call>not json</tool_call>"
        '<tool_call>{"name": "b", "arguments": {}}'
    )
    assert [c["function"]["name"] for c in calls] == ["a", "b"]
    # What did not parse stays visible in the text.
    assert text == "<tool_call>not json</tool_call>"


def test_tool_call_parsing_is_bounded():
    many = '<tool_call>{"name": "a", "arguments": {}}</tool_call>' * 50
    _, calls = parse_tool_calls(many)
    assert len(calls) == local_llm.MAX_TOOL_CALLS
    huge = "<tool_call>" + "x" * (local_llm.MAX_REPLY_CHARS + 1)
    assert parse_tool_calls(huge) == (huge, [])
    deep = '<tool_call>{"name": "a", "arguments": ' + "[" * 10_000 + "</tool_call>"
    text, calls = parse_tool_calls(deep)
    assert calls == [] and text == deep


def test_tool_results_and_tool_only_assistant_messages_reach_the_prompt():
    template = (
        "{% for m in messages %}[{{ m.role }}]{{ m.content }}"
        "{% for c in m.tool_calls or [] %}<call {{ c.function.name }} "
        "{{ c.function.arguments | tojson }}>{% endfor %}{% endfor %}"
        "{% if add_generation_prompt %}[assistant]{% endif %}"
    )
    messages = [
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "1", "type": "function", "function": {"name": "s", "arguments": '{"k": 2}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "1", "content": "result text"},
    ]
    prompt = ChatFormat(template).render(messages, None)
    # Arguments are rendered as an object (not a JSON string inside a string), and the tool's
    # result is there: the stock chatml-function-calling format dropped it.
    assert prompt == '[user]q[assistant]<call s {"k": 2}>[tool]result text[assistant]'
    assert template_messages(messages)[1]["content"] == ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def local_server():
    if os.environ.get("DJANGO_RAG_LOCAL_LLM") != "1":
        pytest.skip("the local model runs only when DJANGO_RAG_LOCAL_LLM=1 (docs/llm.md)")
    reason = local_llm.skip_reason()
    if reason:
        pytest.skip(reason)
    port = _free_port()
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    process = subprocess.Popen(
        [sys.executable, str(ROOT / "benchmarks" / "local_llm.py"), "serve", "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        line = process.stdout.readline()
        assert "serving" in line, line
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.mark.local_llm
def test_the_local_model_answers_calls_a_tool_and_reads_its_result(local_server):
    from django_rag.llm import LiteLLM, tool_message, tool_schema

    llm = LiteLLM(
        model="openai/local", api_base=local_server, api_key="local", timeout=300, json_mode=None
    )
    tools = [
        tool_schema(
            "search",
            "Search the documents for passages about a query.",
            {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
        )
    ]
    messages = [
        {"role": "system", "content": "Answer from the documents only; search them first."},
        {"role": "user", "content": "Who directed the film Jaws?"},
    ]
    first = llm.chat(messages, tools=tools, max_tokens=120)
    assert [call.name for call in first.tool_calls] == ["search"]
    assert first.tool_calls[0].arguments.get("query")
    messages += [
        first.message(),
        tool_message(
            first.tool_calls[0].id,
            "Jaws is a 1975 American thriller film directed by Steven Spielberg.",
        ),
    ]
    second = llm.chat(messages, tools=tools, max_tokens=120)
    # The tool's result reached the model: it answers from it, or (a 1.5B model often does)
    # searches again with what it learnt.
    seen = second.text + "".join(call.raw_arguments for call in second.tool_calls)
    assert "Spielberg" in seen, second
    final = llm.chat(messages, tools=tools, tool_choice="none", max_tokens=120)
    assert "Spielberg" in final.text and not final.tool_calls
    started = time.monotonic()
    # JSON mode as the library's steps ask for it: litellm lists response_format for
    # openai/..., so LiteLLM sends it and the server enforces it with a grammar.
    reply = llm.complete(
        'Reply with a JSON object {"city": ...} naming the capital of France.',
        json_object=True,
        max_tokens=40,
    )
    assert json.loads(reply.text)["city"] == "Paris", (reply.text, time.monotonic() - started)


# --- tool calls written as text (django_rag.llm.base.tool_calls_in_text) ----------------------

SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
    },
}


@pytest.mark.parametrize(
    "reply",
    [
        '```json\n{"name": "search", "arguments": {"query": "Jaws"}}\n```',
        '{"name": "search", "arguments": {"query": "Jaws"}}',
        '<tool_call>\n{"name": "search", "arguments": {"query": "Jaws"}}\n</tool_call>',
        '{"tool_calls": [{"name": "search", "arguments": {"query": "Jaws"}}]}',
    ],
)
def test_a_tool_call_written_as_text_is_made(stub_llm_server, reply):
    from django_rag.llm import get_llm
    from tests.conftest import stub_llm

    stub_llm_server.chat = [reply]
    llm = get_llm(stub_llm(stub_llm_server))
    completion = llm.chat([{"role": "user", "content": "Who directed Jaws?"}], tools=[SEARCH_TOOL])
    assert [(c.name, c.arguments) for c in completion.tool_calls] == [("search", {"query": "Jaws"})]
    assert completion.text == "" and completion.finish_reason == "tool_calls"
    # The call goes back to the model in OpenAI's format on the next turn.
    assert completion.message()["tool_calls"][0]["function"]["name"] == "search"


@pytest.mark.parametrize(
    "reply",
    [
        # An answer that quotes JSON, a tool that was not offered, plain prose.
        'The config is {"name": "search", "arguments": {}} as shown.',
        '{"name": "delete_everything", "arguments": {}}',
        "Steven Spielberg directed Jaws.",
    ],
)
def test_text_that_is_not_a_call_of_an_offered_tool_stays_text(stub_llm_server, reply):
    from django_rag.llm import get_llm
    from tests.conftest import stub_llm

    stub_llm_server.chat = [reply]
    llm = get_llm(stub_llm(stub_llm_server))
    completion = llm.chat([{"role": "user", "content": "q"}], tools=[SEARCH_TOOL])
    assert completion.tool_calls == [] and completion.text == reply


def test_text_tool_calls_are_bounded():
    from django_rag.llm.base import tool_calls_in_text

    many = '<tool_call>{"name": "search", "arguments": {}}</tool_call>' * 40
    assert len(tool_calls_in_text(many, [SEARCH_TOOL])) == 8
    deep = '{"name": "search", "arguments": ' + "[" * 5000
    assert tool_calls_in_text(deep, [SEARCH_TOOL]) == []
    assert tool_calls_in_text('{"name": "search"}', []) == []


@pytest.mark.parametrize(
    "choice, text, expected",
    [
        ({"type": "function", "function": {"name": "search"}}, '{"query": "x"}}', "search"),
        ("required", '{"name": "answer", "arguments": {"text": "t"}}', "answer"),
    ],
)
def test_a_forced_tool_choice_starts_the_reply_with_the_call(choice, text, expected):
    forced = local_llm._forced_call(choice)
    _, calls = parse_tool_calls(forced + text)
    assert [call["function"]["name"] for call in calls] == [expected]
    for loose in ("auto", "none", None, {"function": 3}, {"function": {"name": ""}}):
        assert local_llm._forced_call(loose) == ""
