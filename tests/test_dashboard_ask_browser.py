"""The Ask page's pipeline and loop modes in headless Chromium (Debian's chromium through
Selenium), the LLM being the local OpenAI-compatible stub server reached over HTTP through
litellm. Screenshots go to tests/artifacts/ (docs/images/dashboard-ask-*.png are copies)."""

import pytest
from django.test import override_settings

import django_rag as rag
from django_rag.models import Collection
from tests.conftest import stub_llm
from tests.helpers import (
    DECOMPOSE,
    EXPAND,
    GATE,
    JUDGE,
    RERANK,
    REWRITE,
    SELECT,
    SUFFICIENT,
)
from tests.stub_openai import ToolCalls
from tests.test_dashboard_browser import browser, shot, wait_for  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

CORRECT = "A reviewer checked"


def corpus():
    for collection, texts in {
        "products": [
            "The X200 drill has a 1200 watt motor and a two year warranty.",
            "The X100 drill has a 750 watt motor and weighs 2.1 kilograms.",
        ],
        "hr": ["Employees get 25 days of paid annual leave per year."],
    }.items():
        for text in texts:
            rag.ingest(text, collection=collection, title=text.split(" has ")[0][:30])
    Collection.objects.filter(name="products").update(description="Manuals of our power tools")


def choose(driver, kind):
    from selenium.webdriver.common.by import By

    driver.find_element(By.CSS_SELECTOR, f"input[name=kind][value={kind}]").click()


def test_pipeline_and_loop_modes_show_their_work(browser, stub_llm_server):  # noqa: F811
    from selenium.webdriver.common.by import By

    driver = browser
    corpus()
    settings = {"EMBEDDER": "hashing", "LLM": stub_llm(stub_llm_server)}
    # Rules match the last user message; the more specific prompts come first.
    stub_llm_server.rules = {
        CORRECT: "The X200 drill has a two year warranty [1].",
        JUDGE: '{"grounded": false, "feedback": "Name the drill."}',
        GATE: '{"needs_retrieval": true, "reasoning": "It asks about one of our products."}',
        REWRITE: "X200 drill warranty",
        SELECT: '{"collections": ["products"], "reasoning": "Drills are power tools."}',
        EXPAND: "X200 drill warranty guarantee years",
        DECOMPOSE: '{"sub_questions": ["X200 warranty length", "X200 guarantee terms"]}',
        SUFFICIENT: '{"sufficient": false, "follow_up_query": "X200 motor watt"}',
        RERANK: '{"1": 9, "2": 3}',
        "<sources>": "Two years [1].",
    }
    with override_settings(DJANGO_RAG=settings):
        driver.get(driver.base + "ask/")
        # The steps and the loop's options show only with their kind.
        steps = driver.find_element(By.ID, "pipeline-steps")
        assert not steps.is_displayed()
        choose(driver, "pipeline")
        assert steps.is_displayed()
        assert not driver.find_element(By.ID, "loop-options").is_displayed()
        driver.find_element(By.CSS_SELECTOR, "button[data-steps=all]").click()
        boxes = driver.find_elements(By.CSS_SELECTOR, "input[name=steps]")
        assert boxes and all(box.is_selected() for box in boxes)
        driver.find_element(By.CSS_SELECTOR, "button[data-steps=none]").click()
        assert not any(box.is_selected() for box in boxes)
        driver.find_element(By.CSS_SELECTOR, "button[data-steps=all]").click()
        # The grounding step is not scripted here: untick it.
        driver.find_element(By.CSS_SELECTOR, "input[name=steps][value=ground]").click()
        question = driver.find_element(By.NAME, "question")
        question.send_keys("Hi! What warranty does the X200 drill have?")
        driver.find_element(By.CSS_SELECTOR, "#id_mode option[value=fulltext]").click()
        driver.find_element(By.CSS_SELECTOR, "#ask-form button[type=submit]").click()
        wait_for(driver, lambda d: d.find_elements(By.ID, "work"))
        work = driver.find_element(By.ID, "work").text
        assert "It asks about one of our products." in work
        assert "X200 drill warranty" in work and "Drills are power tools." in work
        assert "X200 warranty length" in work and "X200 guarantee terms" in work
        assert "X200 motor watt" in work  # the reasoning step's follow-up search
        assert "Kept:" in work and "Dropped:" in work and "Name the drill." in work
        answer = driver.find_element(By.ID, "answer").text
        assert answer == "The X200 drill has a two year warranty [1]."
        assert driver.find_elements(By.CSS_SELECTOR, "#timeline .bar")
        assert all(
            request["body"].get("stream") is not True for request in stub_llm_server.chat_requests
        )
        shot(driver, "ask-pipeline")

        # The loop: the model searches (once outside the collections it may use), then answers.
        stub_llm_server.rules = {}
        stub_llm_server.chat = [
            ToolCalls(("search", {"query": "X200 warranty", "limit": 2})),
            ToolCalls(("search", {"query": "annual leave", "collection": "nowhere"})),
            ToolCalls(("answer", {"text": "The X200 has a two year warranty [1]."})),
        ]
        driver.get(driver.base + "ask/")
        choose(driver, "loop")
        assert driver.find_element(By.ID, "loop-options").is_displayed()
        assert not driver.find_element(By.ID, "pipeline-steps").is_displayed()
        driver.find_element(By.NAME, "question").send_keys("What warranty does the X200 have?")
        driver.find_element(By.CSS_SELECTOR, "#id_mode option[value=fulltext]").click()
        driver.find_element(By.CSS_SELECTOR, "#ask-form button[type=submit]").click()
        wait_for(driver, lambda d: d.find_elements(By.ID, "tool-calls"))
        assert driver.find_element(By.ID, "stop-reason").text == "answer"
        rows = driver.find_elements(By.CSS_SELECTOR, "#tool-calls tbody tr")
        assert [row.find_elements(By.TAG_NAME, "td")[1].text for row in rows] == [
            "search",
            "search",
            "answer",
        ]
        assert "nowhere" in rows[1].text and "case-failed" in rows[1].get_attribute("class")
        assert driver.find_element(By.ID, "answer").text == "The X200 has a two year warranty [1]."
        link = driver.find_element(By.CSS_SELECTOR, "#citations li a")
        assert "#chunk-" in link.get_attribute("href")
        sent = stub_llm_server.chat_requests[-1]["body"]
        assert [tool["function"]["name"] for tool in sent["tools"]][:3] == [
            "search",
            "answer",
            "give_up",
        ]
        shot(driver, "ask-loop")
