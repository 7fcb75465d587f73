"""The dashboard panels Arcana users rely on, with the Django test client: the Graph page's
relationship and community filters and details, a document's "Build graph", the Maintenance
page's embedding configuration and summary status, the Info page's reranker, grounder and
Loop, the Evaluation sub-navigation, correctness card and run deletion, Search's threshold."""

import pytest
from django.test import Client, override_settings

import django_rag as rag
from django_rag.models import (
    Entity,
    GraphChunk,
    Job,
    Run,
)
from django_rag.testing import ScriptedLLM
from tests.helpers import panel_graph, url
from tests.settings import LOCAL_GRAPH

pytestmark = pytest.mark.django_db


def only_a(user):
    return ["a"]


SCOPED = {"EMBEDDER": "hashing", "DASHBOARD": {"COLLECTIONS": "tests.test_dashboard_panels.only_a"}}


def rag_settings(**extra):
    return override_settings(DJANGO_RAG={"EMBEDDER": "hashing", **extra})


@pytest.fixture
def graph():
    return panel_graph()


def page(client, **params):
    response = client.get(url("graph"), params)
    assert response.status_code == 200, response.content[:500]
    return response.content.decode()


# --- Graph -------------------------------------------------------------------------------------


def test_relationships_filter_by_type_and_strength(staff, graph):
    body = page(staff, tab="relationships")
    assert all(t in body for t in ("WORKS_FOR", "ADVISES", "KNOWS", "OWNS"))
    assert "<option selected>WORKS_FOR</option>" not in body  # the type list, nothing chosen
    body = page(staff, tab="relationships", rtype="KNOWS")
    assert "KNOWS" in body and "ADVISES</td>" not in body and "WORKS_FOR</td>" not in body
    assert "<option selected>KNOWS</option>" in body
    body = page(staff, tab="relationships", strength="strong")
    assert "WORKS_FOR</td>" in body and "OWNS</td>" in body
    assert "ADVISES</td>" not in body and "KNOWS</td>" not in body
    assert "ADVISES</td>" in page(staff, tab="relationships", strength="medium")
    weak = page(staff, tab="relationships", strength="weak")
    assert "KNOWS</td>" in weak and "WORKS_FOR</td>" not in weak
    # Both filters together, and the pages keep them.
    body = page(staff, tab="relationships", strength="strong", rtype="OWNS", collection="b")
    assert "OWNS</td>" in body and "WORKS_FOR</td>" not in body
    # An unknown strength band is no filter (never a 500).
    assert "KNOWS</td>" in page(staff, tab="relationships", strength="<script>")


def test_relationship_detail_names_both_ends_and_links_them(staff, graph):
    rel = graph["rel_strong"]
    body = page(staff, tab="relationships", relationship=rel.pk)
    assert 'id="relationship-detail"' in body
    assert f"entity={graph['jane'].pk}" in body and f"entity={graph['acme'].pk}" in body
    assert "Since 2019." in body and "Strength 9.0" in body
    assert "Acme &lt;b&gt;Corp&lt;/b&gt;" in body and "payroll &lt;script&gt;" in body
    assert "<script>x" not in body
    assert f"relationship={rel.pk}" in page(staff, tab="relationships")  # the table links to it
    assert staff.get(url("graph"), {"relationship": 2**40}).status_code == 404
    assert staff.get(url("graph"), {"relationship": "x'; drop"}).status_code in (400, 404)
    with override_settings(DJANGO_RAG=SCOPED):
        assert staff.get(url("graph"), {"relationship": graph["rel_hidden"].pk}).status_code == 404
        assert "OWNS" not in page(staff, tab="relationships")


def test_community_detail_lists_member_names_with_links(staff, graph):
    community = graph["com_clean"]
    body = page(staff, tab="communities", community=community.pk)
    assert 'id="community-detail"' in body and "All three." in body
    for name in ("Jane Doe", "Bob", "Acme &lt;b&gt;Corp&lt;/b&gt;"):
        assert name in body
    for key in ("jane", "acme", "bob"):
        assert f"entity={graph[key].pk}" in body
    # The relationships among the members, strongest first.
    section = body[body.index('id="community-detail"') :]
    assert section.index("WORKS_FOR") < section.index("ADVISES") < section.index("KNOWS")
    assert "status-clean" in section
    dirty = page(staff, tab="communities", community=graph["com_dirty"].pk)
    assert "dirty</strong>" in dirty[dirty.index('id="community-detail"') :]
    with override_settings(DJANGO_RAG=SCOPED):
        assert staff.get(url("graph"), {"community": graph["com_hidden"].pk}).status_code == 404


