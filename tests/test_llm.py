"""The LLM layer: specs, the JSON parser, usage, secrets, and litellm over real HTTP."""

import logging

import pytest
from django.test import override_settings

from django_rag.conf import redact
from django_rag.exceptions import (
    ConfigurationError,
    LLMAuthenticationError,
    LLMError,
    LLMNotConfigured,
    LLMResponseError,
)
from django_rag.llm import (
    LLM,
    CallableLLM,
    Completion,
    LiteLLM,
    Usage,
    collect_usage,
    get_llm,
    map_concurrently,
    parse_json,
)
from django_rag.testing import ScriptedLLM
from tests.conftest import stub_llm
from tests.stub_openai import Failure

# --- the JSON parser ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"a": 1}', {"a": 1}),
        ('```json\n{"a": 1}\n```', {"a": 1}),
        ('```\n{"a": [1, 2]}\n```', {"a": [1, 2]}),
        ('Sure! Here it is: {"a": 1} Hope that helps.', {"a": 1}),
        ('{"a": [1, 2,], "b": {"c": 3,},}', {"a": [1, 2], "b": {"c": 3}}),
        (
            '{"text": "braces } and { in a string, and a comma,]"}',
            {"text": "braces } and { in a string, and a comma,]"},
        ),
        ('{"escaped": "a \\" quote }"}', {"escaped": 'a " quote }'}),
        ('{"ok": True, "none": None}', {"ok": True, "none": None}),
        ('Not this {broken, but this: {"a": 2}', {"a": 2}),
    ],
)
def test_parse_json_accepts_what_llms_write(text, expected):
    assert parse_json(text) == expected


def test_parse_json_expectations_and_failures():
    assert parse_json('Scores: [3, 4] and {"a": 1}', expect=list) == [3, 4]
    assert parse_json('[1] then {"a": 1}', expect=dict) == {"a": 1}
    assert parse_json("[1]", expect=None) == [1]
    for garbage in ["", "   ", "no json here", "{not: json", "[1, 2"]:
        with pytest.raises(LLMResponseError) as info:
            parse_json(garbage)
        assert info.value.code == "llm_response_error"
        assert isinstance(info.value, LLMError)
    with pytest.raises(LLMResponseError, match="no parseable JSON dict"):
        parse_json("[1, 2]", expect=dict)


# --- building LLMs from specs -------------------------------------------------------------------


def test_llm_specs():
    llm = get_llm("openai/gpt-4o-mini")
    assert isinstance(llm, LiteLLM) and llm.model_name == "openai/gpt-4o-mini"
    assert get_llm("gpt-3.5-turbo").model_name == "gpt-3.5-turbo"  # dots, not a dotted path
    with_options = get_llm(("ollama/llama3.1", {"temperature": 0, "timeout": 5}))
    assert (with_options.temperature, with_options.timeout) == (0, 5)
    as_dict = get_llm({"model": "anthropic/claude-3-5-haiku", "max_tokens": 100})
    assert as_dict.max_tokens == 100
    backend = get_llm({"BACKEND": "litellm", "OPTIONS": {"model": "openai/x", "max_retries": 1}})
    assert backend.max_retries == 1
    function = get_llm(lambda prompt: "hi")
    assert isinstance(function, CallableLLM) and function.complete("x").text == "hi"
    scripted = ScriptedLLM("a")
    assert get_llm(scripted) is scripted
    assert isinstance(get_llm("django_rag.testing.ScriptedLLM"), ScriptedLLM)
    with pytest.raises(ConfigurationError, match="'model'"):
        get_llm({"temperature": 0})
    with pytest.raises(ConfigurationError, match="bad OPTIONS"):
        get_llm({"model": "openai/x", "no_such_option": 1})


def test_no_llm_configured_says_what_to_do():
    with pytest.raises(LLMNotConfigured, match=r"DJANGO_RAG\['LLM'\]") as info:
        get_llm(None, feature="ask()")
    assert "ask()" in str(info.value)
    with override_settings(DJANGO_RAG={"EMBEDDER": "hashing", "LLM": "openai/gpt-4o-mini"}):
        assert get_llm().model_name == "openai/gpt-4o-mini"


def test_api_keys_never_show():
    llm = get_llm({"model": "openai/gpt-4o-mini", "api_key": "sk-very-secret"})
    assert "sk-very-secret" not in repr(llm)
    assert "sk-very-secret" not in str(vars(llm).get("api_key", ""))
    settings = {
        "LLM": {"model": "m", "api_key": "sk-1", "max_tokens": 5},
        "EMBEDDER": {
            "BACKEND": "litellm",
            "OPTIONS": {"hf_token": "t", "password": "p", "model": "e"},
        },
    }
    cleaned = redact(settings)
    assert cleaned["LLM"] == {"model": "m", "api_key": "[REDACTED]", "max_tokens": 5}
    assert cleaned["EMBEDDER"]["OPTIONS"] == {
        "hf_token": "[REDACTED]",
        "password": "[REDACTED]",
        "model": "e",
    }


