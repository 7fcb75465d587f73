"""The dashboard panels in headless Chromium: the Graph page's relationship and community
filters and details, a document's "Build graph", the disabled Summarise button, the Evaluation
sub-navigation and a run's deletion through its confirmation page."""

import pytest
from django.test import override_settings

import django_rag as rag
from django_rag.models import GraphChunk, Job, Run
from tests.helpers import panel_graph
from tests.settings import LOCAL_GRAPH
from tests.test_dashboard_browser import browser, shot, wait_for  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def choose(driver, name, value):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    select = Select(driver.find_element(By.NAME, name))
    if name in ("collection", "rtype", "level"):  # options whose text is their value
        select.select_by_visible_text(value)
    else:
        select.select_by_value(value)


def show(driver):
    from selenium.webdriver.common.by import By

    driver.find_element(By.CSS_SELECTOR, "form.filters button[type=submit]").click()


def test_graph_filters_and_details(browser):  # noqa: F811
    from selenium.webdriver.common.by import By

    driver = browser
    graph = panel_graph()
    driver.get(driver.base + "graph/?tab=relationships")
    rows = driver.find_elements(By.CSS_SELECTOR, "table tbody tr")
    assert len(rows) == 4
    choose(driver, "strength", "strong")
    choose(driver, "collection", "a")
    show(driver)
    wait_for(driver, lambda d: "strength=strong" in d.current_url)
    rows = driver.find_elements(By.CSS_SELECTOR, "table tbody tr")
    assert [r.find_elements(By.TAG_NAME, "td")[1].text for r in rows] == ["WORKS_FOR"]
    choose(driver, "strength", "")
    choose(driver, "rtype", "KNOWS")
    show(driver)
    wait_for(driver, lambda d: "rtype=KNOWS" in d.current_url)
    rows = driver.find_elements(By.CSS_SELECTOR, "table tbody tr")
    assert [r.find_elements(By.TAG_NAME, "td")[1].text for r in rows] == ["KNOWS"]
    # A relationship's detail, then its source entity's.
    driver.get(driver.base + "graph/?tab=relationships&strength=strong&collection=a")
    driver.find_element(By.CSS_SELECTOR, "a.relationship-link").click()
    detail = wait_for(driver, lambda d: d.find_element(By.ID, "relationship-detail"))
    assert "Since 2019." in detail.text and "Acme <b>Corp</b>" in detail.text
    shot(driver, "graph-relationship")
    detail.find_element(By.LINK_TEXT, "Jane Doe").click()
    entity = wait_for(driver, lambda d: d.find_element(By.ID, "entity-detail"))
    assert "Jane Doe" in entity.text and f"entity={graph['jane'].pk}" in driver.current_url
    # Communities: the level filter, the status column, a community's members.
    driver.get(driver.base + "graph/?tab=communities")
    assert driver.page_source.count('class="status-dirty"') == 2
    choose(driver, "level", "1")
    show(driver)
    wait_for(driver, lambda d: "level=1" in d.current_url)
    links = driver.find_elements(By.CSS_SELECTOR, "a.community-link")
    assert [link.text for link in links] == [str(graph["com_clean"].pk)]
    links[0].click()
    detail = wait_for(driver, lambda d: d.find_element(By.ID, "community-detail"))
    assert "clean" in detail.text and "All three." in detail.text
    members = [li.text for li in detail.find_elements(By.CSS_SELECTOR, "ul.members li")]
    assert [m.split(" ")[0] for m in members] == ["Acme", "Bob", "Jane"]
    shot(driver, "graph-community")
    detail.find_element(By.LINK_TEXT, "Bob").click()
    entity = wait_for(driver, lambda d: d.find_element(By.ID, "entity-detail"))
    assert entity.text.startswith("Bob")


def test_build_a_documents_graph_and_summarise_disabled(browser):  # noqa: F811
    from selenium.webdriver.common.by import By

    driver = browser
    with override_settings(
        DJANGO_RAG={"EMBEDDER": "hashing", "GRAPH": LOCAL_GRAPH, "BACKGROUND": "inline"}
    ):
        doc = rag.ingest("Alice Smith met Bob Jones in Paris.", collection="g")
        other = rag.ingest("Carol White visited Berlin.", collection="g")
        driver.get(driver.base + f"documents/{doc.pk}/")
        driver.find_element(By.CSS_SELECTOR, "#build-graph button").click()
        wait_for(driver, lambda d: "finished" in d.find_element(By.CLASS_NAME, "messages").text)
        assert Job.objects.get(kind=Job.Kind.BUILD_GRAPH).status == Job.Status.COMPLETED
        built = set(GraphChunk.objects.values_list("chunk__document_id", flat=True))
        assert built == {doc.pk} and other.pk not in built
        driver.get(driver.base + "maintenance/")
        button = driver.find_element(By.ID, "summarize")
        assert not button.is_enabled()
        assert "Summarising needs an LLM" in driver.find_element(By.ID, "summarize-why").text
        assert "hashing" in driver.find_element(By.ID, "embedding-config").text.lower()
        shot(driver, "maintenance-panels")


def test_evaluation_sub_navigation_and_run_deletion(browser):  # noqa: F811
    from selenium.webdriver.common.by import By

    driver = browser
    run = Run.objects.create(
        status="completed",
        mode="hybrid",
        test_case_count=1,
        config={"evaluate_answers": True},
        metrics={"recall_at_5": 1.0, "correctness": 8.0, "faithfulness": 9.0},
        results=[{"question": "q", "first_relevant_rank": 1, "correctness": 8.0,
                  "faithfulness": 9.0, "answer": "A."}],
    )  # fmt: skip
    driver.get(driver.base + "evaluation/")
    nav = driver.find_element(By.ID, "evaluation-nav")
    nav.find_element(By.LINK_TEXT, "Test cases").click()
    wait_for(driver, lambda d: "view=cases" in d.current_url)
    assert not driver.find_elements(By.ID, "runs")
    driver.find_element(By.ID, "evaluation-nav").find_element(By.LINK_TEXT, "Runs").click()
    wait_for(driver, lambda d: "view=runs" in d.current_url)
    driver.find_element(By.LINK_TEXT, f"Run {run.pk}").click()
    card = wait_for(driver, lambda d: d.find_element(By.ID, "correctness-card"))
    assert "8.0 / 10" in card.text and "1 of 1 graded case correct" in card.text
    current = driver.find_element(By.CSS_SELECTOR, "#evaluation-nav a[aria-current=page]")
    assert current.text == f"Run {run.pk}"
    shot(driver, "evaluation-run-card")
    driver.find_element(By.CSS_SELECTOR, "#delete-run button").click()
    confirm = wait_for(driver, lambda d: d.find_element(By.ID, "confirm-form"))
    assert f"Delete run {run.pk}?" in driver.find_element(By.ID, "confirm-title").text
    assert Run.objects.filter(pk=run.pk).exists()  # nothing deleted by the first click
    confirm.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    wait_for(driver, lambda d: "view=runs" in d.current_url)
    assert f"Run {run.pk} deleted." in driver.find_element(By.CLASS_NAME, "messages").text
    assert not Run.objects.filter(pk=run.pk).exists()
