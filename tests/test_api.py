"""The HTTP API through a live server and a real HTTP client; litellm talks over HTTP to the
stub OpenAI server. Conversations, SSE (including a cut upstream stream), auth and scope
negatives, rate limits and budgets, uploads through the job path, the OpenAPI file."""

import json

import pytest

pytest.importorskip("ninja", reason="the API needs the 'api' extra (django-ninja)")

import requests  # noqa: E402
from django.contrib.auth.models import User  # noqa: E402
from django.core.cache import cache  # noqa: E402
from django.test import Client  # noqa: E402

import django_rag as rag  # noqa: E402
from django_rag.models import Chunk, Conversation, Document, Message  # noqa: E402
from django_rag.testing import ScriptedLLM  # noqa: E402
from tests.conftest import stub_llm  # noqa: E402
from tests.stub_openai import Drop  # noqa: E402

pytestmark = pytest.mark.django_db(transaction=True)

CSRF = "a" * 32
CURIE = "Marie Curie won the Nobel Prize in Chemistry in 1911 for discovering radium."
EIFFEL = "The Eiffel Tower was finished in 1889 for the World's Fair in Paris."
SECRET = "Bob's private plan: the launch moves to March."


def tenant_scope(user):
    return {"alice": ["help"], "bob": ["bob-docs"]}.get(user.get_username(), [])


def token_user(request):
    header = request.headers.get("Authorization", "")
    if header == "Bearer alice-token":
        return User.objects.get(username="alice")
    return None


@pytest.fixture
def site(live_server, settings, stub_llm_server):
    cache.clear()
    settings.DJANGO_RAG = {
        "EMBEDDER": "hashing",
        "LLM": stub_llm(stub_llm_server),
        "DASHBOARD": {"COLLECTIONS": "tests.test_api.tenant_scope"},
        "API": {"RATE_LIMIT": 1000, "AUTHENTICATE": "tests.test_api.token_user"},
    }
    rag.ingest(CURIE, collection="help", source_id="curie", title="Marie Curie")
    rag.ingest(EIFFEL, collection="help", source_id="eiffel", title="Eiffel Tower")
    rag.ingest(SECRET, collection="bob-docs", source_id="plan", title="Plan")
    live_server.stub = stub_llm_server
    live_server.api = live_server.url + "/rag/api"
    yield live_server
    cache.clear()


def login(site, client, username, *, staff=False):
    user = User.objects.create_user(username, password="pw", is_staff=staff)
    own = Client()  # one per user: logging one in must not end another's session
    own.force_login(user)
    session = requests.Session()
    session.cookies.set("sessionid", own.cookies["sessionid"].value)
    session.cookies.set("csrftoken", CSRF)
    session.headers["X-CSRFToken"] = CSRF
    return session


def events(response):
    """The SSE frames of a streamed response, parsed as a browser's EventSource would."""
    assert response.headers["Content-Type"].startswith("text/event-stream")
    parsed, name, data = [], "message", []
    for line in response.iter_lines(decode_unicode=True):
        if line == "":
            if data:
                parsed.append((name, json.loads("\n".join(data))))
            name, data = "message", []
        elif line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].strip())
    return parsed


