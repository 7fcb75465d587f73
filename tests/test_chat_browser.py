"""The embeddable chat box in headless Chromium on a plain host page: typing a question, the
streamed answer, a follow-up, a working citation link, the conversation kept across page loads.
Screenshots go to docs/images/ (shown in docs/chat.md) when DJANGO_RAG_SCREENSHOTS is set,
else to tests/artifacts/."""

import os
from pathlib import Path

import pytest

pytest.importorskip("ninja", reason="the chat box talks to the API ('api' extra)")

from django.contrib.auth.models import User  # noqa: E402
from django.core.cache import cache  # noqa: E402

import django_rag as rag  # noqa: E402
from tests.conftest import stub_llm  # noqa: E402
from tests.test_dashboard_browser import ARTIFACTS, chromium, wait_for  # noqa: E402

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
DOCS_IMAGES = Path(__file__).resolve().parent.parent / "docs" / "images"


def screenshot(driver, name):
    folder = DOCS_IMAGES if os.environ.get("DJANGO_RAG_SCREENSHOTS") else ARTIFACTS
    folder.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(folder / f"{name}.png"))


@pytest.fixture
def page(live_server, client, tmp_path, settings, stub_llm_server):
    cache.clear()
    settings.DJANGO_RAG = {
        "EMBEDDER": "hashing",
        "LLM": stub_llm(stub_llm_server),
        "API": {"READ_ALL": "authenticated"},  # the reader is not staff
    }
    rag.ingest(
        "Refunds are paid within 14 days of the return reaching our warehouse.",
        collection="help",
        source_id="refunds",
        title="Refund policy",
    )
    rag.ingest(
        "Opened products can be returned within 30 days; a 10% restocking fee applies.",
        collection="help",
        source_id="opened-products",
        title="Returning opened products",
    )
    driver = chromium(tmp_path)
    client.force_login(User.objects.create_user("reader", password="pw"))
    driver.get(live_server.url + "/static-missing")
    driver.add_cookie(
        {"name": "sessionid", "value": client.cookies["sessionid"].value, "path": "/"}
    )
    driver.set_window_size(900, 800)
    yield driver, live_server, stub_llm_server
    driver.quit()


def test_the_chat_box_streams_answers_and_links_citations(page):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    driver, server, stub = page
    stub.rules = {
        "<latest>\nAnd for opened ones?": "returning opened products",
        "returning opened products": "Opened products can come back within 30 days, minus a 10% fee [1].",
    }
    stub.default = "Refunds are paid within 14 days [1]."
    driver.get(server.url + "/host/chat/")
    box = driver.find_element(By.CSS_SELECTOR, "[data-rag-chat]")
    typed = box.find_element(By.CSS_SELECTOR, "[data-rag-input]")
    typed.send_keys("How long do refunds take?", Keys.ENTER)
    wait_for(driver, lambda d: d.find_elements(By.CSS_SELECTOR, ".rag-chat__source"))
    answers = driver.find_elements(By.CSS_SELECTOR, ".rag-chat__message--assistant")
    assert answers[0].find_element(By.CSS_SELECTOR, ".rag-chat__text").text == (
        "Refunds are paid within 14 days [1]."
    )
    # The answer arrived as a stream of token events (the stub sends one per word).
    assert stub.chat_requests[-1]["body"]["stream"] is True

    typed.send_keys("And for opened ones?", Keys.ENTER)
    wait_for(driver, lambda d: len(d.find_elements(By.CSS_SELECTOR, ".rag-chat__sources")) == 2)
    second = driver.find_elements(By.CSS_SELECTOR, ".rag-chat__message--assistant")[1]
    assert "30 days" in second.text
    link = second.find_element(By.CSS_SELECTOR, "a.rag-chat__source")
    assert link.text == "[1] Returning opened products"
    assert link.get_attribute("href") == server.url + "/help/opened-products/"
    screenshot(driver, "chat-box")

    # The conversation is kept for this user across page loads.
    driver.get(server.url + "/host/chat/")
    wait_for(driver, lambda d: len(d.find_elements(By.CSS_SELECTOR, ".rag-chat__message")) == 4)
    driver.find_elements(By.CSS_SELECTOR, "a.rag-chat__source")[-1].click()
    wait_for(driver, lambda d: d.current_url.endswith("/help/opened-products/"))
    assert driver.find_element(By.TAG_NAME, "h1").text == "Returning opened products"


def test_a_cut_stream_shows_an_incomplete_answer_not_a_finished_one(page):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    from tests.stub_openai import Drop

    driver, server, stub = page
    stub.default = Drop("Refunds are paid within fourteen days of", after=3)
    driver.get(server.url + "/host/chat/")
    driver.find_element(By.CSS_SELECTOR, "[data-rag-input]").send_keys("Refunds?", Keys.ENTER)
    wait_for(driver, lambda d: d.find_elements(By.CSS_SELECTOR, ".rag-chat__error"))
    answer = driver.find_element(By.CSS_SELECTOR, ".rag-chat__message--assistant")
    assert "incomplete" in answer.find_element(By.CSS_SELECTOR, ".rag-chat__error").text
    assert not answer.find_elements(By.CSS_SELECTOR, ".rag-chat__sources")
    screenshot(driver, "chat-box-error")


def test_an_answer_with_no_words_is_unavailable_and_a_failure_names_no_provider(page):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    from tests.stub_openai import Failure

    driver, server, stub = page
    stub.default = ""  # the model finishes without a word
    driver.get(server.url + "/host/chat/")
    typed = driver.find_element(By.CSS_SELECTOR, "[data-rag-input]")
    typed.send_keys("Refunds?", Keys.ENTER)
    wait_for(driver, lambda d: d.find_elements(By.CSS_SELECTOR, ".rag-chat__error"))
    answer = driver.find_element(By.CSS_SELECTOR, ".rag-chat__message--assistant")
    note = answer.find_element(By.CSS_SELECTOR, ".rag-chat__error").text
    assert note == "No answer is available for this question right now. Please try again later."
    assert "rag-chat__message--unavailable" in answer.get_attribute("class")

    stub.default = Failure(500, "upstream exploded")
    typed.send_keys("And opened products?", Keys.ENTER)
    wait_for(driver, lambda d: len(d.find_elements(By.CSS_SELECTOR, ".rag-chat__error")) == 2)
    note = driver.find_elements(By.CSS_SELECTOR, ".rag-chat__error")[1].text
    assert note == "The assistant is unavailable right now. Please try again later."
    shown = driver.find_element(By.CSS_SELECTOR, "[data-rag-log]").text
    for leak in ("openai", "gpt", "litellm", "Error", "incomplete", "upstream exploded"):
        assert leak not in shown
