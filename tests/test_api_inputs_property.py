"""Every API input, any value: property-based (hypothesis) requests through the Django test
client against the real database. Any string (unpaired surrogates, NUL and control characters
included, sent as the raw UTF-8 bytes a hostile client would send) or any integer (far past
bigint) in any query, path, JSON or form parameter of every endpoint gets a 2xx or a 4xx with
the API's JSON error, never a 500 and never a stream ending in ``internal_error`` (issue 34)."""

import json
from urllib.parse import quote

import pytest

pytest.importorskip("ninja", reason="the API needs the 'api' extra (django-ninja)")

from django.contrib.auth.models import User  # noqa: E402
from django.core.cache import cache  # noqa: E402
from django.test import Client  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import django_rag as rag  # noqa: E402
from django_rag.models import Conversation, Document  # noqa: E402
from django_rag.testing import ScriptedLLM  # noqa: E402

pytestmark = pytest.mark.django_db(transaction=True)

API = "/rag/api"
PROPERTY = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# Any text: surrogates (Cs), NUL and every other control character included.
TEXT = st.text(max_size=300)
# What broke before (issue 34), and its neighbours, drawn often rather than by chance.
HOSTILE = st.sampled_from(
    [
        "\x00",
        "help\x00",
        "a\x01b",
        "\t",
        "x\n",
        "\x7f",
        "\x85",
        "\ud800",
        "a\udc80",
        "",
        " ",
        "\u200b",
    ]
)
NAMES = st.one_of(HOSTILE, TEXT, st.sampled_from(["help", "bob-docs"]))
INTEGERS = st.one_of(
    st.integers(),
    st.integers(min_value=2**62, max_value=2**70),
    st.sampled_from([0, -1, 1, 2**63 - 1, 2**63, 2**64, 10**30]),
)
JSON_SCALARS = st.one_of(
    TEXT, INTEGERS, st.none(), st.booleans(), st.floats(allow_nan=True, allow_infinity=True)
)
ANY_JSON = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=12,
)
# A value for one parameter: mostly a string or an integer, sometimes any JSON.
VALUE = st.one_of(HOSTILE, NAMES, INTEGERS, ANY_JSON, st.lists(NAMES, max_size=4))
# A query-string or path value: text, or an integer written out.
RAW = st.one_of(HOSTILE, NAMES, INTEGERS.map(str))


def tenant_scope(user):
    if user.is_staff:
        return None  # every collection: names reach the database unfiltered by the scope
    return {"tenant": ["help"]}.get(user.get_username(), [])


def raw(value: str) -> str:
    """Percent-encoded UTF-8, surrogates as the invalid bytes a client can send."""
    return quote(value.encode("utf-8", "surrogatepass"), safe="")


@pytest.fixture
def callers(settings):
    """Three callers: staff (no scope: every name reaches the database), a scoped tenant, and
    an anonymous visitor; plus documents, a chunk and a conversation to aim ids at."""
    cache.clear()
    settings.DJANGO_RAG = {
        "EMBEDDER": "hashing",
        "LLM": ScriptedLLM(default="Radium [1]."),
        "DASHBOARD": {"COLLECTIONS": "tests.test_api_inputs_property.tenant_scope"},
        "API": {"RATE_LIMIT": None, "TOKEN_BUDGET": None, "ANONYMOUS": True},
    }
    rag.ingest("Marie Curie discovered radium.", collection="help", source_id="curie")
    rag.ingest("Bob's private plan.", collection="bob-docs", source_id="plan")
    clients = {}
    for name, staff in (("staff", True), ("tenant", False)):
        client = Client(raise_request_exception=False)
        client.force_login(User.objects.create_user(name, is_staff=staff))
        clients[name] = client
    clients["anonymous"] = Client(raise_request_exception=False)
    conv = Conversation.objects.create(owner=User.objects.get(username="staff"))
    yield clients, conv
    cache.clear()