def test_a_three_turn_conversation_condenses_the_follow_up_and_cites_the_chunk(site, client):
    alice = login(site, client, "alice")
    site.stub.rules = {
        "<latest>\nWhen did she win it?": "When did Marie Curie win the Nobel Prize in Chemistry",
        "<latest>\nFor what?": "What did Marie Curie win the Nobel Prize for",
    }
    site.stub.chat = [
        "Marie Curie was a chemist [1].",
        "She won it in 1911 [1].",
        "For discovering radium [1].",
    ]
    created = alice.post(site.api + "/conversations", json={"title": "Curie"})
    assert created.status_code == 201, created.text
    conv = created.json()["id"]
    assert created.json()["collections"] is None

    url = f"{site.api}/conversations/{conv}/messages"
    first = alice.post(url, json={"message": "Who was Marie Curie?", "limit": 1})
    assert first.status_code == 200, first.text
    assert first.json()["condensed"] is False

    with alice.post(
        url, json={"message": "When did she win it?", "limit": 1, "stream": True}, stream=True
    ) as response:
        assert response.status_code == 200
        frames = events(response)
    names = [name for name, _ in frames]
    assert names[0] == "meta" and names[-1] == "done" and "token" in names
    meta, done = frames[0][1], frames[-1][1]
    assert meta["condensed"] is True
    assert meta["query"] == "When did Marie Curie win the Nobel Prize in Chemistry"
    assert "".join(d["text"] for n, d in frames if n == "token") == "She won it in 1911 [1]."
    assert [c["source_id"] for c in done["citations"]] == ["curie"]
    curie = Chunk.objects.get(document__source_id="curie")
    assert done["citations"][0]["chunk_id"] == curie.pk
    assert done["usage"]["total_tokens"] > 0

    third = alice.post(url, json={"message": "For what?", "limit": 1})
    assert third.json()["query"] == "What did Marie Curie win the Nobel Prize for"
    # The condensing request went over HTTP with the first turns in it.
    condense_request = [
        r for r in site.stub.chat_requests if "When did she win it?" in json.dumps(r["body"])
    ][0]
    assert "Who was Marie Curie?" in json.dumps(condense_request["body"])

    detail = alice.get(f"{site.api}/conversations/{conv}").json()
    assert [m["role"] for m in detail["messages"]] == ["user", "assistant"] * 3
    assert detail["messages"][3]["query"] == meta["query"]
    assert detail["messages"][3]["citations"][0]["chunk_id"] == curie.pk
    listed = alice.get(site.api + "/conversations").json()["conversations"]
    assert [c["id"] for c in listed] == [conv]


def test_a_cut_upstream_stream_is_an_error_event_and_stores_nothing(site, client):
    alice = login(site, client, "alice")
    site.stub.rules = {"Eiffel": Drop("The tower was finished in 1889 [1].", after=3)}
    conv = alice.post(site.api + "/conversations", json={}).json()["id"]
    url = f"{site.api}/conversations/{conv}/messages"
    with alice.post(
        url, json={"message": "When was the Eiffel Tower built?", "stream": True}, stream=True
    ) as response:
        frames = events(response)
    names = [name for name, _ in frames]
    assert names[-1] == "error" and "done" not in names
    assert frames[-1][1]["code"] == "llm_stream_incomplete"
    assert Message.objects.filter(conversation_id=conv).count() == 0

    with alice.post(
        site.api + "/ask", json={"question": "Eiffel Tower?", "stream": True}, stream=True
    ) as response:
        frames = events(response)
    assert [n for n, _ in frames][-1] == "error"


def test_ask_answers_as_json_and_as_events(site, client):
    alice = login(site, client, "alice")
    site.stub.chat = ["Radium [1].", "Radium again [1]."]
    plain = alice.post(site.api + "/ask", json={"question": "What did Curie discover?"})
    assert plain.status_code == 200, plain.text
    assert plain.json()["citations"][0]["source_id"] == "curie"
    with alice.post(
        site.api + "/ask",
        json={"question": "What did Curie discover?", "stream": True},
        stream=True,
    ) as response:
        frames = events(response)
    assert frames[-1][0] == "done" and frames[-1][1]["text"] == "Radium again [1]."
    hits = alice.post(site.api + "/search", json={"query": "radium", "limit": 2}).json()
    assert {h["collection"] for h in hits["results"]} == {"help"}


