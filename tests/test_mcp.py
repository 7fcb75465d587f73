"""The MCP server (manage.py rag_mcp): the SDK's client over stdio and streamable HTTP against a
real child process on the test database, scope and hostile-argument negatives, ask through the
stub LLM over HTTP, and the tools' checks in-process."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import override_settings

import django_rag as rag
from django_rag.exceptions import ConfigurationError, MissingDependency
from django_rag.mcp.tools import McpConfig, call_tool
from django_rag.models import Chunk, Document
from tests.conftest import stub_llm

NO_SDK = "the mcp extra (pip install 'django-rag[mcp]') is not installed"

ROOT = Path(__file__).resolve().parent.parent
REFUNDS = "Refunds are paid within 14 days of the return reaching our warehouse."
SALARIES = "Salaries of the refunds team: confidential payroll figures for every employee."


def corpus():
    refunds = rag.ingest(REFUNDS, collection="handbook", source_id="refunds", title="Refunds")
    rag.ingest(SALARIES, collection="secret", source_id="payroll", title="Payroll")
    return Chunk.objects.get(document=refunds)


def child_env(mcp: dict, **extra) -> dict[str, str]:
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.mcp_settings",
        "DJANGO_RAG_TEST_DATABASE": connection.settings_dict["NAME"],
        "DJANGO_RAG_TEST_MCP": json.dumps({"MCP": mcp, **extra}),
        "PYTHONPATH": str(ROOT),
    }


def run_client(target, calls, **options):
    """Connect the SDK's client to ``target``, list the tools, make ``calls`` ((name,
    arguments) pairs) and return (tool names, results)."""
    import anyio
    from mcp import Client

    async def main():
        async with Client(target, read_timeout_seconds=120, **options) as client:
            tools = await client.list_tools()
            results = [await client.call_tool(name, arguments) for name, arguments in calls]
            return tools.tools, results

    return anyio.run(main)


def error_of(result) -> dict:
    assert result.is_error, result
    assert json.loads(result.content[0].text) == result.structured_content
    return result.structured_content["error"]


@pytest.mark.django_db(transaction=True)
def test_stdio_search_scope_hostile_arguments_and_ask_through_the_stub_llm(stub_llm_server):
    pytest.importorskip("mcp", reason=NO_SDK)
    from mcp.client.stdio import StdioServerParameters

    chunk = corpus()
    stub_llm_server.chat = ["Refunds are paid within 14 days [1]."]
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "django", "rag_mcp"],
        cwd=str(ROOT),
        env=child_env({"COLLECTIONS": ["handbook"]}, LLM=stub_llm(stub_llm_server)),
    )
    tools, results = run_client(
        params,
        [
            ("search", {"query": "how long do refunds take", "limit": 3}),
            # The secret collection matches "refunds" too; the default scope never reaches it.
            ("search", {"query": "refunds team payroll", "limit": 10}),
            ("search", {"query": "payroll", "collection": "secret"}),
            ("search", {"query": "payroll", "collection": "no-such-collection"}),
            ("search", {"query": "payroll", "collection": ["handbook", "secret"]}),
            # "collections" is a typo for "collection": refused, not dropped (which would widen
            # the search).
            ("search", {"query": "payroll", "collections": ["secret"]}),
            ("search", {"query": "refunds", "limit": 10**6}),
            ("search", {"query": "x" * 100_000}),
            ("search", {"query": {"$ne": 1}}),
            ("nope", {}),
            ("ask", {"question": "How long do refunds take?", "limit": 2}),
            ("ask", {"question": "What are the salaries?", "collection": "secret"}),
        ],
    )
    by_name = {tool.name: tool for tool in tools}
    assert set(by_name) == {"search", "ask"}  # ingest_text is off by default
    schema = by_name["search"].input_schema
    assert schema["additionalProperties"] is False and schema["required"] == ["query"]
    assert schema["properties"]["collection"]["anyOf"][0]["enum"] == ["handbook"]
    assert by_name["search"].annotations.read_only_hint is True

    found, default_scope, secret, missing, mixed, typo, huge_limit, long_query, typed = results[:9]
    unknown_tool, answered, ask_secret = results[9:]
    assert not found.is_error
    hit = found.structured_content["results"][0]
    assert hit["chunk_id"] == chunk.pk and hit["document_id"] == chunk.document_id
    assert hit["text"] == REFUNDS and hit["title"] == "Refunds" and hit["collection"] == "handbook"
    assert hit["score"] > 0 and hit["source_id"] == "refunds"
    assert json.loads(found.content[0].text) == found.structured_content
    assert {r["collection"] for r in default_scope.structured_content["results"]} == {"handbook"}
    assert "confidential" not in default_scope.content[0].text

    for refused, name in ((secret, "secret"), (missing, "no-such-collection"), (mixed, "secret")):
        error = error_of(refused)
        assert error["code"] == "collection_not_allowed" and repr(name) in error["message"]
        assert "confidential" not in json.dumps(refused.structured_content)
    # Whether a collection exists is not told: the same message but for the name.
    assert error_of(secret)["message"].replace("secret", "X") == error_of(missing)[
        "message"
    ].replace("no-such-collection", "X")

    assert error_of(typo)["code"] == "invalid_option"
    assert "'collections'" in error_of(typo)["message"]
    assert "limit must be from 1 to 20" in error_of(huge_limit)["message"]
    assert error_of(long_query)["code"] == "query_too_long"
    assert error_of(typed)["code"] == "invalid_option"
    assert error_of(unknown_tool)["code"] == "invalid_option"

    assert not answered.is_error, answered.content[0].text
    answer = answered.structured_content
    assert answer["answer"] == "Refunds are paid within 14 days [1]."
    assert answer["citations"][0]["chunk_id"] == chunk.pk
    assert answer["citations"][0]["title"] == "Refunds"
    assert answer["sources"][0]["number"] == 1 and answer["sources"][0]["text"] == REFUNDS
    assert all(source["collection"] == "handbook" for source in answer["sources"])
    # The LLM saw the refunds chunk and nothing of the secret collection.
    prompt = json.dumps(stub_llm_server.chat_requests)
    assert "14 days of the return" in prompt and "confidential" not in prompt
    assert len(stub_llm_server.chat_requests) == 1  # the refused ask never reached the LLM
    assert error_of(ask_secret)["code"] == "collection_not_allowed"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_port(port: int, process: subprocess.Popen, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"rag_mcp exited: {process.stderr.read()}")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise AssertionError("rag_mcp did not listen in time")


def start_http_server(mcp: dict, *arguments: str) -> tuple[int, subprocess.Popen]:
    """``rag_mcp --transport http`` in a child process on a free port, once it listens."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "django", "rag_mcp", "--transport", "http", "--port", str(port)]
        + list(arguments),
        cwd=ROOT,
        env=child_env(mcp),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for_port(port, process)
    except BaseException:
        process.kill()
        process.wait(timeout=30)
        raise
    return port, process


