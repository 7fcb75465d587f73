"""The API's answers stream under an ASGI server as under a WSGI one, end to end: the test
project served by a real uvicorn (ASGI) and by Django's runserver (WSGI) in a child process,
the LLM the stub OpenAI server holding its answer after the first word until the test lets it
go. The first token reaches the client while the answer is still being written; a client that
leaves mid-stream stores no chat turn and is charged what was written; the server keeps no
database connection afterwards. And the chat box in headless Chromium under uvicorn."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ninja", reason="the API needs the 'api' extra (django-ninja)")

import requests  # noqa: E402
from django.contrib.auth.models import User  # noqa: E402
from django.db import connection  # noqa: E402
from django.test import Client  # noqa: E402

import django_rag as rag  # noqa: E402
from django_rag.api import limits  # noqa: E402
from django_rag.llm import estimate_tokens  # noqa: E402
from django_rag.models import Conversation, Message  # noqa: E402
from tests.conftest import stub_llm  # noqa: E402
from tests.helpers import wait_for  # noqa: E402
from tests.stub_openai import Held, StubOpenAI  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CSRF = "c" * 32
CURIE = "Marie Curie won the Nobel Prize in Chemistry in 1911 for discovering radium."
ANSWER = "Marie Curie won it in 1911 [1]."
LONG = " ".join(f"word{i}" for i in range(300)) + " [1]."
RESERVE = 8_000
APP_NAME = "django_rag_test_web"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def stub():
    with StubOpenAI() as server:
        yield server


@pytest.fixture(scope="module", params=["asgi", "wsgi"])
def server(request, stub, django_db_setup, tmp_path_factory):
    """The test project in a child process: uvicorn (ASGI) or runserver (WSGI), on the test
    database, the stub LLM, a token budget, and a file cache this process reads too."""
    if request.param == "asgi":
        pytest.importorskip("uvicorn")
    folder = tmp_path_factory.mktemp(request.param)
    port = free_port()
    rag_settings = {
        "EMBEDDER": "hashing",
        "LLM": stub_llm(stub),
        "API": {
            "RATE_LIMIT": None,
            "READ_ALL": "authenticated",
            "TOKEN_BUDGET": 100_000,
            "RESERVE_TOKENS": RESERVE,
        },
    }
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DJANGO_RAG_TEST_DATABASE": connection.settings_dict["NAME"],
        "DJANGO_RAG_TEST_APPLICATION_NAME": APP_NAME,
        "DJANGO_RAG_TEST_SETTINGS": json.dumps(rag_settings),
        "DJANGO_RAG_TEST_CACHE_DIR": str(folder / "cache"),
        "DJANGO_RAG_TEST_LEFT_LOG": str(folder / "left.log"),
        "PYTHONUNBUFFERED": "1",
    }
    if request.param == "asgi":
        command = ["-m", "uvicorn", "tests.asgi:application", "--lifespan", "off"]
        command += ["--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
    else:
        command = ["-m", "django", "runserver", f"127.0.0.1:{port}", "--noreload", "--skip-checks"]
    log = folder / "server.log"
    process = subprocess.Popen(
        [sys.executable, *command],
        cwd=ROOT,
        env=env,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"

    def up():
        if process.poll() is not None:
            raise AssertionError(f"the server exited\n{log.read_text()[-3000:]}")
        try:
            return requests.get(url + "/rag/api/collections", timeout=2).status_code == 401
        except requests.ConnectionError:
            return False

    try:
        wait_for(up, timeout=120, what=f"the {request.param} server", log=log)
        yield {
            "kind": request.param,
            "url": url,
            "log": log,
            "left": folder / "left.log",
            "cache": folder / "cache",
        }
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()


@pytest.fixture
def site(server, stub, settings, transactional_db):
    """The server, a logged-in client of it, and the test process reading the same cache."""
    settings.CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.filebased.FileBasedCache",
            "LOCATION": str(server["cache"]),
        }
    }
    rag.ingest(CURIE, collection="help", source_id="curie", title="Marie Curie")
    user = User.objects.create_user("streamer", password="pw")
    login = Client()
    login.force_login(user)
    session = requests.Session()
    session.cookies.update({"sessionid": login.cookies["sessionid"].value, "csrftoken": CSRF})
    session.headers["X-CSRFToken"] = CSRF
    stub.requests.clear()
    yield {**server, "session": session, "user": user}
    session.close()
    from django.core.cache import cache

    cache.clear()


def events(response):
    """``(event, data)`` pairs as they arrive on a streamed response: read with ``read1`` (what
    has arrived), never waiting for a block to fill (runserver's body is not chunked)."""
    buffer = b""
    while True:
        data = response.raw.read1(65536)
        if not data:
            return
        buffer += data
        while b"\n\n" in buffer:
            block, buffer = buffer.split(b"\n\n", 1)
            name, line = block.decode().split("\n")
            yield name[len("event: ") :], json.loads(line[len("data: ") :])


def server_connections() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", [APP_NAME]
        )
        return cursor.fetchone()[0]