def test_communities_show_status_and_filter_by_level_and_status(staff, graph):
    ids = {k: graph[f"com_{k}"].pk for k in ("dirty", "clean", "hidden")}

    def listed(**params):
        body = page(staff, tab="communities", **params)
        return {k for k, pk in ids.items() if f'community={pk}"' in body}

    assert listed() == {"dirty", "clean", "hidden"}
    assert listed(level=1) == {"clean"}
    assert listed(level=0) == {"dirty", "hidden"}
    assert listed(status="dirty") == {"dirty", "hidden"}  # a new community is dirty
    assert listed(status="clean") == {"clean"}
    assert listed(level=0, status="dirty", collection="a") == {"dirty"}
    assert listed(level="abc") == {"dirty", "clean", "hidden"}  # not a level: no filter
    body = page(staff, tab="communities")
    assert body.count('class="status-dirty">dirty') == 2 and 'class="status-clean">clean' in body
    assert "<option selected>1</option>" in page(staff, tab="communities", level=1)


# --- Documents: Build graph ----------------------------------------------------------------------


def test_build_graph_of_one_document_through_the_job(staff):
    with rag_settings(GRAPH=LOCAL_GRAPH):
        doc = rag.ingest("Alice Smith met Bob Jones in Paris.", collection="g")
        other = rag.ingest("Carol White visited Berlin.", collection="g")
        assert 'id="build-graph"' in staff.get(url("document", doc.pk)).content.decode()
        assert staff.get(url("build_document_graph", doc.pk)).status_code == 405
        response = staff.post(url("build_document_graph", doc.pk), follow=True)
    assert response.status_code == 200
    job = Job.objects.get(kind=Job.Kind.BUILD_GRAPH)
    assert job.params == {"collection": "g", "document": doc.pk}
    assert job.status == Job.Status.COMPLETED and job.result["chunks"] == 1
    names = set(Entity.objects.values_list("name", flat=True))
    assert {"Alice Smith", "Bob Jones"} <= names and "Carol White" not in names
    built = set(GraphChunk.objects.values_list("chunk__document_id", flat=True))
    assert built == {doc.pk}
    assert other.pk not in built
    assert "finished" in response.content.decode()
    jobs = staff.get(url("jobs")).content.decode()
    assert f'href="{url("document", doc.pk)}">document {doc.pk}</a>' in jobs


def test_build_graph_is_refused_cleanly(staff, client):
    with rag_settings(GRAPH={"EXTRACTOR": "no.such.Extractor"}):
        doc = rag.ingest("Alice Smith met Bob Jones.", collection="a")
        body = staff.post(url("build_document_graph", doc.pk), follow=True).content.decode()
    assert "The graph cannot be built" in body and "no.such.Extractor" in body
    assert not Job.objects.exists()
    with override_settings(DJANGO_RAG=SCOPED):
        hidden = rag.ingest("Secret Plan.", collection="b")
        assert staff.post(url("build_document_graph", hidden.pk)).status_code == 404
    assert staff.post(url("build_document_graph", 2**40)).status_code == 404
    assert not Job.objects.exists()
    # CSRF: a POST without the token is refused before anything runs.
    strict = Client(enforce_csrf_checks=True)
    strict.cookies = staff.cookies
    assert strict.post(url("build_document_graph", doc.pk)).status_code == 403
    assert not Job.objects.exists()


def test_build_graph_of_a_document_refuses_a_rebuild():
    from django_rag.exceptions import DocumentNotFound, InvalidOption
    from django_rag.graph import build_graph

    with rag_settings(GRAPH=LOCAL_GRAPH):
        doc = rag.ingest("Alice Smith met Bob Jones.", collection="a")
        with pytest.raises(InvalidOption):
            build_graph(document=doc.pk, resume=False)
        with pytest.raises(DocumentNotFound):
            build_graph("b", document=doc.pk)  # not a document of that collection
        with pytest.raises(DocumentNotFound):
            build_graph(document=2**40)
        assert build_graph(document=doc.pk)["chunks"] == 1
        assert build_graph(document=doc.pk)["chunks"] == 0  # processed: nothing new


# --- Maintenance -------------------------------------------------------------------------------


def test_maintenance_shows_the_embedding_configuration(staff):
    from django_rag.embeddings import get_embedder

    with rag_settings():
        body = staff.get(url("maintenance")).content.decode()
        embedder = get_embedder()
    section = body[body.index('id="embedding-config"') :]
    assert embedder.model_name in section and f"{embedder.dimensions} dimensions" in section
    assert "VECTOR_INDEX_TYPE" in section