# --- usage, callables, streaming ----------------------------------------------------------------


def test_usage_is_collected_from_every_call_including_threads():
    llm = ScriptedLLM(default="two words", cost_per_call=0.5)
    with collect_usage() as outer:
        llm.complete("one")
        with collect_usage() as inner:
            map_concurrently(lambda prompt: llm.complete(prompt), ["a b", "c", "d"], 3)
    assert inner.calls == 3 and outer.calls == 4
    assert inner.completion_tokens == 6
    assert outer.cost == pytest.approx(2.0)
    assert outer.by_model["scripted"]["calls"] == 4
    assert (Usage() + inner).to_dict()["total_tokens"] == inner.total_tokens


def test_callable_llm_forms():
    seen = []

    def answer(prompt):
        seen.append(prompt)
        return "fine"

    llm = CallableLLM(answer)
    assert llm.complete("question", system="rules").text == "fine"
    assert seen == ["rules\n\nquestion"]
    usage_llm = CallableLLM(lambda p: Completion("x", Usage.of_call("mine", 3, 1, 0.1)))
    assert usage_llm.complete("p").usage.cost == 0.1
    streaming = CallableLLM(lambda p: iter(["a", "b", "c"]))
    stream = streaming.stream("p")
    assert list(stream) == ["a", "b", "c"] and stream.completion.text == "abc"
    assert streaming.complete("p").text == "abc"

    def broken(prompt):
        raise RuntimeError("provider down")

    with pytest.raises(LLMError, match="provider down"):
        CallableLLM(broken).complete("p")
    with pytest.raises(LLMError, match="return a string"):
        CallableLLM(lambda p: 42).complete("p")


def test_scripted_llm_rules_queue_and_failures():
    llm = ScriptedLLM("first", ValueError, rules={"special": "ruled"})
    assert llm.complete("special case").text == "ruled"
    assert llm.complete("x").text == "first"
    with pytest.raises(LLMError):
        llm.complete("y")
    with pytest.raises(AssertionError, match="no response left"):
        llm.complete("z")
    assert [call["prompt"] for call in llm.calls] == ["special case", "x", "y", "z"]
    stream = ScriptedLLM("hello big world").stream("p")
    assert list(stream) == ["hello ", "big ", "world"]


def test_llm_calls_send_telemetry(events):
    ScriptedLLM("an answer").complete("the prompt", system="sys")
    kinds = [(kind, event) for kind, event, _ in events]
    assert kinds == [("start", "llm.complete"), ("stop", "llm.complete")]
    stop = events[1][2]
    assert stop["model"] == "scripted" and stop["response_chars"] == 9
    assert stop["prompt_chars"] == len("sys") + len("the prompt")
    assert "prompt" not in stop and "answer" not in stop  # no raw text by default
    assert stop["duration"] >= 0
    with pytest.raises(LLMError):
        ScriptedLLM(RuntimeError("x")).complete("p")
    assert events[-1][0] == "exception" and isinstance(events[-1][2]["exception"], LLMError)


def test_base_class_contract():
    class Echo(LLM):
        model_name = "echo"

        def _complete(self, messages, **options):
            return Completion(messages[-1]["content"].upper())

    assert Echo().complete("hi").text == "HI"
    stream = Echo().stream("hi")
    assert "".join(stream) == "HI" and stream.completion.text == "HI"
    with pytest.raises(RuntimeError, match="only once"):
        list(stream)


# --- litellm over real HTTP ----------------------------------------------------------------------


def test_litellm_completion_over_http(stub_llm_server):
    stub_llm_server.chat = ["The answer is 42."]
    llm = get_llm(stub_llm(stub_llm_server))
    completion = llm.complete("What is it?", system="Be brief.")
    assert completion.text == "The answer is 42."
    request = stub_llm_server.chat_requests[0]
    assert request["body"]["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is it?"},
    ]
    assert request["authorization"] == "Bearer sk-test-not-a-real-key"
    assert completion.usage.prompt_tokens == 5 and completion.usage.completion_tokens == 4
    # litellm knows gpt-4o-mini's price, so the call has a cost.
    assert completion.usage.cost is not None and completion.usage.cost > 0


def test_litellm_retries_a_429_and_then_succeeds(stub_llm_server, caplog):
    stub_llm_server.chat = [Failure(429, "slow down", retry_after=0), Failure(503), "done"]
    llm = get_llm(stub_llm(stub_llm_server))
    with caplog.at_level(logging.WARNING, logger="django_rag.llm.litellm"):
        assert llm.complete("go").text == "done"
    assert len(stub_llm_server.chat_requests) == 3
    assert "RateLimitError" in caplog.text
    assert "sk-test-not-a-real-key" not in caplog.text


