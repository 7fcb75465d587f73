import numpy as np
import pytest
from django.db import connection

import django_rag as rag
from django_rag.exceptions import InvalidOption, InvalidSearchMode, UnknownCollection
from django_rag.models import Chunk, Collection
from django_rag.retrieval import MemoryVectorStore, SearchResult

pytestmark = pytest.mark.django_db

CORPUS = {
    "cats": "Cats are small domesticated carnivores. They purr, hunt mice and sleep most of the day.",
    "dogs": "Dogs are loyal companions; they bark, fetch sticks and love long walks in the park.",
    "python": "Python is a programming language with dynamic typing and a large standard library.",
    "postgres": "PostgreSQL is a relational database server; pgvector adds vector similarity search.",
    "bread": "To bake bread, mix flour, water, yeast and salt, knead the dough and let it rise.",
    "stocks": "The stock market fell as investors worried about inflation and interest rates.",
    "rain": "Heavy rain and thunderstorms are expected across the region this weekend.",
    "football": "The football team won the championship after a penalty shootout in the final.",
}

QUERIES = {
    "which pet meows and chases mice": "cats",
    "storing embeddings in an SQL database": "postgres",
    "recipe for a homemade loaf": "bread",
    "weather forecast for saturday": "rain",
    "soccer cup final result": "football",
    "interpreted scripting language": "python",
}


@pytest.mark.slow
def test_semantic_ranking_on_a_real_corpus(minilm):
    for key, text in CORPUS.items():
        rag.ingest(text, collection="kb", source_id=key, embedder=minilm)
    for query, expected in QUERIES.items():
        results = rag.search(query, collection="kb", limit=3, embedder=minilm)
        assert results[0].source_id == expected, (query, [r.source_id for r in results])
        assert results[0].score > results[1].score >= results[2].score


def test_results_carry_document_fields():
    doc = rag.ingest(
        "Apples and pears are fruit.",
        collection="fruit",
        source_id="f1",
        title="Fruit",
        metadata={"aisle": 3},
    )
    Chunk.objects.filter(document=doc).update(page_start=2, page_end=2, metadata={"part": "a"})
    (result,) = rag.search("apples", collection="fruit", limit=5)
    assert isinstance(result, SearchResult)
    assert (result.document_id, result.chunk_index, result.title, result.source_id) == (
        doc.pk,
        0,
        "Fruit",
        "f1",
    )
    assert (result.page_start, result.page_end) == (2, 2)
    assert result.metadata == {"aisle": 3, "part": "a"}
    assert result.semantic_score == result.score and result.fulltext_score is None
    data = result.to_dict()
    assert data["text"] == "Apples and pears are fruit." and data["collection"] == "fruit"


def test_a_semantic_search_is_one_round_trip_and_matches_the_chunk_path():
    """Round trips are behaviour: an unscoped semantic search sends one statement (the
    ef_search setting travels with the ranking query, which also reads the result columns);
    one scoped to a collection adds the collection lookup and the count that picks the exact
    scan. The results are those SearchResult.from_chunk builds from the queryset path."""
    from django.test.utils import CaptureQueriesContext

    from django_rag.embeddings import get_embedder

    # Rolled-back tests leave dead entries in the HNSW index that can crowd the few live rows
    # out of its scan; the search then stays complete through its exact fallback, with more
    # statements. Counting round trips is this test's point, not the index: keep the planner
    # off index scans (the test's transaction only).
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_indexscan = off")
    texts = ["Quokkas and wombats are marsupials.", "Quokka stew.", "Wombat burrow."]
    for i, text in enumerate(texts):
        doc = rag.ingest(text, collection="fruit", source_id=f"f{i}", metadata={"a": i})
    Chunk.objects.filter(document=doc).update(page_start=2, page_end=3, metadata={"part": "b"})
    rag.ingest("Wombats are not quokkas.", collection="other", source_id="p")
    for collection, statements in ((None, 1), ("fruit", 3)):
        rag.search("quokkas", mode="semantic", collection=collection)  # warm caches
        with CaptureQueriesContext(connection) as captured:
            results = rag.search("quokkas", mode="semantic", limit=3, collection=collection)
        assert len(captured.captured_queries) == statements, captured.captured_queries
        assert "set_config('hnsw.ef_search'" in captured.captured_queries[-1]["sql"] or collection
        chunks = Chunk.objects.all()
        if collection:
            chunks = chunks.filter(collection__name=collection)
        vector = get_embedder().embed_query("quokkas")
        expected = [SearchResult.from_chunk(c) for c in chunks.semantic(vector, limit=3)]
        assert results and [r.to_dict() for r in results] == [e.to_dict() for e in expected]