@pytest.mark.django_db(transaction=True)
def test_streamable_http_search_and_dns_rebinding_protection():
    pytest.importorskip("mcp", reason=NO_SDK)
    chunk = corpus()
    port, process = start_http_server({"COLLECTIONS": "*", "TOOLS": ["search"]})
    try:
        tools, (found, everywhere) = run_client(
            f"http://127.0.0.1:{port}/mcp",
            [
                ("search", {"query": "refunds warehouse", "collection": "handbook"}),
                ("search", {"query": "payroll figures"}),
            ],
        )
        assert [tool.name for tool in tools] == ["search"]
        assert found.structured_content["results"][0]["chunk_id"] == chunk.pk
        # "*": every collection is readable, and the search without a collection reaches all.
        assert everywhere.structured_content["results"][0]["collection"] == "secret"

        # A page in a browser on another origin cannot drive the local server.
        import httpx

        response = httpx.post(
            f"http://127.0.0.1:{port}/mcp",
            headers={"Host": "attacker.example", "Content-Type": "application/json"},
            content=b"{}",
        )
        assert response.status_code in (400, 403, 421)
    finally:
        process.terminate()
        process.wait(timeout=30)


TOKEN = "k3Jq9-vX_2mPzT8wLr5uYc0bNe7sHa4d"
OLD_TOKEN = "Zt0ld-TokenStillAcceptedWhileRotating"


@pytest.mark.django_db(transaction=True)
def test_http_with_tokens_serves_a_remote_host_and_refuses_requests_without_one():
    pytest.importorskip("mcp", reason=NO_SDK)
    import httpx
    from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client

    chunk = corpus()
    # 0.0.0.0 is not a loopback address: with tokens set, no --allow-remote is needed.
    mcp = {"COLLECTIONS": ["handbook"], "TOKENS": [TOKEN, OLD_TOKEN]}
    port, process = start_http_server(mcp, "--host", "0.0.0.0")
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        initialize = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "probe", "version": "1"},
            },
        }
        headers = {"Accept": "application/json, text/event-stream"}
        for sent in ({}, {"Authorization": "Bearer " + TOKEN[:-1] + "x"}, {"Authorization": TOKEN}):
            response = httpx.post(url, json=initialize, headers={**headers, **sent})
            assert response.status_code == 401, (sent, response.text)
            assert response.headers["WWW-Authenticate"].startswith("Bearer")
            assert TOKEN not in response.text

        for token in (TOKEN, OLD_TOKEN):
            client = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
            tools, (found,) = run_client(
                streamable_http_client(url, http_client=client),
                [("search", {"query": "refunds warehouse"})],
            )
            assert [tool.name for tool in tools] == ["search", "ask"]
            assert found.structured_content["results"][0]["chunk_id"] == chunk.pk
    finally:
        process.terminate()
        _, stderr = process.communicate(timeout=30)
    assert "bearer token from MCP.TOKENS required" in stderr
    assert TOKEN not in stderr and OLD_TOKEN not in stderr