def test_auth_and_scope_negatives_answer_401_403_404_never_500(site, client):
    alice = login(site, client, "alice")
    bob = login(site, client, "bob")
    anonymous = requests.Session()
    site.stub.default = "Answer [1]."
    for method, path, body in (
        ("post", "/search", {"query": "x"}),
        ("post", "/ask", {"question": "x"}),
        ("get", "/conversations", None),
        ("post", "/conversations", {}),
        ("get", "/collections", None),
        ("get", "/documents", None),
    ):
        response = getattr(anonymous, method)(site.api + path, json=body)
        assert response.status_code == 401, (path, response.text)
        assert response.json()["error"]["code"] == "not_authenticated"

    conv = alice.post(site.api + "/conversations", json={}).json()["id"]
    assert bob.get(f"{site.api}/conversations/{conv}").status_code == 404
    stolen = bob.post(f"{site.api}/conversations/{conv}/messages", json={"message": "hi"})
    assert stolen.status_code == 404 and stolen.json()["error"]["code"] == "conversation_not_found"
    assert bob.get(f"{site.api}/conversations/99999999999999999999").status_code in (400, 404)

    # Another tenant's collection is reported as unknown; a forged chunk id as missing.
    other = alice.post(site.api + "/search", json={"query": "launch", "collection": "bob-docs"})
    assert other.status_code == 404 and other.json()["error"]["code"] == "unknown_collection"
    hits = alice.post(site.api + "/search", json={"query": "launch March plan"}).json()
    assert all(h["collection"] == "help" for h in hits["results"])
    secret_chunk = Chunk.objects.get(document__source_id="plan")
    assert alice.get(f"{site.api}/chunks/{secret_chunk.pk}").status_code == 404
    assert bob.get(f"{site.api}/chunks/{secret_chunk.pk}").json()["text"] == SECRET
    secret_doc = Document.objects.get(source_id="plan")
    assert alice.get(f"{site.api}/documents/{secret_doc.pk}").status_code == 404
    assert alice.delete(f"{site.api}/documents/{secret_doc.pk}").status_code == 403
    scoped = alice.post(site.api + "/conversations", json={"collection": "bob-docs"})
    assert scoped.status_code == 404
    names = [c["name"] for c in alice.get(site.api + "/collections").json()["collections"]]
    assert names == ["help"]

    # Session requests that change something need the CSRF token.
    no_csrf = requests.Session()
    no_csrf.cookies.set("sessionid", alice.cookies["sessionid"])
    refused = no_csrf.post(site.api + "/search", json={"query": "x"})
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "csrf_failed"

    # Bad bodies are 400s and 413s with codes.
    broken = alice.post(
        site.api + "/search", data="{not json", headers={"Content-Type": "application/json"}
    )
    assert broken.status_code == 400
    assert alice.post(site.api + "/search", json={"query": ""}).json()["error"]["code"] == (
        "invalid_input"
    )
    huge = alice.post(site.api + "/search", json={"query": "x" * 70_000})
    assert huge.status_code == 413 and huge.json()["error"]["code"] == "request_too_large"


def test_the_token_hook_authenticates_without_csrf(site, client):
    User.objects.create_user("alice")
    plain = requests.Session()
    response = plain.post(
        site.api + "/search",
        json={"query": "radium"},
        headers={"Authorization": "Bearer alice-token"},
    )
    assert response.status_code == 200, response.text
    wrong = plain.post(
        site.api + "/search", json={"query": "radium"}, headers={"Authorization": "Bearer nope"}
    )
    assert wrong.status_code == 401


def test_rate_limit_and_token_budget_answer_429(site, client, settings):
    alice = login(site, client, "alice")
    settings.DJANGO_RAG = {**settings.DJANGO_RAG, "API": {"RATE_LIMIT": 3}}
    codes = [alice.post(site.api + "/search", json={"query": "x"}).status_code for _ in range(4)]
    assert codes == [200, 200, 200, 429]
    limited = alice.post(site.api + "/search", json={"query": "x"})
    assert limited.json()["error"]["code"] == "rate_limited"
    assert int(limited.headers["Retry-After"]) >= 1

    cache.clear()
    settings.DJANGO_RAG = {**settings.DJANGO_RAG, "API": {"TOKEN_BUDGET": 10}}
    site.stub.default = "A long enough answer to spend the whole budget at once [1]."
    first = alice.post(site.api + "/ask", json={"question": "Curie?"})
    assert first.status_code == 200
    spent = alice.post(site.api + "/ask", json={"question": "Curie?"})
    assert spent.status_code == 429
    assert spent.json()["error"]["code"] == "token_budget_exceeded"
    # Search costs no tokens: still allowed.
    assert alice.post(site.api + "/search", json={"query": "x"}).status_code == 200


