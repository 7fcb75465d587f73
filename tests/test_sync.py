"""Registered models stay indexed: saves, deletes, leaving and re-entering the indexed set,
many-to-many and related-row changes, and what signals cannot see repaired by ``rag_sync`` —
in every background mode (inline, the thread pool, rag_worker processes, a real Celery worker
with Redis). After every step the documents equal the indexed rows (content and count) and a
search finds each row's own text.
"""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db import connection, transaction
from django.test import override_settings

import django_rag as rag
from django_rag import sync
from django_rag.models import Document, Job
from django_rag.validation import clean_text
from tests.syncapp.models import Article, Author, Note, Tag

pytestmark = pytest.mark.django_db(transaction=True)
ROOT = Path(__file__).resolve().parent.parent


def expected_documents():
    """(collection, source_id) -> text for every row that should be indexed now."""
    expected = {}
    for article in Article.objects.filter(published=True):
        expected[(f"articles-{article.tenant}", f"syncapp.article:{article.pk}")] = clean_text(
            article.index_text()
        )
    for note in Note.objects.all():
        if note.body.strip():
            expected[("notes", f"syncapp.note:{note.pk}")] = clean_text(note.body)
    return expected


def assert_index_matches_rows():
    stored = {
        (d.collection.name, d.source_id): d.content
        for d in Document.objects.select_related("collection")
    }
    assert Document.objects.count() == len(stored)  # one document per row
    assert stored == expected_documents()
    assert set(Document.objects.values_list("status", flat=True)) <= {"completed"}
    for (collection, source_id), text in expected_documents().items():
        hits = rag.search(text[:200], collection=collection, mode="fulltext", limit=1)
        assert hits and hits[0].source_id == source_id, (source_id, hits)