def test_maintenance_counts_communities_to_summarize_like_the_summarizer(staff, graph):
    from django_rag.graph import communities_to_summarize, summarize_communities

    def count(body):
        return body[body.index('id="to-summarize"') :].split("</p>")[0]

    llm = ScriptedLLM("A summary.")
    with rag_settings(LLM=llm):
        # Levels [0] by default: the two level-0 communities (dirty, never summarised).
        assert "<strong>2</strong> communities need summarizing" in count(
            staff.get(url("maintenance")).content.decode()
        )
        assert communities_to_summarize("a") == 1
        assert summarize_communities("a")["summaries"] == 1
        assert "<strong>1</strong> community needs summarizing" in count(
            staff.get(url("maintenance")).content.decode()
        )
    with override_settings(DJANGO_RAG={**SCOPED, "LLM": llm}):  # only the user's collections
        assert "<strong>0</strong> communities need" in count(
            staff.get(url("maintenance")).content.decode()
        )


def test_summarise_is_disabled_without_an_llm(staff, graph):
    with rag_settings():
        body = staff.get(url("maintenance")).content.decode()
        assert 'value="summarize_communities" id="summarize" disabled' in body
        assert "Summarising needs an LLM: No LLM is configured." in body
        page = staff.post(
            url("maintenance"), {"action": "summarize_communities", "confirmed": "yes"}, follow=True
        )
        assert "Summarising needs an LLM" in page.content.decode()
    assert not Job.objects.exists()
    with rag_settings(LLM=ScriptedLLM("A summary.")):
        assert 'id="summarize">' in staff.get(url("maintenance")).content.decode()
    # A summarizer of its own needs no LLM.
    with rag_settings(GRAPH={"COMMUNITY_SUMMARIZER": lambda entities, relationships: "S."}):
        assert 'id="summarize">' in staff.get(url("maintenance")).content.decode()


# --- Info ----------------------------------------------------------------------------------------


def test_info_shows_reranker_grounder_and_loop(staff):
    with rag_settings():
        body = staff.get(url("info")).content.decode()
    reranker = body[body.index('id="info-reranker"') :]
    assert "None: search() does not rerank" in reranker.split("</section>")[0]
    assert "LLMGrounder" in body[body.index('id="info-grounder"') :].split("</section>")[0]
    loop = body[body.index('id="info-loop"') :].split("</section>")[0]
    assert "<td>10</td>" in loop and "5 / 20" in loop and "30 (keep_sources “best”)" in loop
    assert "300.0 s" in loop  # AGENT_DEADLINE
    with rag_settings(RERANKER="no.such.Reranker", GROUNDER=None, AGENT_DEADLINE=None):
        body = staff.get(url("info")).content.decode()
    assert "cannot be built" in body and "no.such.Reranker" in body
    assert "None: <code>ground=True</code> needs a grounder." in body
    assert "<td>none</td>" in body


def test_info_service_describes_components():
    from django_rag.maintenance import components

    with rag_settings(RERANKER=lambda query, results: [1.0] * len(results), GROUNDER="embedding"):
        found = components()
    assert found["reranker"]["label"].startswith("CallableReranker")
    assert found["grounder"]["label"].startswith("EmbeddingGrounder")
    assert found["loop"]["max_iterations"] == 10 and found["loop"]["deadline"] == 300.0


# --- Evaluation ----------------------------------------------------------------------------------


def judged_run(**extra):
    results = [
        {"question": "q1", "first_relevant_rank": 1, "mrr": 1.0, "recall_at_5": 1.0,
         "correctness": 9.0, "faithfulness": 8.0, "answer": "A."},
        {"question": "q2", "first_relevant_rank": None, "mrr": 0.0, "recall_at_5": 0.0,
         "correctness": 3.0, "faithfulness": 10.0, "answer": "B."},
        {"question": "q3", "first_relevant_rank": 2, "mrr": 0.5, "recall_at_5": 1.0,
         "faithfulness": 6.0, "answer": "C."},
    ]  # fmt: skip
    return Run.objects.create(
        status="completed", mode="hybrid", test_case_count=3, results=results,
        config={"evaluate_answers": True, "collections": ["a"]},
        metrics={"recall_at_5": 0.667, "mrr": 0.5, "correctness": 6.0, "faithfulness": 8.0},
        **extra,
    )  # fmt: skip


