"""The Sync page tells the truth: a check (dry run) reads as a check ("Checked: would add 2",
never "Completed ... added"), folder and model syncs are named for what they are, a successful
reconcile or sync clears the stale count, a folder synced from the command line shows how long
it really took, and the confirmation says what the last check counted. Django test client,
real PostgreSQL, the hashing embedder, inline jobs."""

import re
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.test import override_settings
from django.urls import reverse

from django_rag.dashboard.views.common import _duration, sync_name, sync_summary
from django_rag.models import Document, Job
from tests.syncapp.models import Note

pytestmark = pytest.mark.django_db(transaction=True)
SETTINGS = {"EMBEDDER": "hashing", "BACKGROUND": "inline"}


def job_row(page: str, job: Job) -> str:
    start = page.index(f'id="job-{job.pk}"')
    return page[start : page.index("\n    </tr>", start)]


def cell(page: str, row_id: str, name: str) -> str:
    row = page[page.index(f'id="{row_id}"') :]
    start = row.index(f'<td class="{name}">')
    return re.sub(r"<[^>]+>", "", row[start : row.index("</td>", start)]).strip()


def test_names_and_summaries():
    assert sync_name({"folder": "/x", "dry_run": True}) == "Check folder"
    assert sync_name({"folder": "/x", "dry_run": False}) == "Sync folder"
    assert sync_name({"model": "blog.post", "dry_run": True}) == "Check model blog.post"
    assert sync_name({"model": "blog.post"}) == "Reconcile model blog.post"
    assert sync_name({}) == "Reconcile all indexed models"
    assert sync_summary({"added": 2, "deleted": 0, "unchanged": 3}, dry_run=True) == (
        "would add 2, 3 unchanged"
    )
    assert sync_summary({"added": 2, "deleted": 1}, dry_run=False) == "added 2, deleted 1"
    assert sync_summary({}, dry_run=True) == "nothing to change"
    assert _duration(timedelta(milliseconds=12)) == "12 ms"
    assert _duration(timedelta(0)) == "under 1 ms"
    assert _duration(timedelta(seconds=3)) == "3.0 s"


def test_a_model_check_reads_as_a_check_and_a_reconcile_clears_it(staff):
    url = reverse("django_rag_dashboard:sync")
    with override_settings(DJANGO_RAG=SETTINGS):
        Note.objects.bulk_create([Note(body="Made by bulk_create."), Note(body="Another.")])
        confirm = staff.post(url, {"model": "syncapp.note", "action": "reconcile"})
        assert b"Not checked yet" in confirm.content
        response = staff.post(url, {"model": "syncapp.note", "action": "check"}, follow=True)
        assert "Check model syncapp.note finished" in response.content.decode()
        check = Job.objects.get(kind="sync", params__dry_run=True)
        page = staff.get(url).content.decode()
        stale = cell(page, "model-syncapp.note", "stale")
        assert stale.startswith("2 (checked") and stale.endswith(": would add 2)")
        row = job_row(page, check)
        assert "Check model syncapp.note" in row and "Checked: would add 2" in row
        assert "Would add" in row and "Completed" not in row and ">Added<" not in row
        assert "Reconcile indexed models" not in page

        confirm = staff.post(url, {"model": "syncapp.note", "action": "reconcile"})
        text = confirm.content.decode()
        assert "Reconcile syncapp.note?" in text and "found: would add 2." in text
        assert ">Reconcile</button>" in text
        staff.post(url, {"model": "syncapp.note", "action": "reconcile", "confirmed": "yes"})
        assert Document.objects.filter(collection__name="notes").count() == 2
        repair = Job.objects.get(kind="sync", params__dry_run=False)
        page = staff.get(url).content.decode()
        assert cell(page, "model-syncapp.note", "stale").startswith("0 (reconciled")
        row = job_row(page, repair)
        assert "Reconcile model syncapp.note" in row and "Completed" in row
        assert ">Added<" in row and "Would" not in row and "Checked" not in row
        confirm = staff.post(url, {"model": "syncapp.note", "action": "reconcile"})
        assert b"no check ran since" in confirm.content


def test_a_failed_reconcile_keeps_the_stale_count(staff):
    url = reverse("django_rag_dashboard:sync")
    with override_settings(DJANGO_RAG=SETTINGS):
        Note.objects.bulk_create([Note(body="Made by bulk_create.")])
        staff.post(url, {"model": "syncapp.note", "action": "check"})
        Job.objects.create(
            kind="sync", status="failed", params={"model": "syncapp.note", "dry_run": False}
        )
        page = staff.get(url).content.decode()
        assert cell(page, "model-syncapp.note", "stale").startswith("1 (checked")


def test_a_cli_folder_dry_run_is_a_check_and_a_sync_clears_it(staff, tmp_path):
    folder = tmp_path / "handbook"
    folder.mkdir()
    (folder / "a.txt").write_text("Refunds take 14 days.")
    (folder / "b.txt").write_text("Exchanges take 30 days.")
    url = reverse("django_rag_dashboard:sync")
    with override_settings(DJANGO_RAG=SETTINGS):
        call_command(
            "rag_ingest", str(folder), "--sync", "--dry-run", "--collection", "hb",
            stdout=StringIO(),
        )  # fmt: skip
        check = Job.objects.get(kind="sync")
        assert check.params["dry_run"] and check.finished_at > check.started_at  # real times
        assert check.created_at == check.started_at
        page = staff.get(url).content.decode()
        row = job_row(page, check)
        assert "Check folder" in row and "Checked: would add 2" in row
        assert "Completed" not in row and ">Added<" not in row and "took 0.0 s" not in row
        assert cell(page, "folder-0", "synced") == "never"
        assert cell(page, "folder-0", "stale").endswith(": would add 2)")

        confirm = staff.post(url, {"folder": "0", "action": "reconcile"}).content.decode()
        assert f"Sync folder {folder.resolve()}?" in confirm
        assert "found: would add 2." in confirm
        call_command("rag_ingest", str(folder), "--sync", "--collection", "hb", stdout=StringIO())
        synced = Job.objects.filter(kind="sync", params__dry_run=False).get()
        assert synced.finished_at > synced.started_at
        page = staff.get(url).content.decode()
        row = job_row(page, synced)
        assert "Sync folder" in row and "Completed" in row and ">Added<" in row
        assert "Checked" not in row
        assert cell(page, "folder-0", "stale").startswith("0 (synced")
        assert "Added 2" in cell(page, "folder-0", "synced")
