"""Hybrid search ranks its semantic side and scores every candidate in one statement. Whatever
the scope, the fusion or the query syntax, its results must be the ones of doing it the long
way: every chunk's cosine similarity and BM25 computed, each side's best ``candidates * limit``
taken (the semantic side's as its ranking returns them), their union fused."""

import random
from types import SimpleNamespace

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from pgvector.django import CosineDistance

import django_rag as rag
from django_rag.embeddings import get_embedder
from django_rag.models import Chunk, Collection
from django_rag.models.textsearch import fulltext_backend, rebuild_index
from django_rag.retrieval.fulltext import parse_query
from django_rag.retrieval.fusion import fuse

# Committed, not rolled back: on the pg_textsearch backend the index's statistics count the
# rows of rolled-back transactions (every earlier test's), and those counts change when the
# index writes its in-memory part to disk, which it does on its own as that part grows: the
# scores of two statements could then differ with no write between them. Flushed after each
# test (a TRUNCATE, which empties the index), and the index rebuilt before the corpus goes in.
pytestmark = pytest.mark.django_db(transaction=True)

WORDS = (
    "river delta harbour copper lantern orchard meadow falcon granite willow ember canyon "
    "glacier saffron walnut violet thunder marble quartz cedar"
).split()


@pytest.fixture
def corpus():
    if fulltext_backend() == "pg_textsearch":
        rebuild_index()  # statistics of the live rows only: none of earlier tests' rows
    rng = random.Random(7)
    for i in range(90):
        # Zipf-like: the first words are common, the last ones rare.
        words = rng.choices(
            WORDS, weights=[1 / (r + 1) for r in range(len(WORDS))], k=rng.randint(3, 14)
        )
        rag.ingest(
            " ".join(words) + f" note{i}",
            collection=("east", "west", "north")[i % 3],
            source_id=f"s{i}",
            metadata={"kind": "odd" if i % 2 else "even"},
        )
    return rng


def _long_way(chunks, vector, query, *, syntax, limit, candidates, scope, fusion):
    """The hybrid ranking with every score computed (no index, no pruning)."""
    parsed = parse_query(query, syntax=syntax)
    considered = chunks.without_excluded(parsed)
    semantic = {
        pk: 1.0 - float(distance)
        for pk, distance in considered.annotate(d=CosineDistance("embedding", vector)).values_list(
            "pk", "d"
        )
    }
    bm25 = dict(chunks.fulltext_hits(parsed, limit=10_000, statistics_from=scope))
    pool = limit * candidates
    # The semantic side's candidates as its own ranking finds them (the HNSW index is
    # approximate; tests/test_filtered_search.py holds that ranking to exact search).
    best_semantic = [pk for pk, _ in considered.semantic_hits(vector, limit=pool)]
    best_fulltext = sorted(bm25, key=lambda pk: (-bm25[pk], pk))[:pool]
    items = [
        SimpleNamespace(pk=pk, semantic_score=semantic[pk], fulltext_score=bm25.get(pk, 0.0))
        for pk in sorted(set(best_semantic) | set(best_fulltext))
    ]
    return fuse(items, pool=pool, readable=True, fusion=fusion)[:limit]


@pytest.mark.parametrize("fusion", ["adaptive", "rrf", "weighted"])
def test_hybrid_equals_the_long_way_in_every_scope(corpus, fusion):
    rng = corpus
    east = Collection.objects.get(name="east").pk
    scopes = [
        (Chunk.objects.all(), None),
        (Chunk.objects.filter(collection_id=east), [east]),  # an exact semantic scan
        (Chunk.objects.filter(metadata__kind="odd"), None),
    ]
    embedder = get_embedder()
    checked = 0
    for _ in range(12):
        words = rng.sample(WORDS, rng.randint(1, 5))
        syntax = rng.choice(["natural", "websearch"])
        if syntax == "websearch" and len(words) > 1 and rng.random() < 0.5:
            words[-1] = "-" + words[-1]  # an excluded word: neither side may return it
        query = " ".join(words)
        vector = embedder.embed_query(query)
        limit, candidates = rng.choice([(3, 2), (5, 4), (10, 2)])
        for chunks, scope in scopes:
            options = {"syntax": syntax, "limit": limit, "candidates": candidates}
            got = chunks.hybrid_results(
                vector, query, statistics_from=scope, fusion=fusion, **options
            )
            want = _long_way(chunks, vector, query, scope=scope, fusion=fusion, **options)
            assert [r.chunk_id for r in got] == [w.pk for w in want], query
            for result, item in zip(got, want, strict=True):
                assert result.semantic_score == pytest.approx(item.semantic_score, abs=1e-6)
                assert result.fulltext_score == pytest.approx(item.fulltext_score, abs=1e-9)
                assert result.score == pytest.approx(item.score, abs=1e-9)
                assert result.text == Chunk.objects.get(pk=result.chunk_id).text
            checked += len(got)
    assert checked > 100  # the corpus and queries gave results to compare


def test_the_semantic_ranking_and_the_scoring_are_one_statement(corpus):
    """The statement that ranks the semantic side also scores the union and reads the result
    columns: no statement loads results or computes missing scores apart from it."""
    query = "copper lantern falcon"
    for collection in ("east", None):
        rag.search(query, mode="hybrid", collection=collection)  # warm: the pgvector version
        with CaptureQueriesContext(connection) as captured:
            results = rag.search(query, mode="hybrid", limit=5, collection=collection)
        assert len(results) == 5
        sql = [q["sql"] for q in captured.captured_queries]
        vector_statements = [q for q in sql if "<=>" in q]
        for statement in vector_statements:
            assert "ORDER BY" in statement and '"source_id"' in statement and "unnest" in statement
        if collection:
            # 30 chunks: the exact scan, which returns every row asked for.
            assert len(vector_statements) == 1, sql
        else:
            # The HNSW index is approximate: should it return fewer rows than asked for (seen
            # with pgvector 0.6 on this small corpus of repeated words), the exact scan runs
            # again, as the same combined statement.
            assert 1 <= len(vector_statements) <= 2, sql
