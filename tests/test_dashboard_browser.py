"""End-to-end dashboard flows in headless Chromium (Debian's chromium + chromium-driver through
Selenium; never a downloaded browser). Screenshots of every page go to tests/artifacts/."""

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.test import override_settings

import django_rag as rag
from tests.conftest import stub_llm
from tests.helpers import make_pdf

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
ARTIFACTS = Path(os.environ.get("DJANGO_RAG_ARTIFACTS", Path(__file__).parent / "artifacts"))
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver") or "/usr/lib/chromium/chromedriver"


def chromium(tmp_path):
    """Headless Debian Chromium through its chromedriver (never a downloaded browser)."""
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
    return driver


@pytest.fixture
def browser(live_server, client, tmp_path):
    driver = chromium(tmp_path)
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
    """A screenshot of the whole page (up to 3000 px tall) at the window's width."""
    import base64

    size = driver.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
    image = driver.execute_cdp_cmd(
        "Page.captureScreenshot",
        {
            "format": "png",
            "captureBeyondViewport": True,
            "clip": {
                "x": 0,
                "y": 0,
                "width": size["width"],
                "height": min(size["height"], 3000),
                "scale": 1,
            },
        },
    )
    (ARTIFACTS / f"{name}.png").write_bytes(base64.b64decode(image["data"]))


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
    # Long unbroken titles and source ids wrap: the table fits the 1280 px window.
    rag.ingest("Untitled notes about the X200 drill's battery.", collection="manuals")
    rag.ingest(
        "A long one.",
        collection="manuals",
        title="Specification_" * 12,
        source_id="https://intranet.example/" + "very-long-path/" * 12,
    )
    driver.get(driver.base + "documents/")
    assert "Untitled notes about the X200" in driver.page_source
    assert driver.execute_script("return document.documentElement.scrollWidth <= window.innerWidth")
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
        # The source by its document's title (the PDF's own), not the file name.
        assert link.text.startswith("Generated Test PDF") and "#chunk-" in link.get_attribute(
            "href"
        )
        # As the other ways show it: "[1]" links to the chunk, the chunks given and the usage.
        marker = driver.find_element(By.CSS_SELECTOR, "#answer a")
        assert marker.text == "[1]" and marker.get_attribute("href") == link.get_attribute("href")
        rows = driver.find_elements(By.CSS_SELECTOR, "#stream-chunk-rows tr")
        assert rows and rows[0].text.startswith("cited Generated Test PDF")
        assert driver.find_element(By.ID, "stream-usage").text.startswith("1 LLM call, ")
        # A long unbroken title wraps in its cell: the page stays as wide as the window.
        assert driver.execute_script(
            "return document.documentElement.scrollWidth <= window.innerWidth"
        )
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
    driver.find_element(By.CSS_SELECTOR, "#run-form button").click()  # a second run: a chart
    wait_for(driver, lambda d: d.find_elements(By.ID, "metrics-chart"))
    shot(driver, "evaluation")
    driver.find_element(By.CSS_SELECTOR, "a[href*='/evaluation/runs/']").click()
    wait_for(driver, lambda d: d.find_elements(By.ID, "cases"))
    shot(driver, "evaluation-run")

    # Start a re-embed and see it finish.
    from django_rag.testing import HashingEmbedder

    rag.ingest("Legacy chunk.", collection="manuals", embedder=HashingEmbedder(model_name="old"))
    driver.get(driver.base + "maintenance/")
    driver.find_element(By.CSS_SELECTOR, "input[value=reembed]").find_element(
        By.XPATH, ".."
    ).find_element(By.CSS_SELECTOR, "button").click()
    wait_for(driver, lambda d: d.find_elements(By.ID, "confirm-form"))  # asked first
    shot(driver, "confirm")
    driver.find_element(By.CSS_SELECTOR, "#confirm-form button").click()
    wait_for(driver, lambda d: "Reembed finished" in d.page_source)
    assert driver.find_elements(By.CSS_SELECTOR, "tr.job-completed")
    shot(driver, "maintenance")

    for page in ("collections", "graph", "info"):
        driver.get(driver.base + f"{page}/")
        assert "django_rag" in driver.title
        shot(driver, page)

    # The graph of a small corpus (local extractors: no LLM), and an entity's neighbourhood.
    from django_rag.graph import build_graph
    from django_rag.models import Entity

    for text in (
        "Ada Lovelace worked with Charles Babbage on the Analytical Engine in London.",
        "Charles Babbage designed the Difference Engine; Ada Lovelace wrote its first program.",
        "Mary Somerville introduced Ada Lovelace to Charles Babbage at a London party.",
    ):
        rag.ingest(text, collection="history")
    settings = {
        "EMBEDDER": "hashing",
        "GRAPH": {
            "EXTRACTOR": None,
            "ENTITY_EXTRACTOR": "capitalized",
            "RELATIONSHIP_EXTRACTOR": "cooccurrence",
        },
    }
    with override_settings(DJANGO_RAG=settings):
        result = build_graph("history")
    hub = Entity.objects.filter(collection__name="history", normalized_name__contains="babbage")
    driver.get(driver.base + f"graph/?collection=history&entity={hub.first().pk}")
    counts = driver.find_element(By.ID, "graph-counts").text
    assert counts.startswith(f"{result['entities']} entities · {result['relationships']} rel")
    assert driver.find_elements(By.CSS_SELECTOR, "#neighbourhood text.label")
    shot(driver, "graph")

    # Both themes, as the browser renders them: every button's text on its background is AA.
    for scheme in ("light", "dark"):
        driver.execute_cdp_cmd(
            "Emulation.setEmulatedMedia",
            {"features": [{"name": "prefers-color-scheme", "value": scheme}]},
        )
        driver.get(driver.base + "collections/")
        ratios = driver.execute_script(CONTRAST_JS)
        assert ratios and min(ratios) >= 4.5, (scheme, ratios)
        if scheme == "dark":
            shot(driver, "collections-dark")


