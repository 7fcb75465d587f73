"""The Sync page in headless Chromium: after a Check (dry run) and a Reconcile of a model, and
a folder checked and synced from the command line, the page's labels and counts say what
happened: "Checked: would add 2", then a reconcile that cleared the stale count."""

from io import StringIO

import pytest
from django.core.management import call_command
from django.test import override_settings

from django_rag.models import Job
from tests.syncapp.models import Note
from tests.test_dashboard_browser import (
    browser,  # noqa: F401 (the staff session's driver)
    shot,
    wait_for,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_the_sync_page_labels_a_check_and_a_reconcile(browser, tmp_path):  # noqa: F811
    from selenium.webdriver.common.by import By

    driver = browser

    folder = tmp_path / "handbook"
    folder.mkdir()
    (folder / "a.txt").write_text("Refunds take 14 days.")
    with override_settings(DJANGO_RAG={"EMBEDDER": "hashing", "BACKGROUND": "inline"}):
        Note.objects.bulk_create([Note(body="Made by bulk_create."), Note(body="Another.")])
        out = StringIO()
        call_command("rag_ingest", str(folder), "--sync", "--dry-run", "--collection", "hb",
                     stdout=out)  # fmt: skip
        driver.get(driver.base + "sync/")
        row = driver.find_element(By.ID, "model-syncapp.note")
        assert row.find_element(By.CLASS_NAME, "stale").text == "not checked"
        row.find_element(By.CSS_SELECTOR, "button[value=check]").click()
        wait_for(driver, lambda d: "Check model syncapp.note finished" in d.page_source)
        stale = driver.find_element(By.CSS_SELECTOR, "#model-syncapp\\.note .stale").text
        assert stale.startswith("2 (checked") and stale.endswith("would add 2)")
        check = Job.objects.get(kind="sync", params__model="syncapp.note")
        job = driver.find_element(By.ID, f"job-{check.pk}")
        assert "Check model syncapp.note" in job.text and "Checked: would add 2" in job.text
        assert "Would add" in job.text and "Completed" not in job.text
        cli = Job.objects.get(kind="sync", params__has_key="folder")
        job = driver.find_element(By.ID, f"job-{cli.pk}")
        assert "Check folder" in job.text and "Checked: would add 1" in job.text
        assert "took 0.0 s" not in job.text and "Reconcile indexed models" not in driver.page_source
        folder_row = driver.find_element(By.ID, "folder-0")
        assert folder_row.find_element(By.CLASS_NAME, "synced").text == "never"
        assert folder_row.find_element(By.CLASS_NAME, "stale").text.endswith("would add 1)")
        shot(driver, "sync-checked")

        driver.find_element(
            By.CSS_SELECTOR, "#model-syncapp\\.note button[value=reconcile]"
        ).click()
        wait_for(driver, lambda d: "Reconcile syncapp.note?" in d.page_source)
        assert "found: would add 2." in driver.find_element(By.ID, "confirm-message").text
        driver.find_element(By.CSS_SELECTOR, "#confirm-form button").click()
        wait_for(driver, lambda d: "Reconcile model syncapp.note finished" in d.page_source)
        stale = driver.find_element(By.CSS_SELECTOR, "#model-syncapp\\.note .stale").text
        assert stale.startswith("0 (reconciled")
        repair = Job.objects.get(kind="sync", params__model="syncapp.note", params__dry_run=False)
        job = driver.find_element(By.ID, f"job-{repair.pk}")
        assert "Reconcile model syncapp.note" in job.text and "Completed" in job.text
        assert "Added" in job.text and "Would" not in job.text and "Checked" not in job.text
        shot(driver, "sync-reconciled")