def test_fulltext_and_hybrid_read_statistics_once_and_match_the_chunk_path():
    """Full-text and hybrid searches read the BM25 statistics in one statement (corpus and
    terms together, once for both halves of hybrid; none on the pg_textsearch backend), load no
    Chunk objects, and return what the
    queryset path returns (same rows, order and scores)."""
    from django.test.utils import CaptureQueriesContext

    from django_rag.conf import search_setting
    from django_rag.embeddings import get_embedder
    from django_rag.models.textsearch import fulltext_backend

    texts = [
        "Quokkas and wombats are marsupials of Australia.",
        "A quokka stew would be a terrible idea.",
        "Wombat burrows are cube shaped, as are their droppings.",
        "Kangaroos hop; wombats dig; quokkas smile.",
        "Marsupials carry their young in a pouch.",
    ]
    for i, text in enumerate(texts):
        rag.ingest(text, collection="zoo", source_id=f"z{i}", metadata={"n": i})
    rag.ingest("Wombats are not quokkas, said the koala.", collection="other", source_id="k")
    vector = get_embedder().embed_query("quokka wombat marsupials")
    for collection in (None, "zoo"):
        chunks = Chunk.objects.all()
        scope = None
        if collection:
            chunks = chunks.filter(collection__name=collection)
            scope = [Collection.objects.get(name=collection).pk]
        for mode in ("fulltext", "hybrid"):
            rag.search("quokka wombat marsupials", mode=mode, collection=collection)  # warm
            with CaptureQueriesContext(connection) as captured:
                results = rag.search(
                    "quokka wombat marsupials", mode=mode, limit=4, collection=collection
                )
            sql = [" ".join(q["sql"].split()) for q in captured.captured_queries]
            # The pg_textsearch backend reads its statistics from the index instead.
            reads = 1 if fulltext_backend() == "sql" else 0
            assert sum("django_rag_corpus" in q for q in sql) == reads, sql
            assert sum("django_rag_term" in q for q in sql) == reads, sql
            orm_load = 'SELECT "django_rag_chunk"."id", "django_rag_chunk"."document_id"'
            assert not any(q.startswith(orm_load) for q in sql), sql
            if mode == "fulltext":
                rows = chunks.fulltext("quokka wombat marsupials", limit=4, statistics_from=scope)
            else:
                rows = chunks.hybrid(
                    vector,
                    "quokka wombat marsupials",
                    limit=4,
                    statistics_from=scope,
                    fusion=search_setting("FUSION"),
                    rrf_k=search_setting("RRF_K"),
                    semantic_weight=search_setting("SEMANTIC_WEIGHT"),
                    fulltext_weight=search_setting("FULLTEXT_WEIGHT"),
                    candidates=search_setting("CANDIDATES"),
                )
            expected = [SearchResult.from_chunk(c).to_dict() for c in rows]
            assert len(results) == 4
            assert [r.to_dict() for r in results] == expected


def test_collections_scope_and_unknown_names():
    rag.ingest("alpha text about apples", collection="one")
    rag.ingest("beta text about apples", collection="two")
    rag.ingest("gamma text about apples", collection="three")
    assert {r.collection for r in rag.search("apples", collection=["one", "two"])} == {"one", "two"}
    assert len(rag.search("apples")) == 3
    with pytest.raises(UnknownCollection, match="'nope'") as info:
        rag.search("apples", collection=["one", "nope"])
    assert info.value.code == "unknown_collection"
    assert rag.search("apples", collection=[]) == []