# --- in-process: the tools' checks ---------------------------------------------------------


def config(**mcp):
    with override_settings(DJANGO_RAG={"EMBEDDER": "hashing", "MCP": mcp}):
        return McpConfig.from_settings()


@pytest.mark.parametrize(
    "mcp, message",
    [
        ({}, "may read no collection"),
        ({"COLLECTIONS": "handbook"}, "give a list of collection names"),
        ({"COLLECTIONS": ["ok", ""]}, "is not a collection name"),
        ({"COLLECTIONS": ["a"], "TOOLS": ["search", "delete"]}, "one or more of"),
        ({"COLLECTIONS": ["a"], "TOOLS": ["ingest_text"]}, "needs MCP.INGEST_COLLECTIONS"),
        ({"COLLECTIONS": ["a"], "INGEST_COLLECTIONS": ["*"]}, "is not a collection name"),
        ({"COLLECTIONS": ["a"], "MAX_RESULTS": 0}, "must be 1 or more"),
        (
            {"COLLECTIONS": ["a"], "TOKENS": TOKEN},
            "TOKENS'] = '<hidden>' is invalid: must be a list",
        ),
        ({"COLLECTIONS": ["a"], "TOKENS": [TOKEN, TOKEN[:20]]}, "token 2 is not a bearer token"),
        ({"COLLECTIONS": ["a"], "TOKENS": [TOKEN + " x"]}, "token 1 is not a bearer token"),
        ({"COLLECTIONS": ["a"], "TOKENS": [TOKEN + "\n"]}, "token 1 is not a bearer token"),
        ({"COLLECTIONS": ["a"], "TOKENS": [None]}, "token 1 is not a bearer token"),
    ],
)
def test_bad_mcp_settings_fail_before_anything_is_served(mcp, message):
    with pytest.raises(ConfigurationError, match=message) as caught:
        config(**mcp)
    assert TOKEN[:20] not in str(caught.value)


def test_tokens_are_never_repeated_by_the_settings_check_or_the_config():
    from django_rag.checks import check_settings

    with override_settings(DJANGO_RAG={"EMBEDDER": "hashing", "MCP": {"TOKENS": TOKEN}}):
        errors = check_settings()
    assert any("MCP" in error.msg and "TOKENS" in error.msg for error in errors), errors
    assert all(TOKEN not in error.msg for error in errors)
    assert TOKEN not in repr(config(COLLECTIONS=["a"], TOKENS=[TOKEN]))
    # A misspelt key near a secret one holds secrets all the same.
    with override_settings(DJANGO_RAG={"EMBEDDER": "hashing", "MCP": {"TOKEN": [TOKEN]}}):
        errors = check_settings()
    assert any("did you mean 'TOKENS'" in error.msg for error in errors), errors
    assert all(TOKEN not in error.msg for error in errors)


@pytest.mark.django_db
def test_tokens_are_scrubbed_from_logs_and_hidden_by_rag_info():
    from io import StringIO

    from django_rag.conf import scrub_text

    mcp = {"COLLECTIONS": ["a"], "TOKENS": [TOKEN, OLD_TOKEN]}
    with override_settings(DJANGO_RAG={"EMBEDDER": "hashing", "MCP": mcp}):
        assert scrub_text(f"client sent {OLD_TOKEN}; expected {TOKEN}") == (
            "client sent [REDACTED]; expected [REDACTED]"
        )
        out = StringIO()
        call_command("rag_info", "--json", stdout=out)
    shown = json.loads(out.getvalue())["settings"]["MCP"]
    assert shown["TOKENS"] == ["[REDACTED]", "[REDACTED]"]
    assert TOKEN not in out.getvalue() and OLD_TOKEN not in out.getvalue()


