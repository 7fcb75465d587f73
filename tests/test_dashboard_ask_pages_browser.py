"""The Ask page's client side in headless Chromium: switching ways moves to the way's page
and clears the last result, the per-phase all/none toggles, and the graph toggle following
the chosen collection."""

import pytest

import django_rag as rag
from django_rag.testing import ScriptedLLM
from tests.test_dashboard_ask_pages import settings
from tests.test_dashboard_browser import browser, wait_for  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def ticked(driver) -> list[str]:
    from selenium.webdriver.common.by import By

    return [
        box.get_attribute("value")
        for box in driver.find_elements(By.CSS_SELECTOR, "input[name=steps]")
        if box.is_selected()
    ]


def phase_button(driver, phase: str, which: str):
    from selenium.webdriver.common.by import By

    return driver.find_element(By.CSS_SELECTOR, f"button[data-steps={which}][data-phase={phase}]")


def test_switching_ways_clears_the_result_and_toggles_work_per_phase(browser):  # noqa: F811
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    driver = browser
    with settings():
        rag.ingest("Notes on a and b.", collection="kb", title="AB notes", graph=True)
        rag.ingest("Nothing but x y z.", collection="plain", title="Plain", graph=True)

    with settings(ScriptedLLM(default="Piped answer [1].")):
        driver.get(driver.base + "ask/pipeline/")
        assert driver.find_element(By.ID, "pipeline-steps").is_displayed()
        # Per phase: all ticks that phase's steps only, none clears them only.
        phase_button(driver, "query", "all").click()
        assert ticked(driver) == ["gate", "rewrite", "select", "expand", "decompose"]
        phase_button(driver, "answer", "all").click()
        assert ticked(driver)[-2:] == ["self_correct", "ground"]
        phase_button(driver, "query", "none").click()
        assert ticked(driver) == ["self_correct", "ground"]
        phase_button(driver, "results", "all").click()
        assert ticked(driver) == ["reason", "rerank", "self_correct", "ground"]
        driver.find_element(By.CSS_SELECTOR, "button[data-steps=none]:not([data-phase])").click()
        assert ticked(driver) == []

        # The graph toggle follows the chosen collection.
        option = driver.find_element(By.ID, "graph-option")
        assert option.is_displayed()  # none chosen, and "kb" has a graph
        choice = Select(driver.find_element(By.NAME, "collection"))
        driver.find_element(By.NAME, "graph").click()
        choice.select_by_value("plain")
        assert not option.is_displayed()
        assert not driver.find_element(By.NAME, "graph").is_selected()  # not sent hidden
        choice.select_by_value("kb")
        assert option.is_displayed()

        # A pipeline answer, on the pipeline's page.
        driver.find_element(By.NAME, "question").send_keys("Notes about a?")
        driver.find_element(By.CSS_SELECTOR, "#id_mode option[value=fulltext]").click()
        driver.find_element(By.CSS_SELECTOR, "#ask-form button[type=submit]").click()
        wait_for(driver, lambda d: d.find_elements(By.ID, "work"))
        assert driver.current_url.endswith("/ask/pipeline/")
        assert driver.find_element(By.ID, "answer").text == "Piped answer [1]."

    # Switching to the loop (its link) clears that result and moves to the loop's page; the
    # question stays.
    driver.find_element(By.CSS_SELECTOR, "#ask-kind a[data-kind=loop]").click()
    assert driver.current_url.endswith("/ask/loop/")
    assert not driver.find_elements(By.ID, "work")
    assert not driver.find_element(By.ID, "answer-card").is_displayed()
    assert driver.find_element(By.ID, "answer").text == ""
    assert driver.find_element(By.ID, "loop-options").is_displayed()
    assert not driver.find_element(By.ID, "pipeline-steps").is_displayed()
    assert driver.find_element(By.CSS_SELECTOR, "input[name=kind][value=loop]").is_selected()
    assert driver.find_element(By.NAME, "question").get_attribute("value") == "Notes about a?"

    # The loop's answer, posted to the loop's page.
    with settings(ScriptedLLM(("answer", {"text": "From the loop."}))):
        driver.find_element(By.CSS_SELECTOR, "#ask-form button[type=submit]").click()
        wait_for(driver, lambda d: d.find_elements(By.ID, "tool-calls"))
    assert driver.current_url.endswith("/ask/loop/")
    assert driver.find_element(By.ID, "answer").text == "From the loop."

    # The radio switches too: back to the single ask, the loop's work is gone.
    driver.find_element(By.CSS_SELECTOR, "input[name=kind][value=ask]").click()
    assert driver.current_url.endswith("/ask/")
    assert not driver.find_elements(By.ID, "work")
    assert not driver.find_elements(By.ID, "usage-line")
    assert not driver.find_element(By.ID, "answer-card").is_displayed()