def start_turn(site, message: str):
    conv = site["session"].post(site["url"] + "/rag/api/conversations", json={})
    assert conv.status_code == 201, conv.text
    return site["session"].post(
        f"{site['url']}/rag/api/conversations/{conv.json()['id']}/messages",
        json={"message": message, "limit": 1, "stream": True},
        stream=True,
        timeout=(10, 30),
    )


def test_the_first_token_arrives_while_the_answer_is_still_being_written(site, stub):
    held = stub.default = Held(ANSWER, after=1)
    try:
        with start_turn(site, "Who won in 1911?") as response:
            assert response.status_code == 200
            assert response.headers["Content-Type"].startswith("text/event-stream")
            stream = events(response)
            assert next(stream)[0] == "meta"
            # The LLM has written one word and waits for this test: the word reached us
            # while the server is still answering (under ASGI it used to wait for the end).
            assert next(stream) == ("token", {"text": "Marie "})
            assert not held.released.is_set()
            assert not Message.objects.exists()
            held.release()
            rest = list(stream)
    finally:
        held.release()
    names = [name for name, _ in rest]
    assert names[-1] == "done" and set(names[:-1]) == {"token"}
    written = "Marie " + "".join(data["text"] for name, data in rest if name == "token")
    done = rest[-1][1]
    assert written == done["text"] == ANSWER
    assert [c["source_id"] for c in done["citations"]] == ["curie"]
    # Stored once complete, charged the provider's usage, and no connection left behind.
    assert Message.objects.filter(role="assistant").get().pk == done["message_id"]
    assert Message.objects.count() == 2
    key = f"user:{site['user'].pk}"
    wait_for(lambda: limits.spent(key) != RESERVE, timeout=30, what="the settled budget")
    assert limits.spent(key) == done["usage"]["total_tokens"] > 0
    wait_for(lambda: server_connections() == 0, timeout=30, what="the server's connections")


def test_a_client_that_leaves_mid_stream_stores_no_turn_and_is_charged_what_was_written(site, stub):
    held = stub.default = Held(LONG, after=1)
    try:
        with start_turn(site, "Who won in 1911?") as response:
            stream = events(response)
            assert next(stream)[0] == "meta"
            assert next(stream) == ("token", {"text": "word0 "})
        # The client has gone. An ASGI server hears it at once (the test waits until it has);
        # a WSGI server finds out when a write fails, once the answer goes on.
        if site["kind"] == "asgi":
            wait_for(
                lambda: site["left"].exists() and "/messages" in site["left"].read_text(),
                timeout=30,
                what="the server to see its client leave",
                log=site["log"],
            )
        held.release()
        key = f"user:{site['user'].pk}"
        wait_for(lambda: limits.spent(key) != RESERVE, timeout=60, what="the settled budget")
    finally:
        held.release()
    # Nothing stored for the dropped turn, and the conversation is as it was.
    assert not Message.objects.exists()
    assert Conversation.objects.get().messages.count() == 0
    # Charged the prompt and the words written: at least the first, far from the whole answer.
    (request,) = stub.chat_requests
    prompt = estimate_tokens(sum(len(m["content"]) for m in request["body"]["messages"]))
    spent = limits.spent(key)
    assert prompt + estimate_tokens(len("word0 ")) <= spent < prompt + estimate_tokens(len(LONG))
    if site["kind"] == "asgi":
        # Stopped at the piece being made when the client left.
        assert spent <= prompt + estimate_tokens(len("word0 word1 word2 "))
    wait_for(lambda: server_connections() == 0, timeout=30, what="the server's connections")


@pytest.mark.slow
@pytest.mark.parametrize("server", ["asgi"], indirect=True)
def test_the_chat_box_under_uvicorn_shows_the_first_word_before_the_answer_ends(
    site, stub, tmp_path
):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    from tests.test_dashboard_browser import chromium

    driver = chromium(tmp_path)
    held = stub.default = Held(ANSWER, after=1)
    try:
        driver.get(site["url"] + "/static-missing")
        driver.add_cookie(
            {"name": "sessionid", "value": site["session"].cookies["sessionid"], "path": "/"}
        )
        driver.get(site["url"] + "/host/chat/")
        driver.find_element(By.CSS_SELECTOR, "[data-rag-input]").send_keys(
            "Who won in 1911?", Keys.ENTER
        )
        selector = ".rag-chat__message--assistant .rag-chat__text"

        def first_word_shown(d):
            texts = d.find_elements(By.CSS_SELECTOR, selector)
            return bool(texts) and texts[0].get_attribute("textContent") == "Marie "

        wait_for(lambda: first_word_shown(driver), timeout=30, what="the first word")
        # Shown while the answer is still being written: the LLM holds the rest.
        answer = driver.find_element(By.CSS_SELECTOR, ".rag-chat__message--assistant")
        assert "rag-chat__message--streaming" in answer.get_attribute("class")
        assert not held.released.is_set()
        held.release()
        wait_for(
            lambda: driver.find_elements(By.CSS_SELECTOR, ".rag-chat__source"),
            timeout=30,
            what="the finished answer",
        )
        assert driver.find_element(By.CSS_SELECTOR, selector).get_attribute("textContent") == ANSWER
        assert "streaming" not in answer.get_attribute("class")
        assert Message.objects.count() == 2
    finally:
        held.release()
        driver.quit()
