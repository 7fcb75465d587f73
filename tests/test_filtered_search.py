"""Filtered searches return min(limit, matching chunks) rows: proven on 1% of the chunks."""

import random

import numpy as np
import pytest
from django.db import connection, transaction
from django.db.models import F, Value
from django.test.utils import CaptureQueriesContext
from pgvector.django import CosineDistance

import django_rag as rag
from django_rag.embeddings import get_embedder
from django_rag.models import Chunk, Collection, Document

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def populated(django_db_setup, django_db_blocker):
    """Collection 'big' with 5,000 chunks and 'small' with 50 (1% of all chunks), committed."""
    with django_db_blocker.unblock():
        rng = random.Random(7)
        vocabulary = [f"term{i}" for i in range(3000)]

        def text(n):
            return ". ".join(" ".join(rng.choices(vocabulary, k=12)) for _ in range(n)) + "."

        for i in range(50):
            rag.ingest(
                text(100), collection="big", source_id=f"big-{i}", chunk_size=14, chunk_overlap=0
            )
        for i in range(5):
            rag.ingest(
                text(10), collection="small", source_id=f"small-{i}", chunk_size=14, chunk_overlap=0
            )
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE django_rag_chunk")
        yield rng, vocabulary
        Document.objects.all().delete()
        Collection.objects.all().delete()


def _exact_top(collection_name, query_vector, limit, source_id=None):
    rows = Chunk.objects.filter(collection__name=collection_name)
    if source_id:
        rows = rows.filter(document__source_id=source_id)
    scores = sorted(
        (float(np.dot(np.asarray(c.embedding), query_vector)) for c in rows), reverse=True
    )
    return [round(score, 5) for score in scores[:limit]]


def _scores(results):
    assert len({r.chunk_id for r in results}) == len(results)
    return [round(r.score, 5) for r in results]


def test_filtered_search_on_one_percent_of_chunks_is_complete(populated):
    rng, vocabulary = populated
    total = Chunk.objects.count()
    small = Chunk.objects.filter(collection__name="small").count()
    assert small / total <= 0.011 and small >= 50

    query = " ".join(rng.choices(vocabulary, k=6))
    vector = np.asarray(get_embedder().embed_query(query))

    # The problem being solved: an HNSW scan with the filter applied afterwards finds almost
    # nothing in 1% of the rows (the planner is pushed onto the index to show it).
    naive_query = (
        Chunk.objects.filter(collection__name="small")
        .annotate(distance=CosineDistance("embedding", vector.tolist()))
        .order_by("distance")[:10]
    )
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("SET LOCAL enable_bitmapscan = off")
        cursor.execute("SET LOCAL enable_sort = off")
        assert "django_rag_chunk_hnsw_idx" in naive_query.explain()
        naive = list(naive_query)
    assert len(naive) < 10

    results = rag.search(query, collection="small", limit=10)
    assert len(results) == 10
    assert _scores(results) == _exact_top("small", vector, 10)
    assert all(r.collection == "small" for r in results)

    # More than the collection holds: every chunk comes back.
    assert len(rag.search(query, collection="small", limit=200)) == small

    # Source filter: one document of 10 chunks.
    results = rag.search(query, collection="small", source_id="small-2", limit=10)
    assert _scores(results) == _exact_top("small", vector, 10, "small-2")


def test_large_filters_use_the_index_and_stay_complete(populated, settings):
    rng, vocabulary = populated
    settings.DJANGO_RAG = {"EMBEDDER": "hashing", "SEARCH": {"EXACT_SEARCH_MAX_ROWS": 20}}
    query = " ".join(rng.choices(vocabulary, k=6))
    vector = np.asarray(get_embedder().embed_query(query))
    results = rag.search(query, collection="small", limit=10)
    assert _scores(results) == _exact_top("small", vector, 10)
    results = rag.search(query, collection="big", limit=10)
    assert len(results) == 10 and all(r.collection == "big" for r in results)


def test_unfiltered_search_uses_the_hnsw_index(populated):
    vector = [0.0] * 383 + [1.0]
    base = Chunk.objects.annotate(distance=CosineDistance("embedding", vector))
    plan = base.order_by("distance")[:10].explain()
    assert "django_rag_chunk_hnsw_idx" in plan
    exact_plan = (
        base.filter(collection__name="small").order_by(F("distance") + Value(0.0))[:10].explain()
    )
    assert "hnsw" not in exact_plan
    results = rag.search("term1 term2", limit=25)
    assert len(results) == 25
    scores = [r.score for r in results]
    assert scores == sorted(scores, reverse=True)


