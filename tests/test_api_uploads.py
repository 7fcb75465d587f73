"""API uploads get the dashboard's identity (issue 36): the file's name is the source id unless
one is sent, so ``replace`` supersedes the earlier upload and a folder synced into the same
collection finds it; errors are worded for an HTTP client. Through the Django test client."""

import pytest

pytest.importorskip("ninja", reason="the API needs the 'api' extra (django-ninja)")

from django.contrib.auth.models import User  # noqa: E402
from django.core.cache import cache  # noqa: E402
from django.core.files.uploadedfile import SimpleUploadedFile  # noqa: E402
from django.test import Client  # noqa: E402

import django_rag as rag  # noqa: E402
from django_rag.models import Document  # noqa: E402
from django_rag.validation import upload_source_id  # noqa: E402

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff(settings):
    cache.clear()
    settings.DJANGO_RAG = {"EMBEDDER": "hashing", "API": {"RATE_LIMIT": None}}
    client = Client()
    client.force_login(User.objects.create_user("boss", is_staff=True))
    yield client
    cache.clear()


def upload(client, name, data, **fields):
    return client.post(
        "/rag/api/documents",
        {"collection": "docs", "file": SimpleUploadedFile(name, data), **fields},
    )


def current(source_id):
    """The documents of ``docs`` with this source id (a replaced one is gone)."""
    return list(Document.objects.filter(collection__name="docs", source_id=source_id))


def test_an_upload_without_a_source_id_is_known_by_its_file_name(staff):
    response = upload(staff, "refunds.md", b"# Refunds\n\nRefunds take 14 days.")
    assert response.status_code == 202, response.content
    assert response.json()["source_id"] == "refunds.md"
    (document,) = current("refunds.md")
    assert document.status == Document.Status.COMPLETED

    typed = upload(staff, "b.txt", b"Other text.", source_id="policies/b")
    assert typed.json()["source_id"] == "policies/b"


def test_replace_supersedes_the_earlier_upload_of_the_same_file(staff):
    upload(staff, "refunds.md", b"Refunds take 14 days.")
    first = current("refunds.md")[0]
    replaced = upload(staff, "refunds.md", b"Refunds now take 5 days.", replace="true")
    assert replaced.status_code == 202, replaced.content
    (document,) = current("refunds.md")  # one document: the new version
    assert document.pk != first.pk and document.content == "Refunds now take 5 days."
    # Without replace a changed file is stored beside the old one, as in the dashboard.
    kept = upload(staff, "refunds.md", b"Refunds take 3 days.")
    assert kept.status_code == 202 and len(current("refunds.md")) == 2


def test_replace_never_answers_in_python_terms(staff):
    response = upload(staff, "a.txt", b"Text.", replace="true")
    assert response.status_code == 202
    assert "replace=True" not in response.content.decode()
    # A source id that cannot be stored is refused naming the field, as every API input is.
    bad = upload(staff, "b.txt", b"Text.", replace="true", source_id="tab\there")
    assert bad.status_code == 400
    error = bad.json()["error"]
    assert error["code"] == "invalid_input" and error["message"].startswith("source_id")
    assert "replace=True" not in error["message"]
    # Django strips control characters from upload names, so a file name always serves; the
    # rule behind the API's own refusal is the shared helper's (the last test).
    named = upload(staff, "tab\there.txt", b"Text.", replace="true")
    assert named.status_code == 202 and named.json()["source_id"] == "tabhere.txt"


def test_a_folder_sync_finds_what_the_api_uploaded(staff, tmp_path):
    upload(staff, "notes.txt", b"The first notes.")
    upload(staff, "gone.txt", b"A file the folder no longer has.")
    (tmp_path / "notes.txt").write_text("The notes, edited in the folder.")
    report = rag.sync_folder(tmp_path, collection="docs")
    assert report.replaced == ["notes.txt"] and report.deleted == ["gone.txt"]
    (document,) = current("notes.txt")
    assert document.content == "The notes, edited in the folder."
    assert current("gone.txt") == []


def test_the_dashboard_and_the_api_share_one_rule():
    assert upload_source_id("", "report.pdf") == "report.pdf"
    assert upload_source_id(None, "dir/report.pdf") == "report.pdf"
    assert upload_source_id("policies/refunds", "report.pdf") == "policies/refunds"
    assert upload_source_id("", "a\tb.txt") == "a\tb.txt"  # the dashboard's form allows it
    with pytest.raises(rag.exceptions.InvalidOption) as caught:
        upload_source_id("", "a\tb.txt", strict=True)
    assert caught.value.details["field"] == "source_id"
    with pytest.raises(rag.exceptions.InvalidOption):
        upload_source_id("", "x" * 513)