def test_threshold_limit_and_mode_validation():
    rag.ingest("threshold testing text", collection="t")
    results = rag.search("threshold testing text", threshold=0.99)
    assert len(results) == 1 and results[0].score >= 0.99
    assert rag.search("threshold testing text", threshold=1.01) == []
    assert len(rag.search("threshold", mode="vector")) == 1
    assert rag.search("   ") == []
    with pytest.raises(InvalidSearchMode, match="semantic"):
        rag.search("x", mode="magic")
    for bad in (0, -1, 1001, "5", True):
        with pytest.raises(InvalidOption):
            rag.search("x", limit=bad)


def test_memory_store_matches_pgvector():
    store = MemoryVectorStore()
    for key, text in CORPUS.items():
        rag.ingest(text, collection="kb", source_id=key)
        store.ingest(text, collection="kb", source_id=key)
    rag.ingest("unrelated other collection text about cats", collection="other")
    store.ingest("unrelated other collection text about cats", collection="other")

    def ranked(results):
        # Same order up to ties: group results by score.
        groups = {}
        for r in results:
            groups.setdefault(round(r.score, 4), set()).add((r.source_id, r.text))
        return sorted(groups.items(), reverse=True)

    for query in list(QUERIES) + ["cats and dogs", "database"]:
        for scope in ("kb", None, ["kb", "other"]):
            pg = rag.search(query, collection=scope, limit=20)
            memory = rag.search(query, collection=scope, limit=20, vector_store=store)
            assert len(pg) == len(memory) == (8 if scope == "kb" else 9)
            assert ranked(pg) == ranked(memory)
            assert np.allclose([r.score for r in pg], [r.score for r in memory], atol=1e-5)
    assert rag.search("cats", source_id="dogs", vector_store=store)[0].source_id == "dogs"
    with pytest.raises(UnknownCollection):
        rag.search("cats", collection="missing", vector_store=store)
    assert store.delete(collection="other") == 1 and len(store) == len(CORPUS)


def test_memory_store_from_settings(settings):
    settings.DJANGO_RAG = {"EMBEDDER": "hashing", "VECTOR_STORE": "memory"}
    from django_rag.retrieval import get_vector_store

    store = get_vector_store()
    assert get_vector_store() is store
    store.ingest("kept in process memory", collection="mem")
    assert rag.search("memory")[0].text == "kept in process memory"
    assert not Collection.objects.filter(name="mem").exists()
    with connection.cursor() as cursor:  # nothing reached the database
        cursor.execute("SELECT count(*) FROM django_rag_chunk")
        assert cursor.fetchone()[0] == 0


def test_the_search_request_is_a_frozen_value_and_modes_come_from_one_registry():
    """build_request checks every option once and returns a value nobody mutates; the mode is
    a SearchMode (the aliases resolved in django_rag.modes), which the stores dispatch on."""
    import dataclasses

    from django_rag.exceptions import InvalidSearchMode
    from django_rag.modes import MODES, SearchMode
    from django_rag.retrieval.service import SearchRequest, build_request

    request = build_request("quokkas", mode="vector", collection="zoo", limit=3)
    assert isinstance(request, SearchRequest) and request.mode is SearchMode.SEMANTIC
    assert request.collections == ("zoo",) and not request.scope_resolved
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.limit = 10  # type: ignore[misc]
    assert build_request("q", mode="keyword").mode is SearchMode.FULLTEXT
    assert MODES == ("semantic", "fulltext", "hybrid") and SearchMode.HYBRID == "hybrid"
    with pytest.raises(InvalidSearchMode, match="Available modes: semantic, fulltext, hybrid"):
        build_request("q", mode="vectr")