def test_index_path_uses_iterative_scans_on_pgvector_08(populated):
    """On the HNSW index with a 1% filter, _approximate is complete by itself: iterative scans
    on pgvector >= 0.8, a candidate list widened by the selectivity before (capped at 1000).
    The rows are approximate nearest neighbours, not the exact top 10."""
    from django_rag.conf import search_setting
    from django_rag.models.managers import pgvector_version

    rng, vocabulary = populated
    small = Collection.objects.get(name="small")
    rows = Chunk.objects.filter(collection_id__in=[small.pk])
    vector = np.asarray(get_embedder().embed_query(" ".join(rng.choices(vocabulary, k=6))))
    base = rows._ranked(vector.tolist())
    with transaction.atomic(), connection.cursor() as cursor:
        # The planner would rather sort the collection's 50 rows; push it onto the index.
        for setting in ("enable_seqscan", "enable_bitmapscan", "enable_sort"):
            cursor.execute(f"SET LOCAL {setting} = off")
        assert "django_rag_chunk_hnsw_idx" in base.order_by("distance")[:10].explain()
        with CaptureQueriesContext(connection) as captured:
            hits = rows._approximate(base, 10, filtered=True)
    sql = " ".join(query["sql"] for query in captured.captured_queries)
    if pgvector_version() >= (0, 8):
        assert "set_config('hnsw.iterative_scan', 'relaxed_order', true)" in sql
        ef_search = search_setting("HNSW_EF_SEARCH")
        assert f"set_config('hnsw.ef_search', '{ef_search}', true)" in sql  # not widened
        # Complete: 10 distinct rows of the collection, nearest first. Which 10 is up to the
        # HNSW graph, whose levels are random per build: over 40 rebuilds 8 to 10 of them
        # were the exact top 10, so only a nearest-neighbour search's floor is asserted (ten
        # rows drawn at random from the 50 would share 2 with it on average).
        assert len({pk for pk, _ in hits}) == 10
        assert Chunk.objects.filter(pk__in=[pk for pk, _ in hits], collection=small).count() == 10
        distances = [d for _, d in hits]
        assert distances == sorted(distances)
        exact = _exact_top("small", vector, 10)
        assert len({round(1 - d, 5) for d in distances} & set(exact)) >= 6
    else:
        assert "iterative_scan" not in sql
        assert "set_config('hnsw.ef_search', '1000', true)" in sql  # 2 * 10 / 1%, capped


def _bm25_all(collection_name, query, limit):
    """BM25 of every matching chunk (no candidate pruning): the exact full-text ranking, with
    the collection's statistics."""
    from django_rag.models.textsearch import fulltext_backend
    from django_rag.retrieval.fulltext import parse_query, term_weights

    parsed = parse_query(query)
    collection = Collection.objects.get(name=collection_name)
    matching = Chunk.objects.filter(collection=collection).matching(parsed.match)
    if fulltext_backend() == "pg_textsearch":
        # The index's BM25 (its own, table-wide statistics) of each chunk, computed one by one.
        scored = [
            -d for d in matching.with_index_bm25(parsed).values_list("bm25_distance", flat=True)
        ]
    else:
        scored = matching.with_bm25(
            term_weights(parsed.terms, collection_ids=[collection.pk], counts=parsed.counts)
        ).values_list("fulltext_score", flat=True)
    return [round(s, 5) for s in sorted(scored, reverse=True)[:limit]]


@pytest.mark.parametrize("mode", ["fulltext", "hybrid"])
def test_every_mode_is_complete_on_one_percent_of_chunks(populated, mode):
    rng, vocabulary = populated
    small_vocabulary = {
        w for c in Chunk.objects.filter(collection__name="small") for w in c.text.split()
    }
    for _ in range(5):
        words = rng.sample(sorted(small_vocabulary), 6)
        query = " ".join(w.strip(".") for w in words)
        matching = (
            Chunk.objects.filter(collection__name="small")
            .matching(" | ".join(f"'{w.strip('.')}'" for w in words))
            .count()
        )
        results = rag.search(query, mode=mode, collection="small", limit=10)
        assert all(r.collection == "small" for r in results)
        if mode == "fulltext":
            assert len(results) == min(10, matching)
            assert _scores(results) == _bm25_all("small", query, 10)
        else:
            assert len(results) == 10  # every chunk has a semantic score


def test_fulltext_candidate_pruning_is_exact(populated):
    """MaxScore rounds give the same ranking as scoring every matching chunk."""
    from django_rag.models import fulltext_search  # the full-text rounds read the budget there

    rng, vocabulary = populated
    original = fulltext_search.FULLTEXT_CANDIDATE_BUDGET
    try:
        fulltext_search.FULLTEXT_CANDIDATE_BUDGET = 5  # force several rounds
        for _ in range(5):
            query = " ".join(rng.choices(vocabulary, k=8))
            results = rag.search(query, mode="fulltext", collection="big", limit=10)
            assert _scores(results) == _bm25_all("big", query, 10)
    finally:
        fulltext_search.FULLTEXT_CANDIDATE_BUDGET = original
