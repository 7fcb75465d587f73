"""What a site visitor reads when an answer fails (issue 36): a short, translatable text, never
the provider, the model, an exception class or a setting; the details go to the log, and
active staff still get them in the response. Through the Django test client, with litellm
talking over HTTP to the stub OpenAI server."""

import json
import logging

import pytest

pytest.importorskip("ninja", reason="the API needs the 'api' extra (django-ninja)")

from django.contrib.auth.models import User  # noqa: E402
from django.core.cache import cache  # noqa: E402
from django.test import Client  # noqa: E402

import django_rag as rag  # noqa: E402
from tests.conftest import stub_llm  # noqa: E402
from tests.stub_openai import Failure  # noqa: E402

pytestmark = pytest.mark.django_db

MODEL = "openai/gpt-4o-mini"
# What a visitor must never read: the provider, the model, a library or class, a setting.
LEAKS = ("openai", "gpt", "litellm", "Error", "Exception", "DJANGO_RAG", "LLM", "api_key", "sk-")
UNAVAILABLE = "The assistant is unavailable right now. Please try again later."
NO_ANSWER = "No answer is available for this question right now. Please try again later."
NOT_HERE = "The assistant is not available on this site right now."


@pytest.fixture
def site(settings, stub_llm_server):
    cache.clear()
    settings.DJANGO_RAG = {
        "EMBEDDER": "hashing",
        "LLM": stub_llm(stub_llm_server, max_retries=0),
        "API": {"ANONYMOUS": True, "READ_ALL": "anyone", "RATE_LIMIT": None},
    }
    rag.ingest(
        "Refunds are paid within 14 days.", collection="help", source_id="refunds", title="Refunds"
    )
    yield stub_llm_server
    cache.clear()


def caller(kind):
    client = Client()
    if kind != "visitor":
        user = User.objects.create_user(kind, is_staff=kind == "staff")
        client.force_login(user)
    return client


def post(client, path, body):
    return client.post("/rag/api" + path, body, content_type="application/json")


def events(response):
    assert response["Content-Type"].startswith("text/event-stream")
    text = b"".join(response.streaming_content).decode()
    parsed = []
    for block in text.strip().split("\n\n"):
        lines = block.split("\n")
        parsed.append((lines[0][len("event: ") :], json.loads(lines[1][len("data: ") :])))
    return parsed


def assert_clean(message):
    assert message
    for leak in LEAKS:
        assert leak not in message, f"{leak!r} shown to a visitor: {message!r}"


def chat_error(client, *, stream):
    conv = post(client, "/conversations", {"collection": "help"})
    assert conv.status_code == 201, conv.content
    url = f"/conversations/{conv.json()['id']}/messages"
    response = post(client, url, {"message": "How long do refunds take?", "stream": stream})
    if not stream:
        return response.status_code, response.json()["error"]
    frames = events(response)
    assert [name for name, _ in frames][-1] == "error" and "done" not in dict(frames)
    return response.status_code, frames[-1][1]


@pytest.mark.parametrize(
    ("reply", "code", "text"),
    [
        (Failure(500, "upstream exploded"), "llm_error", UNAVAILABLE),
        (
            Failure(401, "Incorrect API key provided: sk-test"),
            "llm_authentication_failed",
            UNAVAILABLE,
        ),
        ("", "llm_response_error", NO_ANSWER),  # an answer with no words
    ],
)
@pytest.mark.parametrize("kind", ["visitor", "reader"])
def test_a_provider_failure_reads_as_a_short_text_to_visitors(
    site, caplog, kind, reply, code, text
):
    site.default = reply
    client = caller(kind)
    with caplog.at_level(logging.ERROR, logger="django_rag.api"):
        asked = post(
            client, "/ask", {"question": "How long do refunds take?", "collection": "help"}
        )
    assert asked.status_code == 502
    assert asked.json()["error"] == {"code": code, "message": text}
    # The owner's log has what failed: the model and the provider's words.
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert MODEL in logged and code in logged

    for stream in (False, True):
        status, error = chat_error(client, stream=stream)
        assert error == {"code": code, "message": text}, (stream, error)
        assert_clean(error["message"])
        assert "incomplete" not in error["message"]


def test_staff_still_see_what_failed(site):
    site.default = Failure(500, "upstream exploded")
    staff = caller("staff")
    asked = post(staff, "/ask", {"question": "How long do refunds take?"})
    assert asked.status_code == 502
    message = asked.json()["error"]["message"]
    assert MODEL in message and "upstream exploded" in message
    status, error = chat_error(staff, stream=True)
    assert error["code"] == "llm_error" and MODEL in error["message"]

    site.default = ""
    status, error = chat_error(staff, stream=False)
    assert error["code"] == "llm_response_error" and "returned no text" in error["message"]


def test_a_cut_stream_says_so_in_plain_words(site):
    from tests.stub_openai import Drop

    site.default = Drop("Refunds are paid within fourteen days", after=2)
    status, error = chat_error(caller("visitor"), stream=True)
    assert error == {
        "code": "llm_stream_incomplete",
        "message": "The answer was cut off. Please ask again.",
    }


def test_configuration_problems_name_nothing_to_visitors(site, settings, caplog):
    settings.DJANGO_RAG = {**settings.DJANGO_RAG, "LLM": None}
    visitor, staff = caller("visitor"), caller("staff")
    refused = post(visitor, "/ask", {"question": "Refunds?"})
    assert refused.status_code == 503
    assert refused.json()["error"] == {"code": "llm_not_configured", "message": NOT_HERE}
    assert (
        "needs an LLM" in post(staff, "/ask", {"question": "Refunds?"}).json()["error"]["message"]
    )

    secret = "no.such.module.Embedder"
    settings.DJANGO_RAG = {**settings.DJANGO_RAG, "EMBEDDER": secret}
    with caplog.at_level(logging.ERROR, logger="django_rag.api"):
        broken = post(visitor, "/search", {"query": "refunds"})
    assert broken.status_code == 503
    assert broken.json()["error"]["message"] == NOT_HERE
    told = post(staff, "/search", {"query": "refunds"}).json()["error"]["message"]
    assert "DJANGO_RAG['EMBEDDER'] is invalid" in told and secret not in told
    assert "EMBEDDER" in "\n".join(r.getMessage() for r in caplog.records)


def test_an_unknown_collection_is_not_a_lesson_in_python(site, settings):
    settings.DJANGO_RAG = {
        **settings.DJANGO_RAG,
        "DASHBOARD": {"COLLECTIONS": "tests.test_api_visitor_errors.public_only"},
    }
    refused = post(caller("visitor"), "/search", {"query": "x", "collection": "hr"})
    assert refused.status_code == 404
    assert refused.json()["error"] == {
        "code": "unknown_collection",
        "message": "There is no collection named “hr”.",
    }
    settings.DJANGO_RAG = {**settings.DJANGO_RAG, "DASHBOARD": {}}
    staff = post(caller("staff"), "/search", {"query": "x", "collection": "hr"})
    assert "Collection.objects.create(name='hr')" in staff.json()["error"]["message"]


def public_only(user):
    return ["help"]


def test_the_chat_box_carries_its_own_texts_translated(site, client):
    page = client.get("/host/chat/").content.decode()
    assert 'data-text-unavailable="No answer is available right now.' in page
    assert 'data-text-incomplete="The answer is incomplete."' in page
    assert ">New conversation</button>" in page and ">Send</button>" in page
