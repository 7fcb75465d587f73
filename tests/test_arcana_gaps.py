"""Arcana parity gaps of issue 25 (per-call ef_search, collection descriptions and strict
ingest, the document read API, ...), each against real PostgreSQL + pgvector."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

import django_rag as rag
from django_rag.exceptions import InvalidOption

pytestmark = pytest.mark.django_db


def _ef_search_settings(captured):
    sql = " ".join(query["sql"] for query in captured.captured_queries)
    return sql.count("set_config('hnsw.ef_search'"), sql


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("mode", ["semantic", "hybrid"])
def test_per_call_hnsw_ef_search_is_set_for_the_search_only(mode):
    for i in range(3):
        rag.ingest(f"Refunds take {i + 10} days to reach the card.", collection="ef")
    with connection.cursor() as cursor:
        cursor.execute("SHOW hnsw.ef_search")
        before = cursor.fetchone()[0]
    with CaptureQueriesContext(connection) as captured:
        results = rag.search("refunds card", mode=mode, limit=2, hnsw_ef_search=37)
    count, sql = _ef_search_settings(captured)
    assert count == 1 and "set_config('hnsw.ef_search', '37', true)" in sql
    assert len(results) == 2
    with connection.cursor() as cursor:  # SET LOCAL: gone with the search's transaction
        cursor.execute("SHOW hnsw.ef_search")
        assert cursor.fetchone()[0] == before
    # Raised to the rows the scan must return when smaller, as the setting is (hybrid's
    # semantic side reads limit x candidates).
    with CaptureQueriesContext(connection) as captured:
        rag.search("refunds card", mode=mode, limit=3, candidates=4, hnsw_ef_search=1)
    raised = 3 if mode == "semantic" else 12
    assert f"set_config('hnsw.ef_search', '{raised}', true)" in _ef_search_settings(captured)[1]


def test_hnsw_ef_search_defaults_to_the_setting(settings):
    rag.ingest("Refunds take ten days.", collection="ef")
    settings.DJANGO_RAG = {**settings.DJANGO_RAG, "SEARCH": {"HNSW_EF_SEARCH": 55}}
    with CaptureQueriesContext(connection) as captured:
        rag.search("refunds", limit=1)
    assert "set_config('hnsw.ef_search', '55', true)" in _ef_search_settings(captured)[1]


@pytest.mark.parametrize("value", [0, 1001, "40", 2.5, True])
def test_hnsw_ef_search_out_of_range_is_refused_before_any_query(value):
    with CaptureQueriesContext(connection) as captured, pytest.raises(InvalidOption) as caught:
        rag.search("refunds", hnsw_ef_search=value)
    assert "hnsw_ef_search must be an integer from 1 to 1000" in str(caught.value)
    assert caught.value.code == "invalid_option"
    assert captured.captured_queries == []


# --- the document read API ----------------------------------------------------------------


def test_list_documents_newest_first_filtered_and_paged():
    from django_rag.models import Document

    a1 = rag.ingest("Alpha one.", collection="alpha", source_id="a1", metadata={"lang": "en"})
    a2 = rag.ingest("Alpha two.", collection="alpha", source_id="a2", metadata={"lang": "fr"})
    b1 = rag.ingest("Beta one.", collection="beta", source_id="b1")
    Document.objects.filter(pk=a2.pk).update(status="failed")

    listed = rag.list_documents()
    assert [d.pk for d in listed] == [b1.pk, a2.pk, a1.pk]
    with CaptureQueriesContext(connection) as captured:
        assert [d.collection.name for d in listed] == ["beta", "alpha", "alpha"]
    assert captured.captured_queries == []  # the collection came with the page
    assert [d.pk for d in rag.list_documents(collection="alpha")] == [a2.pk, a1.pk]
    assert [d.pk for d in rag.list_documents(collection=["beta", "alpha"], limit=2)] == [
        b1.pk,
        a2.pk,
    ]
    assert [d.pk for d in rag.list_documents(limit=2, offset=2)] == [a1.pk]
    assert rag.list_documents(limit=0) == []
    assert [d.pk for d in rag.list_documents(status="failed")] == [a2.pk]
    assert [d.pk for d in rag.list_documents(status=["completed"], collection="alpha")] == [a1.pk]
    assert [d.pk for d in rag.list_documents(source_id="b1")] == [b1.pk]
    assert [d.pk for d in rag.list_documents(metadata={"lang": "en"})] == [a1.pk]
    assert rag.list_documents(collection="nope") == []  # unknown: matches nothing
    assert listed[-1].content == "Alpha one."  # deferred, loaded on access

    assert rag.count_documents() == 3
    assert rag.count_documents(collection="alpha") == 2
    assert rag.count_documents(collection="alpha", status="completed") == 1
    assert rag.count_documents(collection="nope") == 0


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"limit": -1}, "limit must be an integer from 0 to 1000"),
        ({"limit": 1001}, "limit must be an integer from 0 to 1000"),
        ({"limit": "10"}, "limit must be an integer from 0 to 1000"),
        ({"offset": -5}, "offset must be an integer >= 0"),
        ({"offset": 1.5}, "offset must be an integer >= 0"),
        ({"status": "done"}, "status must be one of pending, processing, completed, failed"),
        ({"collection": 3}, "collection must be a name or a list of names"),
        ({"collection": [""]}, "collection names must be non-empty strings"),
        # The same name checks as search (one function): blank or over 255 characters.
        ({"collection": ["ok", " "]}, "collection must be a non-empty name of at most 255"),
        ({"collection": "x" * 256}, "collection must be a non-empty name of at most 255"),
    ],
)
def test_list_documents_refuses_bad_options_with_a_typed_error(options, message):
    with pytest.raises(InvalidOption, match=message):
        rag.list_documents(**options)
    if set(options) - {"limit", "offset"}:
        with pytest.raises(InvalidOption, match=message):
            rag.count_documents(**options)


def test_get_document_returns_it_or_raises_document_not_found():
    from django_rag.exceptions import DocumentNotFound

    doc = rag.ingest("Gamma.", collection="gamma")
    with CaptureQueriesContext(connection) as captured:
        got = rag.get_document(doc.pk)
        assert got.collection.name == "gamma" and got.content == "Gamma."
    assert len(captured.captured_queries) == 1
    assert rag.get_document(str(doc.pk)).pk == doc.pk
    for bad in (doc.pk + 1000, "abc", None, -1, 0, True, 2**70, "12abc"):
        with pytest.raises(DocumentNotFound) as caught:
            rag.get_document(bad)
        assert caught.value.code == "document_not_found"


# --- collection={name, description} and strict ingest ----------------------------------------


def test_ingest_with_a_collection_mapping_creates_it_with_its_description():
    from django_rag.models import Collection

    doc = rag.ingest(
        "Refunds take ten days.", collection={"name": "policies", "description": "HR policies"}
    )
    assert doc.collection.name == "policies"
    assert Collection.objects.get(name="policies").description == "HR policies"
    # A stored description is kept; only an empty one is filled.
    rag.ingest("Leave is 25 days.", collection={"name": "policies", "description": "Other"})
    assert Collection.objects.get(name="policies").description == "HR policies"
    Collection.objects.create(name="blank")
    rag.ingest("Blank at first.", collection={"name": "blank", "description": "Filled"})
    assert Collection.objects.get(name="blank").description == "Filled"
    rag.ingest("No description.", collection={"name": "bare"})
    assert Collection.objects.get(name="bare").description == ""
    many = rag.ingest_many(["One.", "Two."], collection={"name": "batch", "description": "B"})
    assert {d.collection.name for d in many} == {"batch"}
    assert Collection.objects.get(name="batch").description == "B"
    upload = rag.ingest_bytes(
        b"Uploaded text.", filename="a.txt", collection={"name": "files", "description": "F"}
    )
    assert upload.collection.name == "files"
    assert Collection.objects.get(name="files").description == "F"


@pytest.mark.parametrize(
    ("collection", "message"),
    [
        ({"name": "x", "descr": "typo"}, "takes the keys name, description, got 'descr'"),
        ({"description": "no name"}, 'needs a "name"'),
        ({"name": "x", "description": 3}, "description must be a string"),
        ({"name": ""}, "collection must be a non-empty name"),
    ],
)
def test_a_bad_collection_mapping_is_refused_before_anything_is_written(collection, message):
    from django_rag.models import Collection, Document

    with pytest.raises(InvalidOption, match=message):
        rag.ingest("Text.", collection=collection)
    assert not Document.objects.exists() and not Collection.objects.exists()


def test_an_invalid_document_does_not_write_the_description():
    from django_rag.exceptions import EmptyDocument
    from django_rag.models import Collection

    with pytest.raises(EmptyDocument):
        rag.ingest("   ", collection={"name": "never", "description": "D"})
    assert not Collection.objects.filter(name="never").exists()


def test_strict_ingest_refuses_an_unknown_collection_before_writing(settings):
    from django_rag.exceptions import UnknownCollection
    from django_rag.models import Collection, Document

    with pytest.raises(UnknownCollection) as caught:
        rag.ingest("Text.", collection="missing", strict_collections=True)
    assert caught.value.code == "unknown_collection"
    assert "Strict ingest" in str(caught.value) and "create it first" in str(caught.value)
    for call in (
        lambda: rag.ingest_many(["A."], collection="missing", strict_collections=True),
        lambda: rag.ingest_bytes(
            b"A.", filename="a.txt", collection="missing", strict_collections=True
        ),
        lambda: rag.ingest(
            "A.", collection={"name": "missing", "description": "D"}, strict_collections=True
        ),
    ):
        with pytest.raises(UnknownCollection):
            call()
    assert not Collection.objects.exists() and not Document.objects.exists()

    settings.DJANGO_RAG = {**settings.DJANGO_RAG, "STRICT_COLLECTIONS": True}
    with pytest.raises(UnknownCollection):
        rag.ingest("Text.", collection="missing")
    assert rag.ingest("Text.", collection="missing", strict_collections=False).pk
    assert rag.ingest("More text.", collection="missing").collection.name == "missing"
    with pytest.raises(InvalidOption, match="strict_collections must be True or False"):
        rag.ingest("Text.", collection="missing", strict_collections="yes")


# --- the step-pipeline Agent resolves its scope once --------------------------------------------


def _collection_lookups(captured):
    return [
        q["sql"]
        for q in captured.captured_queries
        if 'FROM "django_rag_collection"' in q["sql"] and "django_rag_chunk" not in q["sql"]
    ]


def test_the_agent_resolves_its_collections_once_per_run():
    rag.ingest("Plan A includes phone support.", collection="plans")
    rag.ingest("Phone support is open on weekdays.", collection="faq")
    rag.ingest("Phone support in the archive.", collection="archive")
    with CaptureQueriesContext(connection) as captured:
        agent = rag.Agent("phone support", collection=["plans", "faq"], mode="hybrid", llm="unused")
        agent.search()
        agent.search(collections=["faq", "plans"])  # the same names: no lookup again
    ctx = agent.context
    assert ctx.error is None, ctx.error
    assert {r.collection for r in ctx.results} == {"plans", "faq"}
    assert {c.collection for c in ctx.chunks} == {"plans", "faq"}
    assert len(_collection_lookups(captured)) == 1  # was 1 + one per search
    with CaptureQueriesContext(connection) as captured:
        agent.search(collections=["archive"])  # a name not read yet: one lookup
    assert len(_collection_lookups(captured)) == 1
    assert {c.collection for c in agent.context.chunks} == {"archive"}
    agent.search(collections=["nope"])
    assert type(agent.context.error).__name__ == "UnknownCollection"


# --- graph extensibility: per-call extractors on ingest ---------------------------------------


def _pairs(text):
    """A function extractor: capitalised words are entities, each next pair is related."""
    names = [w.strip(".,") for w in text.split() if w[:1].isupper()]
    entities = [{"name": n, "type": "THING"} for n in names]
    relationships = [
        {"source": a, "target": b, "type": "NEXT_TO"}
        for a, b in zip(names, names[1:], strict=False)
    ]
    return entities, relationships


def test_ingest_extracts_with_a_per_call_extractor(events):
    from django_rag.models import Entity, Relationship

    doc = rag.ingest("Alice met Bob in Paris.", collection="kb", extractor=_pairs)
    entities = Entity.objects.filter(collection=doc.collection)
    assert sorted(entities.values_list("name", flat=True)) == ["Alice", "Bob", "Paris"]
    assert set(entities.values_list("type", flat=True)) == {"thing"}  # types are lowercased
    assert Relationship.objects.filter(type="NEXT_TO").count() == 2
    builds = [m for kind, e, m in events if e == "graph.build" and kind == "start"]
    assert builds and builds[-1]["extractor"] == "CallableGraphExtractor"
    # Per-call entity + relationship extractors, by alias, and on ingest_many too.
    from django_rag.graph.extractors import CapitalizedEntityExtractor

    text = "We saw Carol and Dave in Rome."
    many = rag.ingest_many(
        [text],
        collection="kb2",
        entity_extractor="capitalized",
        relationship_extractor="cooccurrence",
    )
    stored = Entity.objects.filter(collection=many[0].collection)
    expected = {e.name for e in CapitalizedEntityExtractor().extract(text)}
    assert len(expected) >= 2 and set(stored.values_list("name", flat=True)) == expected
    assert Relationship.objects.filter(source__collection=many[0].collection).exists()


def test_a_per_call_extractor_with_graph_false_or_background_is_refused():
    from django_rag.models import Document

    with pytest.raises(InvalidOption, match="leave graph out or pass graph=True"):
        rag.ingest("Alice met Bob.", collection="kb", graph=False, extractor=_pairs)
    with pytest.raises(InvalidOption, match="a worker cannot receive per-call components"):
        rag.ingest("Alice met Bob.", collection="kb", background=True, extractor=_pairs)
    with pytest.raises(InvalidOption, match="a worker cannot receive per-call components"):
        rag.ingest_bytes(
            b"Alice met Bob.", filename="a.txt", background=True, entity_extractor="capitalized"
        )
    assert not Document.objects.exists()


# --- graph extensibility: pluggable community detector and summarizer --------------------------


def _two_halves(entity_ids, edges):
    """A detector: the lower and the upper half of the ids (one level)."""
    half = len(entity_ids) // 2
    return [list(entity_ids[:half]), list(entity_ids[half:])]


def _named(entities, relationships):
    return "Members: " + ", ".join(sorted(e.name for e in entities)) + f" ({len(relationships)})"


@pytest.fixture
def small_graph(db):
    rag.ingest("Alice met Bob in Paris. Carol met Dave in Rome.", collection="kb", extractor=_pairs)
    from django_rag.models import Entity

    return list(Entity.objects.filter(collection__name="kb").order_by("pk"))


def test_a_custom_community_detector_per_call_and_by_setting(small_graph, settings, events):
    from django_rag.graph import detect_communities
    from django_rag.models import Community

    ids = [e.pk for e in small_graph]
    assert len(ids) == 6
    result = detect_communities("kb", detector=_two_halves, min_size=2)
    assert result == {"collections": 1, "communities": 2}
    stored = sorted(sorted(c.entity_ids) for c in Community.objects.filter(level=0))
    assert stored == [ids[:3], ids[3:]]
    starts = [m for kind, e, m in events if e == "graph.community_detection" and kind == "start"]
    assert starts[-1]["detector"] == "_two_halves"

    settings.DJANGO_RAG = {
        **settings.DJANGO_RAG,
        "GRAPH": {"COMMUNITY_DETECTOR": "tests.test_arcana_gaps._two_halves"},
    }
    assert detect_communities("kb", min_size=1)["communities"] == 2


@pytest.mark.parametrize(
    ("returned", "problem"),
    [
        ("nope", "returned a str"),
        ([[[1.5]]], "a member 1.5 that is not an entity id"),
        ([[1.5]], "a community that is a float"),
        ([[10**9]], "not one of the collection's"),
        ([[[1]]] * 40, "40 levels"),
    ],
)
def test_a_bad_detector_answer_is_refused_and_the_old_communities_stay(
    small_graph, returned, problem
):
    from django_rag.graph import detect_communities
    from django_rag.models import Community

    detect_communities("kb", detector=_two_halves, min_size=2)
    before = sorted(sorted(c.entity_ids) for c in Community.objects.all())
    with pytest.raises(InvalidOption, match=problem):
        detect_communities("kb", detector=lambda ids, edges: returned)
    assert sorted(sorted(c.entity_ids) for c in Community.objects.all()) == before


def test_a_custom_community_summarizer_needs_no_llm(small_graph, settings):
    from django_rag.graph import detect_communities, summarize_communities
    from django_rag.models import Community

    detect_communities("kb", detector=_two_halves, min_size=2)
    result = summarize_communities("kb", summarizer=_named)
    assert result == {"communities": 2, "summaries": 2, "failed": 0}
    summaries = sorted(Community.objects.values_list("summary", flat=True))
    assert summaries == ["Members: Alice, Bob, Paris (2)", "Members: Carol, Dave, Rome (2)"]
    # Unchanged communities are not summarised again; a failing summarizer is a failure.
    assert summarize_communities("kb", summarizer=_named)["summaries"] == 0

    def broken(entities, relationships):
        raise RuntimeError("summarizer down")

    assert summarize_communities("kb", summarizer=broken, force=True) == {
        "communities": 2,
        "summaries": 0,
        "failed": 2,
    }
    assert sorted(Community.objects.values_list("summary", flat=True)) == summaries
    settings.DJANGO_RAG = {
        **settings.DJANGO_RAG,
        "GRAPH": {"COMMUNITY_SUMMARIZER": "tests.test_arcana_gaps._named"},
    }
    assert summarize_communities("kb", force=True)["summaries"] == 2
    # A reply that is not text is a failure too, never stored.
    assert summarize_communities("kb", summarizer=lambda e, r: 42, force=True)["failed"] == 2
    assert sorted(Community.objects.values_list("summary", flat=True)) == summaries
