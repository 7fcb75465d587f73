"""A conversation started without a title takes one from its first message: a short, cleaned
prefix; its owner can rename it (PATCH), and an empty title goes back to the made one
(issue 36). Through the Django test client."""

import pytest

pytest.importorskip("ninja", reason="the API needs the 'api' extra (django-ninja)")

from django.contrib.auth.models import User  # noqa: E402
from django.core.cache import cache  # noqa: E402
from django.test import Client  # noqa: E402

import django_rag as rag  # noqa: E402
from django_rag.conversations import title_from_message  # noqa: E402
from django_rag.models import Conversation  # noqa: E402
from django_rag.testing import ScriptedLLM  # noqa: E402

pytestmark = pytest.mark.django_db

API = "/rag/api"
LONG = (
    "Could you please tell me how long the refund for an opened product takes when I "
    "return it by post from abroad?"
)


@pytest.fixture
def alice(settings):
    cache.clear()
    settings.DJANGO_RAG = {
        "EMBEDDER": "hashing",
        "LLM": ScriptedLLM(default="Refunds take 14 days [1]."),
        "CHAT": {"CONDENSER": None},
        "API": {"READ_ALL": "authenticated", "RATE_LIMIT": None},
    }
    rag.ingest("Refunds take 14 days.", collection="help", source_id="refunds")
    client = Client()
    client.force_login(User.objects.create_user("alice"))
    yield client
    cache.clear()


def post(client, path, body):
    return client.post(API + path, body, content_type="application/json")


def patch(client, path, body):
    return client.patch(API + path, body, content_type="application/json")


def say(client, conv, message):
    response = post(client, f"/conversations/{conv}/messages", {"message": message})
    assert response.status_code == 200, response.content


def title(client, conv):
    return client.get(f"{API}/conversations/{conv}").json()["title"]


def test_a_conversation_without_a_title_takes_its_first_message(alice):
    conv = post(alice, "/conversations", {}).json()
    assert conv["title"] == ""
    say(alice, conv["id"], "  How long do\n\trefunds   take?\u200b ")
    assert title(alice, conv["id"]) == "How long do refunds take?"
    say(alice, conv["id"], "And for opened products?")  # the first message's, kept
    assert title(alice, conv["id"]) == "How long do refunds take?"
    listed = alice.get(API + "/conversations").json()["conversations"]
    assert listed[0]["title"] == "How long do refunds take?"


def test_a_long_first_message_gives_a_short_prefix_cut_between_words(alice):
    conv = post(alice, "/conversations", {}).json()["id"]
    say(alice, conv, LONG)
    made = title(alice, conv)
    assert made == "Could you please tell me how long the refund for an opened…"
    assert len(made) <= 60 and LONG.startswith(made[:-1])


def test_a_title_given_or_edited_stays_and_an_empty_one_is_made_again(alice):
    named = post(alice, "/conversations", {"title": "Refunds"}).json()["id"]
    say(alice, named, "How long do refunds take?")
    assert title(alice, named) == "Refunds"

    conv = post(alice, "/conversations", {}).json()["id"]
    say(alice, conv, "How long do refunds take?")
    renamed = patch(alice, f"/conversations/{conv}", {"title": "My refund"})
    assert renamed.status_code == 200, renamed.content
    assert renamed.json()["title"] == "My refund"
    say(alice, conv, "And opened products?")
    assert title(alice, conv) == "My refund"
    cleared = patch(alice, f"/conversations/{conv}", {"title": ""})
    assert cleared.json()["title"] == "How long do refunds take?"
    # Renaming an empty conversation to "" leaves it untitled: its first message names it.
    fresh = post(alice, "/conversations", {"title": "Draft"}).json()["id"]
    assert patch(alice, f"/conversations/{fresh}", {"title": ""}).json()["title"] == ""
    say(alice, fresh, "Opened products?")
    assert title(alice, fresh) == "Opened products?"


def test_only_the_owner_renames_and_titles_are_checked_like_every_input(alice):
    conv = post(alice, "/conversations", {}).json()["id"]
    bob = Client()
    bob.force_login(User.objects.create_user("bob"))
    refused = patch(bob, f"/conversations/{conv}", {"title": "Mine now"})
    assert refused.status_code == 404
    assert refused.json()["error"]["code"] == "conversation_not_found"
    assert Conversation.objects.get(pk=conv).title == ""
    bad = patch(alice, f"/conversations/{conv}", {"title": "line\nbreak"})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_input"
    assert patch(alice, f"/conversations/{conv}", {"title": "x" * 201}).status_code == 400
    assert patch(Client(), f"/conversations/{conv}", {"title": "x"}).status_code == 401


def test_rag_chat_titles_a_new_conversation_the_same_way(alice):
    reply = rag.chat("  Who takes\n refunds?  ", user=User.objects.get(username="alice"))
    assert reply.conversation.title == "Who takes refunds?"
    assert title_from_message("Hello\x00\x07 there\r\n\u00adfriend") == "Hello there friend"
    assert title_from_message("a" * 100) == "a" * 59 + "…"
    assert title_from_message("") == ""