def test_evaluation_sub_navigation(staff):
    run = judged_run()
    overview = staff.get(url("evaluation")).content.decode()
    assert 'id="evaluation-nav"' in overview and 'id="runs"' in overview
    assert "Test cases (0)" in overview
    runs = staff.get(url("evaluation"), {"view": "runs"}).content.decode()
    assert 'id="runs"' in runs and "Test cases (0)" not in runs and 'id="generate-form"' not in runs
    assert '?view=runs" aria-current="page"' in runs
    cases = staff.get(url("evaluation"), {"view": "cases"}).content.decode()
    assert "Test cases (0)" in cases and 'id="runs"' not in cases and 'id="run-form"' not in cases
    one = staff.get(url("evaluation_run", run.pk)).content.decode()
    nav = one[one.index('id="evaluation-nav"') :].split("</nav>")[0]
    assert f'evaluation/runs/{run.pk}/" aria-current="page">Run {run.pk}' in nav
    assert "?view=cases" in nav and "?view=runs" in nav


def test_run_correctness_card(staff):
    run = judged_run()
    body = staff.get(url("evaluation_run", run.pk)).content.decode()
    card = body[body.index('id="correctness-card"') :].split("</section>")[0]
    assert "6.0 / 10" in card and "1 of 2 graded cases correct (7 or more)" in card
    assert "8.0 / 10</strong> over 3 cases" in card
    plain = Run.objects.create(status="completed", mode="hybrid", results=[{"question": "q"}])
    assert (
        'id="correctness-card"' not in staff.get(url("evaluation_run", plain.pk)).content.decode()
    )


def test_run_deletion_asks_first_and_is_scoped(staff):
    run = judged_run()
    listing = staff.get(url("evaluation"), {"view": "runs"}).content.decode()
    assert f'name="run" value="{run.pk}"' in listing
    page = staff.post(url("evaluation"), {"action": "delete_run", "run": run.pk})
    body = page.content.decode()
    assert (
        page.status_code == 200 and 'id="confirm-form"' in body and f"Delete run {run.pk}?" in body
    )
    assert Run.objects.filter(pk=run.pk).exists()  # asked first
    done = staff.post(
        url("evaluation"), {"action": "delete_run", "run": run.pk, "confirmed": "yes"}
    )
    assert done.status_code == 302 and done["Location"].endswith("?view=runs")
    assert not Run.objects.filter(pk=run.pk).exists()
    running = Run.objects.create(status="running", mode="hybrid")
    page = staff.post(
        url("evaluation"), {"action": "delete_run", "run": running.pk, "confirmed": "yes"},
        follow=True,
    )  # fmt: skip
    assert "still running" in page.content.decode() and Run.objects.filter(pk=running.pk).exists()
    other = judged_run()
    Run.objects.filter(pk=other.pk).update(config={"collections": ["a", "b"]})
    with override_settings(DJANGO_RAG=SCOPED):
        response = staff.post(
            url("evaluation"), {"action": "delete_run", "run": other.pk, "confirmed": "yes"}
        )
        assert response.status_code == 404 and Run.objects.filter(pk=other.pk).exists()
    assert staff.post(url("evaluation"), {"action": "delete_run", "run": "x"}).status_code in (
        400,
        404,
    )


# --- Search --------------------------------------------------------------------------------------


def test_search_threshold_is_passed_and_validated(staff):
    from django_rag.retrieval.service import search

    with rag_settings():
        rag.ingest("Refunds take fourteen days to process.", collection="a")
        rag.ingest("The office dog is called Biscuit.", collection="a")
        params = {"q": "refunds fourteen days", "mode": "semantic"}
        scores = [r.score for r in search(params["q"], mode="semantic")]
        assert len(scores) == 2 and scores[0] > scores[1]
        cut = (scores[0] + scores[1]) / 2
        body = staff.get(url("search"), params).content.decode()
        assert "Refunds take" in body and "Biscuit" in body
        body = staff.get(url("search"), {**params, "threshold": cut}).content.decode()
        assert "Refunds take" in body and "Biscuit" not in body
        assert f'name="threshold" value="{cut}"' in body
        for bad in ("abc", "nan", "inf", "1e999"):
            response = staff.get(url("search"), {**params, "threshold": bad})
            body = response.content.decode()
            assert response.status_code == 200, bad
            assert "Check the search options: threshold" in body, bad
            assert "Refunds take" not in body


def test_info_never_shows_a_components_secret(staff):
    secret = "sk-live-0123456789abcdefghij"
    spec = {"BACKEND": "no.such.Reranker", "OPTIONS": {"api_key": secret}}
    with rag_settings(RERANKER=spec):
        body = staff.get(url("info")).content.decode()
    reranker = body[body.index('id="info-reranker"') :].split("</section>")[0]
    assert "cannot be built" in reranker and "no.such.Reranker" in reranker
    assert secret not in body
