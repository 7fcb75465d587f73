"""The threshold query of full-text search: after a first round has found ``limit`` chunks, only
chunks holding words whose upper bounds add up to the last score can still enter the results.
The query must match every such chunk (a superset, whatever the tree's size cap), and the
ranking it gives must stay exactly the one of scoring every matching chunk."""

import json
import random

import pytest
from django.db import connection
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import django_rag as rag
from django_rag.models import Chunk, Collection, Document, bm25, fulltext_search
from django_rag.models.bm25 import TermWeights, threshold_query
from django_rag.models.textsearch import fulltext_backend
from django_rag.retrieval.fulltext import parse_query, term_weights

pytestmark = pytest.mark.django_db


def _matches(query: str, documents: list[list[str]]) -> list[bool]:
    """Whether PostgreSQL's tsquery ``query`` matches each document (a set of lexemes)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT array_to_tsvector(d::text[]) @@ %s::tsquery "
            "FROM jsonb_array_elements(%s::jsonb) WITH ORDINALITY AS t(j, n), "
            "LATERAL (SELECT array(SELECT jsonb_array_elements_text(j))) a(d) ORDER BY n",
            [query, json.dumps(documents)],
        )
        return [row[0] for row in cursor.fetchall()]


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    idf=st.lists(st.floats(0.05, 8.0), min_size=1, max_size=14),
    need_share=st.floats(0.0, 1.2),
    nodes=st.sampled_from([1, 3, 10, 300]),
    seed=st.integers(0, 10_000),
)
def test_the_threshold_query_matches_every_chunk_that_can_reach_the_score(
    monkeypatch, idf, need_share, nodes, seed
):
    monkeypatch.setattr(bm25, "THRESHOLD_QUERY_NODES", nodes)
    terms = [f"w{i}" for i in range(len(idf))]
    rng = random.Random(seed)
    weights = TermWeights(
        terms,
        [rng.randint(0, 50) for _ in terms],
        idf,
        40.0,
        max_tf=[rng.choice([None, 1, 2, 5]) for _ in terms],
        min_length=[rng.choice([None, 3, 20, 80]) for _ in terms],
    )
    bound = {t: weights.upper_bound([t]) for t in terms}
    need = need_share * sum(bound.values())
    query = threshold_query(weights, need)
    documents = [rng.sample(terms, rng.randint(1, len(terms))) for _ in range(40)]
    reachable = [sum(bound[t] for t in doc) >= need for doc in documents]
    if query is None:  # "any chunk holding one of the words": as wide as the plain query
        return
    for doc, can_reach, matched in zip(
        documents, reachable, _matches(query, documents), strict=True
    ):
        assert matched or not can_reach, (doc, need, query)


def test_the_threshold_query_narrows_when_one_word_cannot_reach_the_score():
    weights = TermWeights(["rare", "common", "other"], [1, 900, 800], [6.0, 0.5, 0.6], 40.0)
    narrow = threshold_query(weights, weights.upper_bound(["rare"]) * 1.01)
    # Alone no word reaches it: the rare word plus one of the others is needed.
    assert _matches(narrow, [["rare"], ["common", "other"], ["rare", "common"]]) == [
        False,
        False,
        True,
    ]
    assert threshold_query(weights, 0.0) is None  # every chunk holding a word can


@pytest.fixture(scope="module")
def zipf_corpus(django_db_setup, django_db_blocker):
    """Two collections of chunks whose words follow a Zipf law (a few words in most chunks,
    most words in few), committed."""
    with django_db_blocker.unblock():
        rng = random.Random(11)
        vocabulary = [f"zw{i}" for i in range(800)]
        weights = [1 / (rank + 1) for rank in range(len(vocabulary))]

        def text(sentences):
            return (
                ". ".join(
                    " ".join(rng.choices(vocabulary, weights, k=rng.randint(4, 16)))
                    for _ in range(sentences)
                )
                + "."
            )

        for i in range(30):
            rag.ingest(
                text(60), collection="zipf", source_id=f"z-{i}", chunk_size=20, chunk_overlap=0
            )
        for i in range(3):
            rag.ingest(
                text(20),
                collection="zipf-small",
                source_id=f"s-{i}",
                chunk_size=20,
                chunk_overlap=0,
            )
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE django_rag_chunk")
        yield rng, vocabulary, weights
        Document.objects.all().delete()
        Collection.objects.all().delete()


def _exact(collection: str, query: str, limit: int) -> list[float]:
    parsed = parse_query(query)
    scope = Collection.objects.get(name=collection)
    scored = (
        Chunk.objects.filter(collection=scope)
        .matching(parsed.match)
        .with_bm25(term_weights(parsed.terms, collection_ids=[scope.pk], counts=parsed.counts))
        .values_list("fulltext_score", flat=True)
    )
    return [round(s, 5) for s in sorted(scored, reverse=True)[:limit]]


@pytest.mark.parametrize("nodes", [2, 300])
def test_threshold_rounds_rank_exactly_like_scoring_every_match(zipf_corpus, monkeypatch, nodes):
    if fulltext_backend() == "pg_textsearch":
        pytest.skip("the threshold round belongs to the SQL backend")
    rng, vocabulary, weights = zipf_corpus
    monkeypatch.setattr(fulltext_search, "FULLTEXT_CANDIDATE_BUDGET", 20)  # force the round
    monkeypatch.setattr(bm25, "THRESHOLD_QUERY_NODES", nodes)
    narrowed = []

    def spy(weights, need):
        query = threshold_query(weights, need)
        narrowed.append(query is not None)
        return query

    monkeypatch.setattr(fulltext_search, "threshold_query", spy)
    for _ in range(12):
        # Common and rare words together, some repeated: the case MaxScore widens on.
        words = rng.choices(vocabulary, weights, k=rng.randint(3, 9)) + rng.sample(
            vocabulary[100:], rng.randint(0, 3)
        )
        query = " ".join(words)
        for collection in ("zipf", "zipf-small"):
            for limit in (1, 5, 10):
                results = rag.search(query, mode="fulltext", collection=collection, limit=limit)
                assert len({r.chunk_id for r in results}) == len(results)
                assert [round(r.score, 5) for r in results] == _exact(collection, query, limit)
    assert sum(narrowed) >= 10  # the threshold round ran, and narrowed