def test_uploads_go_through_the_job_path_and_documents_can_be_deleted(site, client):
    staff = login(site, client, "alice", staff=True)
    response = staff.post(
        site.api + "/documents",
        files={"file": ("refunds.md", b"# Refunds\n\nRefunds take 14 days.")},
        data={"collection": "help"},
    )
    assert response.status_code == 202, response.text
    body = response.json()
    assert body["job"] is not None and body["collection"] == "help"
    doc = Document.objects.get(pk=body["id"])
    assert doc.status == Document.Status.COMPLETED  # the suite runs jobs inline
    listed = staff.get(site.api + "/documents", params={"collection": "help"}).json()
    assert body["id"] in [d["id"] for d in listed["documents"]]
    bad = staff.post(
        site.api + "/documents",
        files={"file": ("evil.exe", b"MZ")},
        data={"collection": "help"},
    )
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "unsupported_file_type"
    outside = staff.post(
        site.api + "/documents", files={"file": ("a.txt", b"x")}, data={"collection": "bob-docs"}
    )
    assert outside.status_code == 404
    assert staff.delete(f"{site.api}/documents/{body['id']}").status_code == 204
    assert not Document.objects.filter(pk=body["id"]).exists()


def test_anonymous_chat_is_kept_per_session_when_allowed(site, settings):
    settings.DJANGO_RAG = {
        **settings.DJANGO_RAG,
        "API": {"ANONYMOUS": True, "READ_ALL": "anyone"},
        "DASHBOARD": {},
    }
    site.stub.default = "Paris [1]."
    visitor = requests.Session()
    visitor.cookies.set("csrftoken", CSRF)
    visitor.headers["X-CSRFToken"] = CSRF
    conv = visitor.post(site.api + "/conversations", json={})
    assert conv.status_code == 201, conv.text
    reply = visitor.post(
        f"{site.api}/conversations/{conv.json()['id']}/messages",
        json={"message": "Where is the Eiffel Tower?"},
    )
    assert reply.status_code == 200, reply.text
    stored = Conversation.objects.get(pk=conv.json()["id"])
    assert stored.owner is None and stored.session_key
    stranger = requests.Session()
    assert stranger.get(f"{site.api}/conversations/{stored.pk}").status_code == 404
    assert visitor.get(site.api + "/documents").status_code == 401  # documents need a login

    # Anonymous limits count per address: dropping the session cookie buys no fresh limit.
    cache.clear()
    settings.DJANGO_RAG = {
        **settings.DJANGO_RAG,
        "API": {"ANONYMOUS": True, "READ_ALL": "anyone", "RATE_LIMIT": 2},
    }
    codes = []
    for _ in range(3):
        fresh = requests.Session()
        codes.append(fresh.get(site.api + "/conversations").status_code)
    assert codes == [200, 200, 429]


# --- the default scope (issue 34): closed without DASHBOARD["COLLECTIONS"] --------------------


def no_collection(user):
    return []


@pytest.fixture
def unscoped(settings):
    """No scope function: the API's default decides who reads what."""
    cache.clear()
    settings.DJANGO_RAG = {
        "EMBEDDER": "hashing",
        "LLM": ScriptedLLM(default="Radium [1]."),
        "API": {"RATE_LIMIT": None, "ANONYMOUS": True},
    }
    rag.ingest(CURIE, collection="help", source_id="curie", title="Marie Curie")
    yield settings
    cache.clear()


def caller(username=None, *, staff=False):
    client = Client()
    if username is not None:
        client.force_login(User.objects.create_user(username, is_staff=staff))
    return client


def post(client, path, body):
    return client.post("/rag/api" + path, body, content_type="application/json")


def reads(client) -> bool:
    """Whether the caller reads the 'help' collection (a search finds it)."""
    response = post(client, "/search", {"query": "radium"})
    if response.status_code == 403:
        assert response.json()["error"]["code"] == "permission_denied"
        return False
    assert response.status_code == 200, response.content
    return [h["collection"] for h in response.json()["results"]] == ["help"]