def test_litellm_gives_up_after_max_retries_and_on_final_errors(stub_llm_server):
    stub_llm_server.chat = [Failure(429, retry_after=0)] * 3
    llm = get_llm(stub_llm(stub_llm_server, max_retries=2))
    with pytest.raises(LLMError, match="after 3 attempt") as info:
        llm.complete("go")
    assert info.value.attempts == 3
    stub_llm_server.chat = [Failure(401, "invalid key sk-test-not-a-real-key")]
    before = len(stub_llm_server.chat_requests)
    with pytest.raises(LLMError) as info:
        llm.complete("go")
    assert len(stub_llm_server.chat_requests) == before + 1  # auth errors are not retried
    assert "sk-test-not-a-real-key" not in str(info.value)
    assert "AuthenticationError" in str(info.value)


@pytest.mark.parametrize("status", [401, 403])
def test_a_rejected_api_key_fails_at_once_saying_which_key_to_set(stub_llm_server, status):
    # Default backoff (1 s, 3 retries): were the failure taken as transient, it would be retried.
    stub_llm_server.chat = [Failure(status, "Incorrect API key provided: sk-test-not-a-real-key")]
    llm = get_llm({**stub_llm(stub_llm_server), "backoff": 1.0})
    with pytest.raises(LLMAuthenticationError) as info:
        llm.complete("go")
    error = info.value
    assert isinstance(error, LLMError) and error.code == "llm_authentication_failed"
    assert error.attempts == 1 and len(stub_llm_server.chat_requests) == 1
    assert error.env_var == "OPENAI_API_KEY"
    assert "set OPENAI_API_KEY" in str(error) and "refused the API key" in str(error)
    assert "sk-test-not-a-real-key" not in str(error)


def test_a_missing_api_key_fails_at_once_saying_which_key_to_set(stub_llm_server, monkeypatch):
    # litellm reports a missing key as an InternalServerError, a class otherwise retried.
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    spec = {**stub_llm(stub_llm_server), "backoff": 1.0}
    del spec["api_key"]
    with pytest.raises(LLMAuthenticationError) as info:
        get_llm(spec).complete("go")
    assert info.value.attempts == 1 and stub_llm_server.chat_requests == []
    assert "no API key was found" in str(info.value)
    assert "set OPENAI_API_KEY" in str(info.value)


def test_a_rejected_key_for_embeddings_is_not_retried(stub_llm_server):
    from django_rag.embeddings.litellm import LiteLLMEmbedder

    stub_llm_server.embedding_failures = [Failure(401, "bad key")] * 4
    embedder = LiteLLMEmbedder(
        model="openai/text-embedding-3-small",
        api_base=stub_llm_server.base_url,
        api_key="sk-test-not-a-real-key",
    )
    with pytest.raises(LLMAuthenticationError, match="set OPENAI_API_KEY"):
        embedder.embed_query("hello")
    assert len(stub_llm_server.requests) == 1


def test_litellm_streams_over_http(stub_llm_server):
    stub_llm_server.chat = ["Streaming works fine [1]."]
    stream = get_llm(stub_llm(stub_llm_server)).stream("go")
    pieces = list(stream)
    assert len(pieces) > 1 and "".join(pieces) == "Streaming works fine [1]."
    assert stream.completion.text == "Streaming works fine [1]."
    assert stream.completion.usage.completion_tokens == 4
    assert stub_llm_server.chat_requests[0]["body"]["stream"] is True


def test_litellm_timeout_is_an_llm_error():
    # Nothing listens on this port: the connection fails, is retried, then reported.
    llm = get_llm(
        {
            "model": "openai/gpt-4o-mini",
            "api_base": "http://127.0.0.1:9/v1",
            "api_key": "k",
            "max_retries": 1,
            "backoff": 0.01,
            "timeout": 2,
        }
    )
    with pytest.raises(LLMError, match="after 2 attempt"):
        llm.complete("x")


def test_litellm_reads_its_bundled_prices_unless_told_otherwise(tmp_path):
    """Imported through django_rag, litellm does not fetch its price list (which waits, then
    warns, on a machine without network); an explicit setting is kept."""
    import os
    import subprocess
    import sys

    code = (
        "import os; from django_rag.llm.litellm import import_litellm; "
        "litellm = import_litellm('x'); print(os.environ['LITELLM_LOCAL_MODEL_COST_MAP'], "
        "'gpt-4o-mini' in litellm.model_cost)"
    )
    env = {k: v for k, v in os.environ.items() if k != "LITELLM_LOCAL_MODEL_COST_MAP"}
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["True", "True"]
    assert "cost map" not in result.stderr.lower() and "model_prices" not in result.stderr
    # A value the environment gives is left as it is (no import needed to see that).
    code = "from django_rag.llm.litellm import import_litellm; import os; import_litellm('x'); "
    code += "print(os.environ['LITELLM_LOCAL_MODEL_COST_MAP'])"
    kept = subprocess.run(
        [sys.executable, "-c", code],
        env={**env, "LITELLM_LOCAL_MODEL_COST_MAP": "true"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert kept.stdout.strip() == "true", kept.stderr[-2000:]
