"""End-to-end dashboard flows in headless Chromium (Debian's chromium + chromium-driver through
Selenium; never a downloaded browser). Screenshots of every page go to tests/artifacts/."""

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.test import override_settings

import django_rag as rag
from tests.conftest import stub_llm
from tests.test_parsers import make_pdf

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
ARTIFACTS = Path(os.environ.get("DJANGO_RAG_ARTIFACTS", Path(__file__).parent / "artifacts"))
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver") or "/usr/lib/chromium/chromedriver"


@pytest.fixture
def browser(live_server, client, tmp_path):
    if not CHROMIUM or not os.path.exists(DRIVER):
        pytest.skip(
            "chromium and chromium-driver are not installed (scripts/test.sh installs them)"
        )
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--window-size=1280,1000",
        f"--user-data-dir={tempfile.mkdtemp(dir=tmp_path)}",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    driver.implicitly_wait(5)
    user = User.objects.create_user("e2e", password="pw", is_staff=True)
    client.force_login(user)
    driver.get(live_server.url + "/static-missing")  # a page on the domain, to set the cookie
    driver.add_cookie(
        {"name": "sessionid", "value": client.cookies["sessionid"].value, "path": "/"}
    )
    driver.base = live_server.url + "/tools/rag/"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    yield driver
    driver.quit()


def shot(driver, name):
    driver.save_screenshot(str(ARTIFACTS / f"{name}.png"))


def wait_for(driver, condition, timeout=60):
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        return WebDriverWait(driver, timeout).until(condition)
    except TimeoutException:
        shot(driver, "failure")  # the page as it was, next to the other artifacts
        raise AssertionError(
            f"timed out on {driver.current_url}:\n{driver.find_element('tag name', 'body').text[:3000]}"
        ) from None


def test_upload_search_ask_evaluate_and_reembed(browser, stub_llm_server, tmp_path):
    from selenium.webdriver.common.by import By

    driver = browser
    # Upload a PDF and see its chunks.
    pdf = tmp_path / "manual.pdf"
    pdf.write_bytes(
        make_pdf(["Press the red button to start the X200 drill.", "Warranty: two years."])
    )
    driver.get(driver.base + "documents/")
    shot(driver, "documents-empty")
    form = driver.find_element(By.CSS_SELECTOR, "form[enctype='multipart/form-data']")
    form.find_element(By.NAME, "collection").clear()
    form.find_element(By.NAME, "collection").send_keys("manuals")
    form.find_element(By.NAME, "file").send_keys(str(pdf))
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    # The documents page has a "Chunks" column too: wait for the document's own page.
    wait_for(driver, lambda d: "/documents/" in d.current_url and "Press the red" in d.page_source)
    assert "Press the red button" in driver.page_source and "pages 1" in driver.page_source
    shot(driver, "document")
    driver.get(driver.base + "documents/")
    shot(driver, "documents")

    # Search.
    driver.get(driver.base + "search/?q=red+button+drill&compare=on")
    assert driver.page_source.count("Press the red button") == 3
    shot(driver, "search")

    # Ask, streamed from the stub LLM server over HTTP.
    stub_llm_server.chat = ["Press the red button to start it [1]."]
    with override_settings(DJANGO_RAG={"EMBEDDER": "hashing", "LLM": stub_llm(stub_llm_server)}):
        driver.get(driver.base + "ask/")
        driver.find_element(By.NAME, "question").send_keys("How do I start the drill?")
        driver.find_element(By.CSS_SELECTOR, "#ask-form button[type=submit]").click()
        wait_for(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "#citations li a"))
        answer = driver.find_element(By.ID, "answer").text
        assert answer == "Press the red button to start it [1]."
        link = driver.find_element(By.CSS_SELECTOR, "#citations li a")
        assert "manual.pdf" in link.text and "#chunk-" in link.get_attribute("href")
        assert stub_llm_server.chat_requests[-1]["body"]["stream"] is True
        shot(driver, "ask")

    # Run an evaluation.
    from django_rag.evaluation import create_test_case
    from django_rag.models import Chunk

    create_test_case("red button", chunks=list(Chunk.objects.all()[:1]), collection="manuals")
    driver.get(driver.base + "evaluation/")
    driver.find_element(By.CSS_SELECTOR, "input[value=run]").find_element(
        By.XPATH, ".."
    ).find_element(By.CSS_SELECTOR, "button").click()
    wait_for(driver, lambda d: "Run evaluation finished" in d.page_source)
    assert "Completed" in driver.page_source
    shot(driver, "evaluation")

    # Start a re-embed and see it finish.
    from django_rag.testing import HashingEmbedder

    rag.ingest("Legacy chunk.", collection="manuals", embedder=HashingEmbedder(model_name="old"))
    driver.get(driver.base + "maintenance/")
    driver.find_element(By.CSS_SELECTOR, "input[value=reembed]").find_element(
        By.XPATH, ".."
    ).find_element(By.CSS_SELECTOR, "button").click()
    wait_for(driver, lambda d: "Reembed finished" in d.page_source)
    assert driver.find_elements(By.CSS_SELECTOR, "tr.job-completed")
    shot(driver, "maintenance")

    for page in ("collections", "graph", "info"):
        driver.get(driver.base + f"{page}/")
        assert "django_rag" in driver.title
        shot(driver, page)


def test_an_upload_returns_at_once_and_its_progress_is_seen_to_complete(browser, tmp_path):
    """The default without a broker ("auto": the thread pool): the upload's response comes back
    while the embedder is still held shut, and the jobs page, polling, shows the job complete
    once it is let through, without a reload."""
    from selenium.webdriver.common.by import By

    from django_rag.models import Job
    from tests.embedders import GatedEmbedder

    driver = browser
    embedder = GatedEmbedder()
    text = tmp_path / "pump.txt"
    text.write_text("Prime the pump before the first start. " * 60)
    with override_settings(DJANGO_RAG={"EMBEDDER": embedder, "BACKGROUND": "auto"}):
        driver.get(driver.base + "documents/")
        form = driver.find_element(By.CSS_SELECTOR, "form[enctype='multipart/form-data']")
        form.find_element(By.NAME, "collection").clear()
        form.find_element(By.NAME, "collection").send_keys("manuals")
        form.find_element(By.NAME, "file").send_keys(str(text))
        form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
        wait_for(driver, lambda d: "/jobs/" in d.current_url)
        job = Job.objects.get(kind="ingest")
        row = driver.find_element(By.ID, f"job-{job.pk}")
        # Served while the work cannot have finished: the gate is still shut.
        assert not embedder.gate.is_set()
        assert row.get_attribute("data-status") in ("pending", "running")
        assert "queued as job" in driver.page_source
        assert "thread" in driver.find_element(By.ID, "background-mode").text
        shot(driver, "jobs-running")
        driver.execute_script("window.notReloaded = true;")

        assert embedder.entered.wait(30)  # the pool's thread is inside the job
        embedder.gate.set()
        wait_for(
            driver,
            lambda d: (
                d.find_element(By.ID, f"job-{job.pk}").get_attribute("data-status") == "completed"
            ),
        )
        assert driver.execute_script("return window.notReloaded === true;")  # htmx polling
        row = driver.find_element(By.ID, f"job-{job.pk}")
        assert "Chunk count" in row.text and "took" in row.text
        shot(driver, "jobs")
        row.find_element(By.CSS_SELECTOR, "table.kv a").click()  # the document id, linked
        wait_for(driver, lambda d: "Prime the pump" in d.page_source)