def check(response):
    """2xx or 4xx, never 5xx; an error is the API's JSON (or Django's own 404 for a path that
    matches no endpoint); a stream never ends in internal_error."""
    assert response.status_code < 500, response.content[:500]
    if getattr(response, "streaming", False):
        body = b"".join(response.streaming_content)
        assert b"internal_error" not in body, body[-500:]
        return
    if response.status_code >= 400:
        if response["Content-Type"].startswith("application/json"):
            error = response.json()["error"]
            assert error["code"] and error["message"]
        else:
            assert response.status_code == 404  # the URL resolver: no endpoint at that path


def body_of(data, required, optional):
    """A JSON body: usually an object with the endpoint's keys (each any value), sometimes any
    JSON value at all, or bytes that are not JSON."""
    shape = data.draw(st.sampled_from(["fields"] * 4 + ["json", "bytes"]))
    if shape == "json":
        return json.dumps(data.draw(ANY_JSON, label="json"))
    if shape == "bytes":
        return data.draw(st.binary(max_size=200), label="bytes")
    fields = data.draw(
        st.fixed_dictionaries(
            {key: st.one_of(NAMES, VALUE) for key in required},
            optional={key: VALUE for key in optional},
        ),
        label="fields",
    )
    return json.dumps(fields)  # ensure_ascii: a lone surrogate travels as "\ud800"


@PROPERTY
@given(data=st.data())
def test_search_and_ask_bodies_never_answer_500(callers, data):
    clients, _ = callers
    path, text = data.draw(st.sampled_from([("/search", "query"), ("/ask", "question")]))
    body = body_of(data, [text], ["collection", "mode", "limit", "stream"])
    for client in clients.values():
        check(client.post(API + path, body, content_type="application/json"))


@PROPERTY
@given(data=st.data())
def test_conversation_bodies_never_answer_500(callers, data):
    clients, conv = callers
    created = body_of(data, [], ["title", "collection"])
    # A message to a conversation that exists (the staff caller's own) or not (the others').
    message = body_of(data, ["message"], ["mode", "limit", "stream"])
    renamed = body_of(data, ["title"], [])
    path = f"{API}/conversations/{conv.pk}/messages"
    for client in clients.values():
        check(client.post(API + "/conversations", created, content_type="application/json"))
        check(client.post(path, message, content_type="application/json"))
        check(
            client.patch(f"{API}/conversations/{conv.pk}", renamed, content_type="application/json")
        )


@PROPERTY
@given(data=st.data())
def test_listing_parameters_never_answer_500(callers, data):
    clients, _ = callers
    path = data.draw(st.sampled_from(["/documents", "/conversations", "/collections"]))
    params = data.draw(
        st.dictionaries(
            st.one_of(st.sampled_from(["collection", "offset", "limit"]), TEXT), RAW, max_size=4
        ),
        label="params",
    )
    query = "&".join(f"{raw(key)}={raw(value)}" for key, value in params.items())
    for client in clients.values():
        check(client.get(f"{API}{path}?{query}"))


@pytest.fixture
def existing_ids(callers):
    """Ids of rows that exist when the test starts (read once: a DELETE may remove one, which
    is then a 404), and the largest id a bigint holds."""
    _, conv = callers
    document = Document.objects.order_by("pk").first()
    return [conv.pk, document.pk, document.chunks.first().pk, 2**63 - 1]


@PROPERTY
@given(data=st.data())
def test_path_ids_never_answer_500(callers, existing_ids, data):
    clients, _ = callers
    value = data.draw(st.one_of(RAW, st.sampled_from(existing_ids).map(str)), label="id")
    method, template = data.draw(
        st.sampled_from(
            [
                ("get", "/documents/{}"),
                ("delete", "/documents/{}"),
                ("get", "/chunks/{}"),
                ("get", "/conversations/{}"),
                ("post", "/conversations/{}/messages"),
                ("patch", "/conversations/{}"),
            ]
        )
    )
    path = API + template.format(raw(value))
    for client in clients.values():
        if method == "post":
            response = client.post(path, {"message": "radium?"}, content_type="application/json")
        elif method == "patch":
            response = client.patch(path, {"title": "Radium"}, content_type="application/json")
        else:
            response = getattr(client, method)(path)
        check(response)


