"""The Ask page's sub-pages (one URL per way), its per-phase step toggles, the graph toggle
shown only for collections with a graph, and the graph-context panel (entities and
relationships linked to the Graph page, each graph chunk's "via")."""

import html
import re

import pytest
from django.test import override_settings

import django_rag as rag
from django_rag.agent.step_base import PHASES
from django_rag.agent.steps import STEPS
from django_rag.graph import MemoryGraphStore
from django_rag.models import Entity, Relationship
from django_rag.testing import ScriptedLLM
from tests.helpers import ANSWER, GATE, url
from tests.test_dashboard_ask import text_of
from tests.test_graph_stores import words_graph

pytestmark = pytest.mark.django_db


def letters(query, collection_ids):
    """An entity matcher: the entities named by the query's single letters a to h."""
    rows = Entity.objects.filter(name__in=re.findall(r"\b[a-h]\b", query))
    if collection_ids is not None:
        rows = rows.filter(collection_id__in=collection_ids)
    return list(rows.values_list("pk", flat=True))


def settings(llm=None, **extra):
    graph = {"ENABLED": False, "EXTRACTOR": words_graph, "ENTITY_MATCHER": letters, "DEPTH": 1}
    return override_settings(
        DJANGO_RAG={
            "EMBEDDER": "hashing",
            "LLM": llm or ScriptedLLM(default="About a [1]."),
            "GRAPH": graph,
            **extra,
        }
    )


def only_plain(user):
    return ["plain"]


@pytest.fixture
def graphed():
    """ "kb" has a graph (a-b, c-d-e, their chunks); "plain" has chunks and no entity."""
    with settings():
        rag.ingest("Notes on a and b.", collection="kb", title="AB notes", graph=True)
        rag.ingest("Notes on c, d and e.", collection="kb", title="CDE notes", graph=True)
        rag.ingest("Nothing but x y z.", collection="plain", title="Plain", graph=True)
    assert Entity.objects.filter(collection__name="plain").count() == 0
    return {e.name: e for e in Entity.objects.all()}


def ask(client, path, **data):
    data = {"question": "Tell me about a", "mode": "fulltext", "limit": 3, **data}
    response = client.post(path, data)
    assert response.status_code == 200
    return response.content.decode()


def checked_way(body: str) -> str:
    (way,) = re.findall(r'name="kind" value="(\w+)"[^>]*checked', body)
    return way


# --- 1. a page per way -------------------------------------------------------------------------


def test_each_way_has_its_page_and_the_how_choice_links_them(staff):
    pages = {
        "/ask/": "ask",
        "/ask/advanced/": "ask",  # Arcana's name for the single ask
        "/ask/pipeline/": "pipeline",
        "/ask/loop/": "loop",
    }
    with settings():
        for path, way in pages.items():
            response = staff.get(url("ask") + path[len("/ask/") :])
            assert response.status_code == 200, path
            body = response.content.decode()
            assert checked_way(body) == way
            action = {"ask": url("ask"), "pipeline": url("ask_pipeline"), "loop": url("ask_loop")}
            assert f'action="{action[way]}"' in body
            links = re.findall(r'<a href="([^"]+)" data-kind="(\w+)"', body)
            assert links == [
                (url("ask"), "ask"),
                (url("ask_pipeline"), "pipeline"),
                (url("ask_loop"), "loop"),
            ]
            assert f'href="{action[way]}" data-kind="{way}" aria-current="page"' in body
            assert 'class="active">Ask</a>' in body  # the nav marks Ask on every sub-page
        assert staff.get(url("ask") + "elsewhere/").status_code == 404