def test_the_token_verifier_accepts_each_configured_token_and_nothing_else():
    pytest.importorskip("mcp", reason=NO_SDK)
    import anyio

    from django_rag.mcp.server import StaticTokens

    verifier = StaticTokens([TOKEN, OLD_TOKEN])

    def verify(token):
        return anyio.run(verifier.verify_token, token)

    assert verify(TOKEN).client_id == "MCP.TOKENS[0]"
    assert verify(OLD_TOKEN).client_id == "MCP.TOKENS[1]"
    for wrong in ("", TOKEN[:-1], TOKEN + "x", TOKEN.upper(), " " + TOKEN, "é" * 40):
        assert verify(wrong) is None


@pytest.mark.django_db
def test_the_command_refuses_a_remote_host_and_an_unconfigured_scope():
    mcp = {"COLLECTIONS": ["handbook"]}
    with override_settings(DJANGO_RAG={"EMBEDDER": "hashing", "MCP": mcp}):
        with pytest.raises(CommandError, match="not a loopback address.*MCP.TOKENS"):
            call_command("rag_mcp", "--transport", "http", "--host", "0.0.0.0")
    with override_settings(DJANGO_RAG={"EMBEDDER": "hashing"}):
        with pytest.raises(CommandError, match=r"MCP.COLLECTIONS"):
            call_command("rag_mcp", "--transport", "http")


@pytest.mark.django_db
def test_hostile_arguments_get_short_typed_errors():
    corpus()
    cfg = config(COLLECTIONS=["handbook"])
    many_keys = {f"k{i}" * 50: i for i in range(10_000)}
    cases = [
        (None, "query is required"),
        (["query"], "arguments must be an object"),
        ({"query": "refunds", **many_keys}, "unknown argument(s)"),
        ({"query": "refunds", "limit": True}, "limit must be an integer"),
        ({"query": "refunds", "limit": 2.5}, "limit must be an integer"),
        ({"query": "refunds", "limit": 0}, "limit must be from 1 to"),
        ({"query": "refunds", "mode": "psychic"}, "Unknown search mode"),
        ({"query": "refunds", "mode": ["hybrid"]}, "mode must be a string"),
        ({"query": "refunds", "collection": ["handbook"] * 21}, "from 1 to 20 collection"),
        ({"query": "refunds", "collection": []}, "from 1 to 20 collection"),
        ({"query": "refunds", "collection": [[["handbook"]]]}, "must be a string"),
        ({"query": "refunds", "collection": {"name": "handbook"}}, "a name or a list"),
        ({"query": "refunds", "collection": "x" * 10_000}, "more than the 255 allowed"),
        ({"query": "refunds", "source_id": 7}, "source_id must be a string"),
        ({"query": "bad \ud800 surrogate"}, "query"),
    ]
    for arguments, message in cases:
        result, is_error = call_tool("search", arguments, cfg)
        assert is_error, arguments
        assert message in result["error"]["message"], (message, result)
        assert len(result["error"]["message"]) < 600  # never echoes the hostile input back
        assert result["error"]["code"] in ("invalid_option", "invalid_search_mode", "invalid_text")


@pytest.mark.django_db
def test_search_scope_in_process_and_an_allowed_collection_not_created_yet():
    chunk = corpus()
    cfg = config(COLLECTIONS=["handbook", "later"])
    result, is_error = call_tool("search", {"query": "refunds payroll", "limit": 10}, cfg)
    assert not is_error
    assert [r["chunk_id"] for r in result["results"]] == [chunk.pk]
    result, is_error = call_tool("search", {"query": "x", "collection": "later"}, cfg)
    assert is_error and result["error"]["code"] == "unknown_collection"
    empty = config(COLLECTIONS=["later"])
    assert call_tool("search", {"query": "refunds"}, empty) == (
        {"query": "refunds", "results": []},
        False,
    )


@pytest.mark.django_db
def test_ingest_text_is_off_unless_configured_and_writes_only_where_allowed():
    corpus()
    read_only = config(COLLECTIONS=["handbook"])
    result, is_error = call_tool("ingest_text", {"text": "New fact."}, read_only)
    assert is_error and "offers search, ask" in result["error"]["message"]

    cfg = config(
        COLLECTIONS=["handbook", "notes"],
        TOOLS=["search", "ingest_text"],
        INGEST_COLLECTIONS=["notes"],
        MAX_INGEST_CHARS=1000,
    )
    stored, is_error = call_tool(
        "ingest_text", {"text": "The office closes at 18:00 on Fridays.", "title": "Hours"}, cfg
    )
    assert not is_error, stored
    document = Document.objects.get(pk=stored["document_id"])
    assert document.collection.name == "notes" and document.title == "Hours"
    assert document.metadata == {"ingested_by": "mcp"} and stored["chunks"] == 1
    found, _ = call_tool("search", {"query": "office Fridays", "collection": "notes"}, cfg)
    assert found["results"][0]["document_id"] == document.pk

    for arguments, code, message in [
        ({"text": "x", "collection": "handbook"}, "collection_not_allowed", "'handbook'"),
        ({"text": "x" * 1001}, "invalid_option", "more than the 1,000 allowed"),
        ({"text": "x", "source_id": "refunds"}, "invalid_option", "unknown argument"),
        ({"text": "x", "title": "t" * 501}, "invalid_option", "title has 501"),
        ({"text": ""}, "empty_document", ""),
    ]:
        result, is_error = call_tool("ingest_text", arguments, cfg)
        assert is_error and result["error"]["code"] == code, result
        assert message in result["error"]["message"]
    assert Document.objects.filter(collection__name="handbook").count() == 1