class Runner:
    """Waits until the background work the last steps queued has run, in one mode."""

    def __init__(self, mode, worker=None):
        self.mode, self.worker = mode, worker

    def settle(self):
        if self.mode == "worker":
            process = subprocess.run(
                [sys.executable, "-m", "django", "rag_worker", "--burst"],
                cwd=ROOT,
                env={
                    **os.environ,
                    "DJANGO_SETTINGS_MODULE": "tests.settings",
                    "DJANGO_RAG_TEST_DATABASE": connection.settings_dict["NAME"],
                    "DJANGO_RAG_TEST_EMBEDDER": "hashing",
                },
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert process.returncode == 0, process.stdout + process.stderr
        deadline = time.monotonic() + 120
        while Job.objects.filter(status__in=["pending", "running"]).exists():
            assert time.monotonic() < deadline, list(Job.objects.values("status", "params"))
            time.sleep(0.1)
        failed = list(Job.objects.filter(status="failed").values_list("error", flat=True))
        assert failed == []


def run_scenario(runner):
    author = Author.objects.create(name="Ada Lovelace")
    pump = Article.objects.create(title="Pump manual", body="Prime the pump before use.")
    pump.author = author
    pump.save()
    valve = Article.objects.create(
        title="Valve guide", body="Close the valve slowly.", tenant="globex"
    )
    Article.objects.create(title="Draft", body="Not yet.", published=False)
    Note.objects.create(body="# Notes\n\nRemember the filters.")
    Note.objects.create(body="   ")  # no text: not indexed
    runner.settle()
    assert_index_matches_rows()

    # Update, unpublish, republish, move tenant, delete.
    pump.body = "Prime the pump, then open the outlet."
    pump.save()
    runner.settle()
    assert_index_matches_rows()
    valve.published = False
    valve.save()
    runner.settle()
    assert_index_matches_rows()
    valve.published = True
    valve.tenant = "initech"
    valve.save()
    runner.settle()
    assert_index_matches_rows()
    Note.objects.filter(body__startswith="#").first().delete()
    runner.settle()
    assert_index_matches_rows()

    # Many-to-many and a related row.
    pump.tags.add(Tag.objects.create(name="maintenance"))
    author.name = "Ada King"
    author.save()
    runner.settle()
    assert_index_matches_rows()
    assert "Ada King" in Document.objects.get(source_id=f"syncapp.article:{pump.pk}").content

    # A transaction that rolls back indexes nothing.
    with pytest.raises(RuntimeError), transaction.atomic():
        Article.objects.create(title="Ghost", body="Never committed.")
        raise RuntimeError("roll back")
    runner.settle()
    assert_index_matches_rows()

    # What signals cannot see: QuerySet.update(), then rag_sync.
    Article.objects.filter(pk=pump.pk).update(body="Changed behind the signals' back.")
    Article.objects.filter(title="Draft").update(published=True)
    Article.objects.filter(pk=valve.pk).update(published=False)
    call_command("rag_sync", "--json")
    runner.settle()
    assert_index_matches_rows()


@pytest.mark.parametrize("mode", ["inline", "thread", "worker"])
def test_models_stay_indexed(mode):
    with override_settings(DJANGO_RAG={"EMBEDDER": "hashing", "BACKGROUND": mode}):
        run_scenario(Runner(mode))


def test_unchanged_rows_are_not_embedded_again_and_resync_writes_nothing(hashing):
    calls = []

    class Counting(type(hashing)):
        def _embed(self, texts):
            calls.append(len(texts))
            return super()._embed(texts)

    with override_settings(DJANGO_RAG={"EMBEDDER": Counting(), "BACKGROUND": "inline"}):
        article = Article.objects.create(title="Filters", body="Change them monthly.")
        embedded = len(calls)
        assert embedded >= 1
        article.save()  # same text: no embedding, no new document
        assert len(calls) == embedded
        article.published_on = "2026-11-01"  # metadata only: updated in place
        article.save()
        assert len(calls) == embedded
        document = Document.objects.get(source_id=f"syncapp.article:{article.pk}")
        assert document.metadata == {"tenant": "acme", "published_on": "2026-11-01"}
        (report,) = sync.reconcile("syncapp.Article")
    assert (report.rows, report.unchanged, report.added, report.replaced) == (1, 1, 0, 0)
    assert len(calls) == embedded


def test_rag_sync_dry_run_counts_and_writes_nothing(capsys):
    with override_settings(DJANGO_RAG={"EMBEDDER": "hashing", "BACKGROUND": "inline"}):
        kept = Article.objects.create(title="Kept", body="Stays as it is.")
        changed = Article.objects.create(title="Changed", body="Old text.")
        gone = Article.objects.create(title="Gone", body="Deleted by SQL.")
        Article.objects.filter(pk=changed.pk).update(body="New text.")
        Article.objects.filter(pk=gone.pk).update(published=False)
        Article.objects.bulk_create([Article(title="Bulk", body="Made by bulk_create.")])
        before = list(Document.objects.values_list("pk", "content_hash"))
        call_command("rag_sync", "syncapp.Article", "--dry-run")
        assert list(Document.objects.values_list("pk", "content_hash")) == before
        out = capsys.readouterr().out
        assert "1 added, 1 replaced, 0 updated, 1 deleted, 1 unchanged" in out, out
        call_command("rag_sync", "syncapp.Article")
        assert_index_matches_rows()
    assert Document.objects.filter(source_id=f"syncapp.article:{kept.pk}").exists()


def test_hits_give_rows_back_in_one_query_per_model_filtered_for_a_user(
    django_assert_num_queries,
):
    from django.contrib.auth.models import User

    with override_settings(DJANGO_RAG={"EMBEDDER": "hashing", "BACKGROUND": "inline"}):
        ours = Article.objects.create(title="Refunds", body="Refunds take 14 days.")
        theirs = Article.objects.create(
            title="Refunds", body="Refunds take 30 days.", tenant="globex"
        )
        rag.ingest("Refunds in a plain document.", collection="articles-acme")
        hits = rag.search("refunds take days", mode="fulltext", limit=10)
        assert len(hits) == 3
        with django_assert_num_queries(1):  # one model: one query
            loaded = rag.with_objects(hits)
        assert {h.object for h in loaded if h.object is not None} == {ours, theirs}
        user = User(username="u", first_name="acme")
        visible = rag.with_objects(hits, user=user)
    assert [h.object for h in visible if h.source_id.startswith("syncapp")] == [ours]
    assert len(visible) == 2  # the plain document passes through
    assert "object" not in visible[0].to_dict()


def test_a_failed_sync_is_recorded_shown_and_repaired_by_rag_sync(hashing):
    class Down(type(hashing)):
        def _embed(self, texts):
            raise ConnectionError("provider down")

    with override_settings(DJANGO_RAG={"EMBEDDER": Down(), "BACKGROUND": "inline"}):
        article = Article.objects.create(title="Outage", body="Saved while the provider is down.")
    # The save committed; the index job failed with the provider's error, nothing half-written.
    assert Article.objects.filter(pk=article.pk).exists()
    assert not Document.objects.exists()
    job = Job.objects.get(kind="sync-row")
    assert job.status == "failed" and "provider down" in job.error
    status = {row["model"]: row for row in sync.status()}["syncapp.article"]
    assert (status["rows"], status["indexed"], status["missing"], status["failed"]) == (1, 0, 1, 1)
    with override_settings(DJANGO_RAG={"EMBEDDER": "hashing", "BACKGROUND": "inline"}):
        call_command("rag_sync")
        assert_index_matches_rows()


def test_unregistered_model_in_rag_sync_is_a_clear_error():
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="is not an indexed model"):
        call_command("rag_sync", "auth.User")


@pytest.mark.slow
def test_models_stay_indexed_with_a_real_celery_worker(request, tmp_path):
    from tests.helpers import Worker

    worker = Worker(request.getfixturevalue("broker"), tmp_path)
    worker.start()
    try:
        with override_settings(DJANGO_RAG={"EMBEDDER": "hashing"}):  # BACKGROUND "auto": Celery
            from django_rag import background

            assert background.mode() == "celery"
            run_scenario(Runner("celery"))
        assert Job.objects.filter(kind="sync-row", runner="celery", status="completed").exists()
    finally:
        worker.stop()