def multipart(fields: dict, filename: str, content: bytes) -> tuple[bytes, str]:
    """A multipart body written by hand: the test client would refuse to encode surrogates,
    which a hostile client sends as raw bytes."""
    boundary = "hypothesis-boundary-7d1f"
    parts = []
    for name, value in fields.items():
        parts.append(
            f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n'.encode()
            + value.encode("utf-8", "surrogatepass")
            + b"\r\n"
        )
    safe_name = filename.replace('"', "").replace("\r", "").replace("\n", "")
    parts.append(
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="'.encode()
        + safe_name.encode("utf-8", "surrogatepass")
        + b'"\r\nContent-Type: application/octet-stream\r\n\r\n'
        + content
        + b"\r\n"
    )
    parts.append(f"--{boundary}--\r\n".encode())
    return b"".join(parts), f"multipart/form-data; boundary={boundary}"


@PROPERTY
@given(data=st.data())
def test_upload_form_fields_never_answer_500(callers, data):
    clients, _ = callers
    fields = data.draw(
        st.fixed_dictionaries(
            {"collection": RAW},
            optional={"source_id": RAW, "replace": st.one_of(RAW, st.sampled_from(["true"]))},
        ),
        label="form",
    )
    filename = data.draw(st.one_of(TEXT, st.sampled_from(["notes.txt", "a.md"])), label="name")
    content = data.draw(st.one_of(st.binary(max_size=100), st.just(b"Refunds take 14 days.")))
    body, content_type = multipart(fields, filename, content)
    for client in clients.values():
        check(client.post(API + "/documents", body, content_type=content_type))


def test_the_examples_of_issue_34_are_400_with_codes(callers):
    clients, _ = callers
    staff = clients["staff"]
    for path in (
        "/documents?offset=9223372036854775808",
        "/conversations?offset=9223372036854775808",
        "/documents?collection=%00",
        "/documents?collection=a%01b",
        "/documents/0",
        "/chunks/99999999999999999999",
    ):
        response = staff.get(API + path)
        assert response.status_code == 400, (path, response.content)
        assert response.json()["error"]["code"] == "invalid_input"
    for body in ({"title": "a\x00"}, {"title": "a\nb"}, {"collection": ["help", "x\x1b"]}):
        response = staff.post(API + "/conversations", body, content_type="application/json")
        assert response.status_code == 400, (body, response.content)
        assert response.json()["error"]["code"] == "invalid_input"
    response = staff.post(
        API + "/search",
        {"query": "radium", "collection": ["help"] * 101},
        content_type="application/json",
    )
    assert response.status_code == 400 and "at most 100" in response.json()["error"]["message"]
    # In range: the listing is empty, not an error.
    assert staff.get(API + "/documents?offset=1000000000").json() == {"documents": []}


def test_a_condenser_reply_with_a_lone_surrogate_falls_back_through_the_api(callers, settings):
    clients, conv = callers
    staff = clients["staff"]
    condenser = ScriptedLLM("\ud800")
    settings.DJANGO_RAG = {**settings.DJANGO_RAG, "CHAT": {"LLM": condenser}}
    url = f"{API}/conversations/{conv.pk}/messages"
    first = staff.post(url, {"message": "Who discovered radium?"}, content_type="application/json")
    assert first.status_code == 200, first.content
    second = staff.post(url, {"message": "When?"}, content_type="application/json")
    assert second.status_code == 200, second.content
    assert len(condenser.calls) == 1
    assert second.json()["condensed"] is False and second.json()["query"] == "When?"