@pytest.mark.django_db
def test_an_unexpected_failure_is_logged_not_shown(monkeypatch, caplog):
    from django_rag.mcp import tools

    def broken(*args, **kwargs):
        raise RuntimeError("password=hunter2 at db-host")

    monkeypatch.setattr(tools, "search_service", broken)
    corpus()
    result, is_error = call_tool("search", {"query": "refunds"}, config(COLLECTIONS="*"))
    assert is_error and result["error"]["code"] == "internal_error"
    assert "hunter2" not in json.dumps(result)
    assert "hunter2" in caplog.text  # the server's log has it for the operator


def test_without_the_sdk_the_command_says_which_extra_to_install(monkeypatch):
    from django_rag.mcp.server import build_server

    for name in ("mcp", "mcp.server", "mcp_types", "anyio"):
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(MissingDependency, match=r"django-rag\[mcp\]"):
        build_server(config(COLLECTIONS="*"))


@pytest.mark.django_db
def test_ask_without_an_llm_is_a_typed_error_and_search_still_works():
    corpus()
    cfg = config(COLLECTIONS=["handbook"])
    with override_settings(DJANGO_RAG={"EMBEDDER": "hashing"}):
        result, is_error = call_tool("ask", {"question": "How long do refunds take?"}, cfg)
        assert is_error and result["error"]["code"] == "llm_not_configured"
        found, is_error = call_tool("search", {"query": "refunds"}, cfg)
        assert not is_error and found["results"][0]["collection"] == "handbook"


@pytest.mark.django_db
def test_ask_in_process_with_the_scripted_llm_cites_only_allowed_chunks():
    from django_rag.testing import ScriptedLLM

    chunk = corpus()
    llm = ScriptedLLM("Within 14 days [1].")
    cfg = config(COLLECTIONS=["handbook"])
    with override_settings(DJANGO_RAG={"EMBEDDER": "hashing", "LLM": llm}):
        result, is_error = call_tool("ask", {"question": "refunds payroll", "limit": 5}, cfg)
    assert not is_error, result
    assert [c["chunk_id"] for c in result["citations"]] == [chunk.pk]
    assert [s["collection"] for s in result["sources"]] == ["handbook"]
    assert "confidential" not in llm.calls[0]["prompt"]


@pytest.mark.django_db
def test_ingest_text_sent_twice_is_stored_once():
    cfg = config(
        COLLECTIONS=["notes"], TOOLS=["search", "ingest_text"], INGEST_COLLECTIONS=["notes"]
    )
    first, _ = call_tool("ingest_text", {"text": "Parking is behind building B."}, cfg)
    again, is_error = call_tool("ingest_text", {"text": "Parking is behind building B."}, cfg)
    assert not is_error and again["document_id"] == first["document_id"]
    assert again["deduplicated"] is True and first["deduplicated"] is False
    assert Document.objects.filter(collection__name="notes").count() == 1


@pytest.mark.django_db
def test_the_command_runs_the_system_checks_and_reports_them_on_stderr():
    """The checks run before serving (their report on stderr; on stdio, stdout is the
    protocol's and stays empty)."""
    from io import StringIO

    from django.core import checks

    def warn(app_configs, **kwargs):
        return [checks.Warning("a warning for rag_mcp", id="tests.W999")]

    checks.register(warn)
    out, err = StringIO(), StringIO()
    try:
        with override_settings(DJANGO_RAG={"EMBEDDER": "hashing"}):
            with pytest.raises(CommandError, match=r"MCP.COLLECTIONS"):
                call_command("rag_mcp", "--transport", "http", stdout=out, stderr=err)
    finally:
        checks.registry.registry.registered_checks.discard(warn)
    assert out.getvalue() == ""
    assert "tests.W999" in err.getvalue()