def test_a_page_shows_only_its_own_ways_result(staff, graphed):
    loop = ScriptedLLM(("answer", {"text": "From the loop."}))
    with settings(loop):
        # The loop's page runs the loop whatever the form says.
        body = ask(staff, url("ask_loop"), kind="pipeline", steps=["gate"])
    assert 'id="tool-calls"' in body and 'id="steps-run"' not in body
    assert text_of(body, "answer") == "From the loop."
    assert checked_way(body) == "loop"
    pipeline = ScriptedLLM(rules={GATE: '{"needs_retrieval": true}', ANSWER: "Piped [1]."})
    with settings(pipeline):
        body = ask(staff, url("ask_pipeline"), kind="ask", steps=["gate"])
    assert 'id="steps-run"' in body and 'id="tool-calls"' not in body
    assert text_of(body, "steps-run") == "Steps: gate → search → answer"
    with settings():
        body = ask(staff, url("ask_advanced"), kind="loop")
    assert text_of(body, "answer") == "About a [1]." and 'id="tool-calls"' not in body
    assert checked_way(body) == "ask"
    # The old page keeps reading the posted way (links and forms from before the sub-pages).
    with settings(ScriptedLLM(("answer", {"text": "Old loop link."}))):
        body = ask(staff, url("ask"), kind="loop")
    assert 'id="tool-calls"' in body and checked_way(body) == "loop"
    assert 'action="{}"'.format(url("ask_loop")) in body


# --- 3. per-phase toggles ----------------------------------------------------------------------


def test_each_phase_has_its_own_all_and_none(staff):
    with settings():
        body = staff.get(url("ask_pipeline")).content.decode()
    groups = re.findall(r'<div class="step-group" data-phase="(\w+)">(.*?)</div>', body, re.S)
    offered = [
        phase
        for phase in PHASES
        if any(
            s.phase == phase and s.pipeline and (not s.always or s.flags) for s in STEPS.values()
        )
    ]
    assert [phase for phase, _ in groups] == offered == ["query", "results", "answer"]
    for phase, inner in groups:
        assert f'data-steps="all" data-phase="{phase}"' in inner
        assert f'data-steps="none" data-phase="{phase}"' in inner
        boxes = re.findall(r'name="steps" value="(\w+)"', inner)
        registered = [
            name
            for s in STEPS.in_order()
            if s.phase == phase and s.pipeline
            for name in ([] if s.always else [s.name]) + [flag for flag, _ in s.flags]
        ]
        assert boxes == registered and boxes
    # The whole list's all/none stay.
    assert body.count('data-steps="all"') == len(groups) + 1


# --- 4. the graph toggle -----------------------------------------------------------------------


def graph_toggle(body: str) -> str | None:
    """ "shown" or "hidden" for the graph option, None when the page has none."""
    match = re.search(r'<p id="graph-option"( hidden)?>', body)
    if match is None:
        assert 'name="graph"' not in body
        return None
    return "hidden" if match.group(1) else "shown"


def test_the_graph_toggle_shows_only_for_collections_with_a_graph(staff, graphed):
    with settings():
        body = staff.get(url("ask")).content.decode()
        assert graph_toggle(body) == "shown"  # none chosen, and one visible has a graph
        names = re.search(r'id="graph-collections"[^>]*>(.*?)</script>', body).group(1)
        assert names == '["kb"]'
        assert graph_toggle(ask(staff, url("ask"), collection="plain")) == "hidden"
        assert graph_toggle(ask(staff, url("ask"), collection="kb")) == "shown"
    # A user who sees only the collection without a graph gets no toggle at all.
    with settings(DASHBOARD={"COLLECTIONS": "tests.test_dashboard_ask_pages.only_plain"}):
        assert graph_toggle(staff.get(url("ask_pipeline")).content.decode()) is None
    Entity.objects.all().delete()
    with settings():
        assert graph_toggle(staff.get(url("ask")).content.decode()) is None
    # Another graph store is asked for its counts.
    memory = MemoryGraphStore()
    with override_settings(
        DJANGO_RAG={"EMBEDDER": "hashing", "GRAPH": {"STORE": memory, "EXTRACTOR": words_graph}}
    ):
        rag.ingest("Notes on f and g.", collection="plain", graph=True, graph_store=memory)
        body = staff.get(url("ask")).content.decode()
    assert graph_toggle(body) == "shown" and 'id="graph-collections"' in body
    assert re.search(r'id="graph-collections"[^>]*>(.*?)</script>', body).group(1) == '["plain"]'


# --- 5. the graph context ----------------------------------------------------------------------