def test_the_sync_page_shows_counts_and_checks_then_reconciles(staff):
    from django.urls import reverse

    with override_settings(DJANGO_RAG={"EMBEDDER": "hashing", "BACKGROUND": "inline"}):
        Article.objects.create(title="Indexed", body="Saved through the ORM.")
        Note.objects.bulk_create([Note(body="Made by bulk_create."), Note(body="Another.")])
        url = reverse("django_rag_dashboard:sync")
        page = staff.get(url).content.decode()
        assert 'data-model="syncapp.note"' in page and "not checked" in page
        note_row = page[page.index('id="model-syncapp.note"') :]
        assert '<td class="rows">2</td>' in note_row and '<td class="missing">2</td>' in note_row
        response = staff.post(url, {"model": "syncapp.note", "action": "check"})
        assert response.status_code == 302
        assert not Document.objects.filter(collection__name="notes").exists()  # a dry run
        page = staff.get(url).content.decode()
        note_row = page[page.index('id="model-syncapp.note"') :]
        assert '<td class="stale">2 ' in note_row
        confirm = staff.post(url, {"model": "syncapp.note", "action": "reconcile"})
        assert b"Reconcile syncapp.note?" in confirm.content  # asks first
        staff.post(url, {"model": "syncapp.note", "action": "reconcile", "confirmed": "yes"})
        assert_index_matches_rows()
        assert staff.post(url, {"model": "auth.user", "action": "check"}).status_code == 302
        assert Job.objects.filter(kind="sync").count() == 2  # the unknown model started nothing


def test_the_admin_lists_indexed_models_and_reconciles(admin_client):
    from django.urls import reverse

    with override_settings(DJANGO_RAG={"EMBEDDER": "hashing", "BACKGROUND": "inline"}):
        Note.objects.bulk_create([Note(body="Made by bulk_create.")])
        url = reverse("admin:django_rag_indexedmodelstatus_changelist")
        assert url in admin_client.get(reverse("admin:index")).content.decode()
        page = admin_client.get(url).content.decode()
        assert 'data-model="syncapp.note"' in page and "syncapp.article" in page
        response = admin_client.post(url, {"model": "syncapp.note", "action": "reconcile"})
        assert response.status_code == 302
        assert_index_matches_rows()
        admin_client.post(url, {"model": "nope.nope", "action": "reconcile"})
        assert Job.objects.filter(kind="sync").count() == 1


def test_finished_jobs_are_pruned_by_age(capsys):
    from datetime import timedelta

    from django.utils import timezone

    with override_settings(DJANGO_RAG={"EMBEDDER": "hashing", "BACKGROUND": "inline"}):
        for i in range(3):
            Note.objects.create(body=f"Note {i}.")
    old = timezone.now() - timedelta(days=40)
    Job.objects.filter(pk__in=list(Job.objects.values_list("pk", flat=True)[:2])).update(
        finished_at=old
    )
    Job.objects.create(kind="sync-row", status="pending")  # unfinished: never pruned
    call_command("rag_maintenance", "jobs")
    assert "Found 2 finished sync-row job(s)" in capsys.readouterr().out
    assert Job.objects.count() == 4
    call_command("rag_maintenance", "jobs", "--apply")
    assert Job.objects.count() == 2 and Job.objects.filter(status="pending").exists()


def test_the_sync_page_lists_synced_folders_checks_and_syncs_them(staff, tmp_path):
    from django.urls import reverse

    folder = tmp_path / "handbook"
    folder.mkdir()
    (folder / "a.txt").write_text("Refunds take 14 days.")
    with override_settings(DJANGO_RAG={"EMBEDDER": "hashing", "BACKGROUND": "inline"}):
        rag.sync_folder(folder, collection="handbook")
        url = reverse("django_rag_dashboard:sync")
        page = staff.get(url).content.decode()
        assert f'data-folder="{folder.resolve()}"' in page and "1 added" in page
        (folder / "b.txt").write_text("Exchanges take 30 days.")
        (folder / "a.txt").unlink()
        staff.post(url, {"folder": "0", "action": "check"})
        assert list(Document.objects.values_list("source_id", flat=True)) == ["a.txt"]
        page = staff.get(url).content.decode()
        row = page[page.index('id="folder-0"') :]
        assert '<td class="stale">2 ' in row  # one to add, one to delete
        assert "would add 1, would delete 1" in row
        staff.post(url, {"folder": "0", "action": "reconcile", "confirmed": "yes"})
        assert list(Document.objects.values_list("source_id", flat=True)) == ["b.txt"]
        assert staff.post(url, {"folder": "7", "action": "check"}).status_code == 302
    assert Job.objects.filter(kind="sync", runner="inline").count() == 2  # not the unknown one