def test_without_a_scope_a_user_who_is_not_staff_reads_nothing(unscoped):
    reader = caller("reader")
    doc, chunk = Document.objects.get(), Chunk.objects.get()
    assert not reads(reader)
    named = post(reader, "/search", {"query": "radium", "collection": "help"})
    assert named.status_code == 404 and named.json()["error"]["code"] == "unknown_collection"
    assert post(reader, "/ask", {"question": "Who discovered radium?"}).status_code == 403
    assert reader.get("/rag/api/collections").json() == {"collections": []}
    assert reader.get("/rag/api/documents").json() == {"documents": []}
    assert reader.get(f"/rag/api/documents/{doc.pk}").status_code == 404
    assert reader.get(f"/rag/api/chunks/{chunk.pk}").status_code == 404
    # Their own conversation may be started, but a turn has nothing to search.
    conv = post(reader, "/conversations", {})
    assert conv.status_code == 201
    turn = post(reader, f"/conversations/{conv.json()['id']}/messages", {"message": "radium?"})
    assert turn.status_code == 403
    # An allowed anonymous visitor reads nothing either; staff read everything, as before.
    assert not reads(caller())
    assert caller().get(f"/rag/api/chunks/{chunk.pk}").status_code == 404
    boss = caller("boss", staff=True)
    assert reads(boss)
    assert [c["name"] for c in boss.get("/rag/api/collections").json()["collections"]] == ["help"]
    assert boss.get(f"/rag/api/chunks/{chunk.pk}").json()["source_id"] == "curie"


@pytest.mark.parametrize(
    ("read_all", "staff", "reader", "anonymous"),
    [
        (None, True, False, False),
        ("staff", True, False, False),
        ("authenticated", True, True, False),
        ("anyone", True, True, True),
    ],
)
def test_read_all_says_who_reads_every_collection(unscoped, read_all, staff, reader, anonymous):
    api = {**unscoped.DJANGO_RAG["API"], "READ_ALL": read_all}
    unscoped.DJANGO_RAG = {**unscoped.DJANGO_RAG, "API": api}
    assert reads(caller("boss", staff=True)) is staff
    assert reads(caller("reader")) is reader
    assert reads(caller()) is anonymous


def test_a_scope_function_decides_for_everyone_whatever_read_all_says(unscoped):
    unscoped.DJANGO_RAG = {
        **unscoped.DJANGO_RAG,
        "API": {"RATE_LIMIT": None, "READ_ALL": "anyone"},
        "DASHBOARD": {"COLLECTIONS": "tests.test_api.no_collection"},
    }
    assert not reads(caller("boss", staff=True))
    assert not reads(caller("reader"))


def test_an_inactive_staff_user_from_a_token_hook_reads_nothing(unscoped, settings):
    user = User.objects.create_user("alice", is_staff=True, is_active=False)
    api = {**unscoped.DJANGO_RAG["API"], "AUTHENTICATE": "tests.test_api.token_user"}
    unscoped.DJANGO_RAG = {**unscoped.DJANGO_RAG, "API": api}
    response = Client().post(
        "/rag/api/search",
        {"query": "radium"},
        content_type="application/json",
        HTTP_AUTHORIZATION="Bearer alice-token",
    )
    assert user.is_staff and response.status_code == 403


def test_the_openapi_description_lists_every_endpoint(site):
    schema = requests.get(site.api + "/openapi.json").json()
    assert schema["info"]["title"] == "django_rag"
    for path in (
        "/search",
        "/ask",
        "/conversations",
        "/conversations/{conversation_id}/messages",
        "/documents",
        "/documents/{document_id}",
        "/collections",
        "/chunks/{chunk_id}",
    ):
        assert "/rag/api" + path in schema["paths"]