def graph_links(body: str, element_id: str) -> list[tuple[str, str]]:
    part = re.search(rf'id="{element_id}"[^>]*>(.*?)</(p|ul)>', body, re.S).group(1)
    return [
        (html.unescape(href), text)
        for href, text in re.findall(r'<a href="([^"]+)">(.*?)</a>', part)
    ]


def via_of(body: str, chunk_id: int) -> list[tuple[str, str]]:
    row = re.search(rf'<tr [^>]*data-chunk="{chunk_id}">(.*?)</tr>', body, re.S).group(1)
    via = re.search(r'class="muted via">via (.*?)</span>', row)
    if via is None:
        return []
    return re.findall(r'<a href="([^"]+)">([^<]*)</a>', via.group(1))


def test_the_graph_context_links_the_graph_page_and_says_via_what(staff, graphed):
    a, b = graphed["a"], graphed["b"]
    near = Relationship.objects.get(source=a, target=b)
    graph = url("graph")
    with settings():
        # Full-text finds both notes; the graph matches "a" and its neighbour "b".
        body = ask(staff, url("ask"), collection="kb", graph="on", question="Notes about a?")
    assert "Given to the LLM:" in body
    assert graph_links(body, "graph-entities") == [(f"{graph}?entity={a.pk}", "<strong>a</strong>")]
    assert graph_links(body, "graph-relationships") == [
        (f"{graph}?entity={a.pk}", "a"),
        (f"{graph}?tab=relationships&relationship={near.pk}", "—NEAR→"),
        (f"{graph}?entity={b.pk}", "b"),
    ]
    # The chunk the graph brought in says which entities did it: the matched "a" first, then
    # its neighbour "b"; the chunk on c, d and e has no graph score, so no via.
    ab = rag.search("Notes on a and b", mode="fulltext", collection="kb", limit=1)[0]
    cde = rag.search("Notes on c d e", mode="fulltext", collection="kb", limit=1)[0]
    assert via_of(body, ab.chunk_id) == [
        (f"{graph}?entity={a.pk}", "a"),
        (f"{graph}?entity={b.pk}", "b"),
    ]
    assert via_of(body, cde.chunk_id) == []
    # The links lead to the Graph page's details.
    entity_page = staff.get(f"{graph}?entity={a.pk}")
    assert entity_page.status_code == 200
    relationship_page = staff.get(f"{graph}?tab=relationships&relationship={near.pk}")
    assert relationship_page.status_code == 200 and "NEAR" in relationship_page.content.decode()


def test_the_pipeline_and_loop_show_what_the_question_matched(staff, graphed):
    a, c, d, e = (graphed[n] for n in "acde")
    graph = url("graph")
    with settings(ScriptedLLM(default="About c [1].")):
        body = ask(staff, url("ask_pipeline"), collection="kb", graph="on", question="And c?")
    assert "What the question matched in the graph" in body and "Given to the LLM" not in body
    assert graph_links(body, "graph-entities") == [(f"{graph}?entity={c.pk}", "<strong>c</strong>")]
    related = {text for _, text in graph_links(body, "graph-relationships")}
    assert {"c", "d", "e"} <= related and "a" not in related
    cde = rag.search("Notes on c d e", mode="fulltext", collection="kb", limit=1)[0]
    assert [name for _, name in via_of(body, cde.chunk_id)] == ["c", "d", "e"]
    assert f"?entity={a.pk}" not in body
    loop = ScriptedLLM(("search", {"query": "c"}), ("answer", {"text": "About c [1]."}))
    with settings(loop):
        body = ask(staff, url("ask_loop"), collection="kb", graph="on", question="And c?")
    assert [name for _, name in via_of(body, cde.chunk_id)] == ["c", "d", "e"]
    # Without the graph there is no panel.
    with settings():
        body = ask(staff, url("ask_pipeline"), collection="kb", question="And c?")
    assert 'id="graph-context"' not in body and 'class="muted via"' not in body


def test_the_graph_context_stays_in_the_users_collections(staff, graphed):
    with settings(DASHBOARD={"COLLECTIONS": "tests.test_dashboard_ask_pages.only_plain"}):
        body = ask(staff, url("ask_pipeline"), graph="on", question="Tell me about a")
    assert "graph-entities" not in body and "?entity=" not in body