CONTRAST_JS = """
function lum(rgb) {
  const c = rgb.match(/\\d+(\\.\\d+)?/g).slice(0, 3).map(Number).map(v => v / 255)
    .map(v => v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4));
  return 0.2126 * c[0] + 0.7152 * c[1] + 0.0722 * c[2];
}
return [...document.querySelectorAll("button:not(.link):not(:disabled)")].map(b => {
  const s = getComputedStyle(b);
  const [hi, lo] = [lum(s.color), lum(s.backgroundColor)].sort((x, y) => y - x);
  return (hi + 0.05) / (lo + 0.05);
});
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _manage(project: Path, env: dict, *args: str, timeout: int = 300) -> str:
    result = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, f"manage.py {' '.join(args)}:\n{result.stdout}{result.stderr}"
    return result.stdout


def test_a_new_project_configured_from_getting_started_reaches_every_page(tmp_path):
    """django-admin startproject, then docs/getting-started.md's blocks appended as they are,
    its own embedded PostgreSQL, createsuperuser, runserver: every page through the login."""
    from selenium.webdriver.common.by import By

    from tests.test_getting_started import blocks_for

    driver = chromium(tmp_path)
    project = tmp_path / "proj"
    project.mkdir()
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL", "DJANGO_RAG_TEST_DB_NAME")
    }
    env["PYTHONPATH"] = str(Path(__file__).resolve().parent.parent)  # this checkout's django_rag
    subprocess.run(
        [sys.executable, "-m", "django", "startproject", "mysite", str(project)],
        check=True,
        env=env,
    )
    with open(project / "mysite" / "settings.py", "a") as settings:
        settings.write("\n" + "\n".join(blocks_for("settings.py")))
    with open(project / "mysite" / "urls.py", "a") as urls:
        urls.write("\n" + "\n".join(blocks_for("urls.py")))
    server = None
    try:
        _manage(project, env, "migrate", "--noinput")
        _manage(project, env, "check", "--database", "default")
        _manage(
            project,
            env | {"DJANGO_SUPERUSER_PASSWORD": "a-long-password-1"},
            "createsuperuser",
            "--noinput",
            "--username",
            "boss",
            "--email",
            "boss@example.com",
        )
        port = _free_port()
        server = subprocess.Popen(
            [sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload"],
            cwd=project,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert time.monotonic() < deadline and server.poll() is None, "runserver did not start"
            time.sleep(0.3)

        # /rag/ with no login page of the project's own: the admin's login, then back.
        driver.get(base + "/rag/")
        assert "/admin/login/?next=/rag/" in driver.current_url
        driver.find_element(By.ID, "id_username").send_keys("boss")
        driver.find_element(By.ID, "id_password").send_keys("a-long-password-1")
        driver.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
        wait_for(driver, lambda d: d.current_url.endswith("/rag/documents/"))
        header = driver.find_element(By.TAG_NAME, "header").text
        assert "boss" in header and "Admin" in header and "Log out" in header

        # A document to open (embedded by the default MiniLM in the server process).
        driver.find_element(By.NAME, "text").send_keys("Refunds take five business days.")
        driver.find_element(By.CSS_SELECTOR, "form[action$='/ingest/'] button").click()
        wait_for(driver, lambda d: "Refunds take five" in d.page_source and "/documents/" in (
            d.current_url), timeout=180)  # fmt: skip
        for page in (
            "documents/",
            "collections/",
            "search/?q=refunds",
            "ask/",
            "graph/",
            "evaluation/",
            "maintenance/",
            "info/",
        ):
            driver.get(base + "/rag/" + page)
            body = driver.find_element(By.TAG_NAME, "body").text
            assert "/rag/" in driver.current_url, page  # not sent to a login page
            assert driver.find_element(By.TAG_NAME, "h1").text, page
            assert "Traceback" not in body and "Server Error" not in body, page
            # Nothing wider than the 1280 px window (no horizontal scrolling).
            overflow = driver.execute_script(
                "return document.documentElement.scrollWidth - window.innerWidth"
            )
            assert overflow <= 0, f"{page} overflows by {overflow}px"
        driver.get(base + "/rag/search/?q=refunds")
        assert "Refunds take five business days." in driver.page_source

        # Log out (a POST), and the dashboard asks for the login again.
        driver.find_element(By.CSS_SELECTOR, "#logout-form button").click()
        driver.get(base + "/rag/")
        assert "/admin/login/" in driver.current_url
    finally:
        driver.quit()
        if server is not None:
            server.terminate()
            server.wait(timeout=30)
        # As getting-started says: the embedded server outlives manage.py until stopped.
        subprocess.run(
            [sys.executable, "-m", "django_rag.embedded", "stop", str(project / ".pgdata")],
            env=env,
            timeout=120,
        )
    assert not (project / ".pgdata" / "postmaster.pid").exists()


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
        chunks = Job.objects.get(pk=job.pk).result["chunk_count"]
        assert f"{chunks}/{chunks}" in row.text  # the progress counted chunk by chunk
        shot(driver, "jobs")
        row.find_element(By.CSS_SELECTOR, "table.kv a").click()  # the document id, linked
        wait_for(driver, lambda d: "Prime the pump" in d.page_source)


def test_pages_fit_a_400px_screen(browser):
    """At 400 px no page is wider than the window: wide tables scroll inside their own box
    (the page never scrolls sideways)."""
    long = "a_very_long_unbroken_source_identifier_" * 4
    rag.ingest(
        "The X200 warranty lasts two years. " * 40,
        collection="wide_collection_name_for_layout",
        title="A document with a rather long title " * 3,
        source_id=long,
        metadata={"department": "customer support and warranty"},
    )
    driver = browser
    driver.set_window_size(400, 900)
    width = driver.execute_script("return window.innerWidth")
    assert width <= 420, f"the window is {width} px wide"
    doc = rag.models.Document.objects.get()
    for page in [
        "",
        "documents/",
        f"documents/{doc.pk}/",
        "collections/",
        "search/?q=warranty&mode=fulltext",
        "ask/",
        "jobs/",
        "maintenance/",
        "evaluation/",
        "info/",
    ]:
        driver.get(driver.base + page)
        overflow = driver.execute_script(
            "return document.documentElement.scrollWidth - document.documentElement.clientWidth"
        )
        if overflow > 0:
            shot(driver, "narrow-" + (page.strip("/").split("/")[0] or "home"))
        assert overflow <= 0, f"{page or 'home'} is {overflow} px wider than a 400 px window"


HEADER_ROWS = """
const done = arguments[arguments.length - 1];
document.fonts.ready.then(() => requestAnimationFrame(() => done(measure())));
function measure() {
const header = document.querySelector("header");
const items = [...header.children].filter(e => e.getBoundingClientRect().width > 0);
const links = [...header.querySelectorAll("nav a")];
// On one line every box starts above the bottom of every other (centred boxes of different
// heights have different tops); a wrapped one starts below another's bottom.
const boxes = [...items, ...links].map(e => e.getBoundingClientRect());
const lowestTop = Math.max(...boxes.map(b => b.top));
const highestBottom = Math.min(...boxes.map(b => b.bottom));
// The room left between the sections and the counts (pushed right by margin-left: auto).
const slack = header.querySelector(".stats").getBoundingClientRect().left
  - header.querySelector("nav").getBoundingClientRect().right;
return {wrapped: lowestTop >= highestBottom, slack: Math.round(slack),
        right: Math.max(...boxes.map(b => b.right)), inside: document.documentElement.clientWidth,
        height: header.getBoundingClientRect().height, width: document.documentElement.scrollWidth};
}
"""


def test_the_header_fits_one_line_at_1280_px(browser):
    """The brand, every section, the counts and the user's tools on one line in a 1280 px
    window (they wrapped onto two), with a longer user name than most and large counts."""
    driver = browser
    User.objects.filter(username="e2e").update(username="maintenance-admin")
    for i in range(12):
        rag.ingest(f"Document {i} about pumps and valves.", collection="wide")
    driver.set_window_size(1280, 900)
    for page in ("documents/", "ask/", "jobs/"):
        driver.get(driver.base + page)
        layout = driver.execute_async_script(HEADER_ROWS)
        shot(driver, "header-1280-" + page.strip("/"))
        assert not layout["wrapped"], (page, layout)
        assert layout["right"] <= layout["inside"] and layout["width"] <= 1280, (page, layout)
        # With room to spare: fonts differ a little between machines.
        assert layout["slack"] >= 40, (page, layout)