def test_the_openapi_description_names_the_session_csrf_and_token_schemes(site):
    schema = requests.get(site.api + "/openapi.json").json()
    schemes = schema["components"]["securitySchemes"]
    assert schemes["session"] == {
        "type": "apiKey",
        "in": "cookie",
        "name": "sessionid",
        "description": schemes["session"]["description"],
    }
    assert (schemes["csrf"]["in"], schemes["csrf"]["name"]) == ("header", "X-CSRFToken")
    assert (schemes["token"]["type"], schemes["token"]["scheme"]) == ("http", "bearer")
    paths = schema["paths"]
    # Reads: the token, or the session alone. Writes: the token, or the session with the header.
    assert paths["/rag/api/documents"]["get"]["security"] == [{"token": []}, {"session": []}]
    assert paths["/rag/api/documents"]["post"]["security"] == [
        {"token": []},
        {"session": [], "csrf": []},
    ]
    assert paths["/rag/api/documents/{document_id}"]["delete"]["security"] == [
        {"token": []},
        {"session": [], "csrf": []},
    ]
    for path, methods in paths.items():
        for method, operation in methods.items():
            assert operation["security"], f"{method} {path} says nothing about authentication"


class KeyHook:
    """A hook that declares its own scheme, as django-ninja's auth classes do."""

    openapi_security_schema = {"type": "apiKey", "in": "header", "name": "X-API-Key"}

    def __call__(self, request):
        return None


def test_without_a_hook_only_the_session_is_described_and_anonymous_use_shows(client, settings):
    settings.DJANGO_RAG = {"EMBEDDER": "hashing", "API": {"ANONYMOUS": True}}
    schema = client.get("/rag/api/openapi.json").json()
    assert set(schema["components"]["securitySchemes"]) == {"session", "csrf"}
    paths = schema["paths"]
    assert paths["/rag/api/search"]["post"]["security"] == [
        {"session": [], "csrf": []},
        {"csrf": []},  # an anonymous visitor still sends the CSRF header
    ]
    assert paths["/rag/api/conversations"]["get"]["security"] == [{"session": []}, {}]
    # Listing documents always needs a login, anonymous use or not.
    assert paths["/rag/api/documents"]["get"]["security"] == [{"session": []}]

    settings.DJANGO_RAG = {"EMBEDDER": "hashing", "API": {"AUTHENTICATE": KeyHook()}}
    schema = client.get("/rag/api/openapi.json").json()
    assert schema["components"]["securitySchemes"]["token"] == KeyHook.openapi_security_schema
    assert schema["paths"]["/rag/api/conversations"]["get"]["security"] == [
        {"token": []},
        {"session": []},
    ]


@pytest.mark.django_db
def test_the_documented_api_key_hook_works_as_written(settings, monkeypatch):
    """docs/api.md's ready-made key hook, run from the page: a listed key acts as its user
    (no CSRF token needed), an unknown or missing key is anonymous (401)."""
    import re
    import types
    from pathlib import Path

    page = (Path(__file__).parent.parent / "docs" / "api.md").read_text()
    block = re.search(
        r"<!-- tests/test_api.py runs this block -->\n```python\n(.*?)```", page, re.S
    ).group(1)
    module = types.ModuleType("rag_keys")
    exec(compile(block, "docs/api.md", "exec"), module.__dict__)
    User.objects.create_user("alice", password="pw", is_staff=True)
    rag.ingest("Refunds take 14 days.", collection="help")
    monkeypatch.setenv("RAG_API_KEYS", "k-other:nobody, k-alice-123:alice")
    settings.DJANGO_RAG = {
        "EMBEDDER": "hashing",
        "API": {"READ_ALL": "staff", "AUTHENTICATE": module.api_key_user},
    }
    client = Client(enforce_csrf_checks=True)  # a key needs no CSRF token

    def search(key):
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return client.post(
            "/rag/api/search",
            {"query": "refunds", "mode": "fulltext"},
            content_type="application/json",
            headers=headers,
        )

    found = search("k-alice-123")
    assert found.status_code == 200, found.content
    assert "Refunds take 14 days." in found.content.decode()
    for key in ("k-alice-12", "k-other", None):  # a prefix, a key of no user, none
        assert search(key).status_code == 401
