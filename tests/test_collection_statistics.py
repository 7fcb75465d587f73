"""BM25 statistics per collection: a search scoped to collections ranks with theirs.

The texts use words PostgreSQL's english configuration keeps as they are (no stop words, stems
equal to the words), so every document frequency and length below is counted by hand.
"""

import math
import random

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.test.utils import CaptureQueriesContext

import django_rag as rag
from django_rag.models import (
    Chunk,
    Collection,
    CorpusDelta,
    CorpusStatistic,
    Document,
    TermDelta,
    TermStatistic,
)
from django_rag.models.fulltext import (
    corpus_statistics,
    parse_query,
    term_frequencies,
    term_statistics,
    term_weights,
)
from django_rag.retrieval import MemoryVectorStore
from django_rag.retrieval.fulltext import index_chunks
from django_rag.store import compact_statistics, recount_statistics, recount_term_bounds
from tests.helpers import assert_statistics_exact

pytestmark = pytest.mark.django_db

# "quantum" is rare in "rare" (1 chunk of 4) and common in "common" (5 of 6).
RARE = {
    "r1": "quantum cat dog",  # length 3
    "r2": "cat bird",  # 2
    "r3": "bird fish fish",  # 3
    "r4": "dog fish",  # 2
}
COMMON = {
    "c1": "quantum quantum bird",  # 3
    "c2": "quantum cat",  # 2
    "c3": "quantum fish dog bird",  # 4
    "c4": "quantum bird",  # 2
    "c5": "quantum dog dog",  # 3
    "c6": "cat cat",  # 2
}


def idf(n, df):
    return math.log(1 + (n - df + 0.5) / (df + 0.5))


def bm25(tf, length, average, n, df, k1=1.2, b=0.75):
    return idf(n, df) * tf * (k1 + 1) / (tf + k1 * (1 - b + b * length / average))


def ingest(texts, collection):
    for source_id, text in texts.items():
        rag.ingest(text, collection=collection, source_id=source_id)


def scores(query, mode="fulltext", **options):
    return {
        r.source_id: r.fulltext_score
        for r in rag.search(query, mode=mode, limit=20, **options)
        if r.fulltext_score
    }


def test_a_scoped_search_ranks_with_its_collections_statistics():
    ingest(RARE, "rare")
    ingest(COMMON, "common")
    lengths = dict(Chunk.objects.values_list("document__source_id", "fts_length"))
    assert lengths == {"r1": 3, "r2": 2, "r3": 3, "r4": 2, "c1": 3, "c2": 2, "c3": 4} | {
        "c4": 2,
        "c5": 3,
        "c6": 2,
    }
    rare_average, common_average, pooled_average = 10 / 4, 16 / 6, 26 / 10

    # Scoped to "rare": N = 4, df = 1, its own average length.
    (hit,) = rag.search("quantum", mode="fulltext", collection="rare")
    assert hit.source_id == "r1"
    assert hit.score == pytest.approx(bm25(1, 3, rare_average, 4, 1))
    # Scoped to "common": N = 6, df = 5.
    found = scores("quantum", collection="common")
    assert found["c1"] == pytest.approx(bm25(2, 3, common_average, 6, 5))
    assert found["c3"] == pytest.approx(bm25(1, 4, common_average, 6, 5))
    # Unscoped, and scoped to both: the pooled figures (N = 10, df = 6).
    pooled = scores("quantum")
    assert pooled["r1"] == pytest.approx(bm25(1, 3, pooled_average, 10, 6))
    assert pooled["c1"] == pytest.approx(bm25(2, 3, pooled_average, 10, 6))
    assert scores("quantum", collection=["rare", "common"]) == pytest.approx(pooled)
    # The same word ranks very differently: rare in "rare", common overall.
    assert hit.score > 2 * pooled["r1"]
    # Hybrid's full-text side reads the same statistics.
    hybrid = scores("quantum dog", mode="hybrid", collection="rare")
    expected = bm25(1, 3, rare_average, 4, 1) + bm25(1, 3, rare_average, 4, 2)
    assert hybrid["r1"] == pytest.approx(expected)
    assert hybrid["r4"] == pytest.approx(bm25(1, 2, rare_average, 4, 2))

    # The readers, directly.
    ids = dict(Collection.objects.values_list("name", "pk"))
    assert corpus_statistics(collection_ids=[ids["rare"]]) == (4, 10)
    assert corpus_statistics(collection_ids=[ids["common"]]) == (6, 16)
    assert corpus_statistics() == (10, 26)
    assert corpus_statistics("default", [ids["rare"], ids["common"]]) == (10, 26)
    assert corpus_statistics(collection_ids=[]) == (0, 0)
    assert term_frequencies(["quantum", "cat", "zebra"], collection_ids=[ids["rare"]]) == {
        "quantum": 1,
        "cat": 2,
    }
    assert term_frequencies(["quantum", "cat"]) == {"quantum": 6, "cat": 4}
    weights = term_weights(["quantum"], collection_ids=[ids["common"]])
    assert weights.frequencies == [5] and weights.average_length == pytest.approx(16 / 6)
    assert weights.idf == [pytest.approx(idf(6, 5))]
    # Score bounds: the largest tf and the smallest length of the chunks holding the term.
    assert weights.max_tf == [2] and weights.min_length == [2]  # c1 (tf 2), c2 / c4 (length 2)
    assert term_statistics(["quantum", "fish", "zebra"], collection_ids=[ids["rare"]]) == {
        "quantum": (1, 1, 3),
        "fish": (2, 2, 2),
    }
    assert term_statistics(["fish"]) == {"fish": (3, 2, 2)}  # over both collections
    # The bound: idf x the tf part at (max tf, min length), above every chunk's score and
    # reached here (c1 has tf 2 but length 3: the bound is not any one chunk's).
    bound = weights.upper_bound(["quantum"])
    assert bound == pytest.approx(bm25(2, 2, 16 / 6, 6, 5))
    assert bound >= max(found.values()) and bound < idf(6, 5) * 2.2
    # Compaction changes none of it.
    assert compact_statistics()
    assert term_frequencies(["quantum"], collection_ids=[ids["rare"]]) == {"quantum": 1}
    assert corpus_statistics(collection_ids=[ids["common"]]) == (6, 16)
    assert_statistics_exact(bounds="terms")


def test_source_and_metadata_filters_keep_the_collections_statistics():
    ingest(RARE, "rare")
    ingest(COMMON, "common")
    (hit,) = rag.search("quantum", mode="fulltext", collection="rare", source_id="r1")
    assert hit.score == pytest.approx(bm25(1, 3, 10 / 4, 4, 1))
    # Unscoped with a source filter: the pooled statistics.
    (hit,) = rag.search("quantum", mode="fulltext", source_id="r1")
    assert hit.score == pytest.approx(bm25(1, 3, 26 / 10, 10, 6))


def test_writes_in_another_collection_leave_scoped_scores_unchanged(
    django_capture_on_commit_callbacks,
):
    """Tenant isolation: adding, replacing and deleting documents of one collection never
    moves another collection's scoped scores."""
    ingest(RARE, "a")
    queries = ["quantum", "cat dog", "bird fish quantum", '"cat dog" bird']
    before = {
        (q, mode): scores(q, mode=mode, collection="a")
        for q in queries
        for mode in ("fulltext", "hybrid")
    }
    unscoped = scores("quantum cat")
    with django_capture_on_commit_callbacks(execute=True):  # compaction runs after each write
        ingest(COMMON, "b")
        rag.ingest("quantum cat quantum bird bird", collection="b", source_id="c2", replace=True)
        rag.delete(Document.objects.get(source_id="c6"))
        rag.ingest("fish " * 30, collection="b", source_id="long")
    for (q, mode), expected in before.items():
        assert scores(q, mode=mode, collection="a") == expected, (q, mode)
    assert scores("quantum cat") != unscoped  # the pooled statistics did change
    Document.objects.filter(collection__name="b").delete()
    compact_statistics()
    for (q, mode), expected in before.items():
        assert scores(q, mode=mode, collection="a") == expected, (q, mode)
    assert scores("quantum cat") == unscoped  # b is empty again: pooled equals a alone
    assert_statistics_exact(bounds="terms")


def test_recount_equals_the_triggers_after_inserts_deletes_replace_and_updates():
    ingest(RARE, "a")
    ingest(COMMON, "b")
    rag.ingest(
        "Apples grow on trees. " * 40,
        collection="c",
        source_id="long",
        chunk_size=20,
        chunk_overlap=0,
    )
    rag.ingest("quantum " * 5, collection="a", source_id="r2", replace=True)
    Document.objects.filter(source_id__in=["c1", "c2"]).delete()  # a queryset delete
    rag.delete(Document.objects.get(source_id="r3"))
    assert_statistics_exact(bounds="terms")
    counts = recount_statistics()["stored"]
    ids = dict(Collection.objects.values_list("name", "pk"))
    assert set(counts["collections"]) == {ids["a"], ids["b"], ids["c"]}
    assert counts["collections"][ids["a"]]["terms"]["quantum"] == 2
    assert counts["collections"][ids["b"]]["chunks"] == 4
    assert counts["chunks"] == sum(c["chunks"] for c in counts["collections"].values())
    # The UPDATE path: new search vectors (another configuration) and a chunk moved to
    # another collection.
    index_chunks(document_id=Document.objects.get(source_id="long").pk, config="simple")
    Chunk.objects.filter(document__source_id="c3").update(collection_id=ids["a"])
    assert_statistics_exact(bounds="terms")
    assert recount_statistics()["stored"]["collections"][ids["a"]]["terms"]["fish"] == 2
    compact_statistics()
    assert_statistics_exact(bounds="terms")
    assert not TermDelta.objects.exists() and not CorpusDelta.objects.exists()
    base = {
        (pk, term): df
        for term, pk, df in TermStatistic.objects.values_list(
            "term", "collection_id", "document_frequency"
        )
    }
    stored = recount_statistics()["stored"]["collections"]
    assert base == {(pk, term): df for pk, c in stored.items() for term, df in c["terms"].items()}
    assert dict(CorpusStatistic.objects.values_list("collection_id", "chunk_count")) == {
        pk: c["chunks"] for pk, c in stored.items()
    }
    # The replace of r2 ("quantum" x 5) widened a's bound; deleting it leaves the bound loose.
    assert TermStatistic.objects.get(term="quantum", collection_id=ids["a"]).max_tf == 5
    rag.delete(Document.objects.get(source_id="r2"))
    compact_statistics()
    counts = recount_statistics()["bounds"]
    assert counts["recount"][(ids["a"], "quantum")] == (1, 3)  # r1 alone
    assert counts["stored"][(ids["a"], "quantum")] == (5, 3)
    assert_statistics_exact(bounds="terms")
    assert recount_term_bounds() > 0
    assert_statistics_exact(bounds="tight")
    assert TermStatistic.objects.get(term="quantum", collection_id=ids["a"]).max_tf == 1
    assert recount_term_bounds() == 0


def test_bounds_widen_on_updates_and_on_inserts_folded_with_deletes():
    ingest({"x": "yak", "y": "yak zebra zebra"}, "a")
    compact_statistics()
    assert_statistics_exact(bounds="tight")
    a = Collection.objects.get(name="a")
    # Inserted and deleted before a compaction: yak's count is unchanged, its bound widens.
    rag.ingest("yak yak yak", collection="a", source_id="z")
    rag.delete(Document.objects.get(source_id="x"))
    compact_statistics()
    row = TermStatistic.objects.get(term="yak", collection=a)
    assert (row.document_frequency, row.max_tf, row.min_length) == (2, 3, 1)
    assert_statistics_exact(bounds="terms")
    # An update that keeps the terms but holds one more often (and is shorter): the count is
    # unchanged, the bounds follow.
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE django_rag_chunk SET search_vector = to_tsvector('english', "
            "'zebra zebra zebra zebra yak'), fts_length = 5 WHERE text = 'yak zebra zebra'"
        )
    assert term_statistics(["zebra"], collection_ids=[a.pk]) == {"zebra": (1, 4, 3)}
    assert_statistics_exact(bounds="terms")
    compact_statistics()
    assert term_statistics(["zebra"], collection_ids=[a.pk]) == {"zebra": (1, 4, 3)}
    assert_statistics_exact(bounds="terms")
    recount_term_bounds()
    assert term_statistics(["zebra"], collection_ids=[a.pk]) == {"zebra": (1, 4, 5)}
    assert_statistics_exact(bounds="tight")


def _brute_force(query, limit, collection_ids=None):
    """(pk, BM25 with phrase boosts) of every matching chunk, best first then by pk: no
    pruning."""
    parsed = parse_query(query)
    rows = Chunk.objects.all()
    if collection_ids is not None:
        rows = rows.filter(collection_id__in=collection_ids)
    weights = term_weights(parsed.terms, collection_ids=collection_ids, counts=parsed.counts)
    scored = (
        rows.matching(parsed.match)
        .with_bm25(weights, weights.boosts(parsed))
        .values_list("pk", "fulltext_score")
    )
    ranked = sorted(scored, key=lambda hit: (-hit[1], hit[0]))[:limit]
    return [(pk, round(score, 9)) for pk, score in ranked]


def test_fulltext_hits_equal_brute_force_bm25_where_common_terms_dominate(monkeypatch):
    """Common terms in most chunks, often repeated, in chunks of every length: chunks holding
    only common terms can outscore those holding a rare one, so the tight bounds must still
    send the search on to the common terms exactly when the ranking needs them."""
    from django_rag.models import fulltext_search  # the full-text rounds read the budget there
    from django_rag.models.fulltext import TermWeights

    rng = random.Random(17)
    common = ["apple", "bread", "cloud", "delta"]
    rare = [f"word{i}" for i in range(60)]
    for d in range(12):
        sentences = []
        for _ in range(10):
            words = [
                rng.choice(common) if rng.random() < 0.8 else rng.choice(rare)
                for _ in range(rng.randint(1, 12))
            ]
            sentences.append(" ".join(words))
        rag.ingest(
            ". ".join(sentences) + ".",
            collection="a" if d % 3 else "b",
            source_id=f"d{d}",
            chunk_size=14,
            chunk_overlap=0,
        )
    rag.delete(Document.objects.get(source_id="d4"))  # loose bounds stay safe
    assert Chunk.objects.count() > 50
    ids = dict(Collection.objects.values_list("name", "pk"))
    queries = [
        "apple word3",
        "bread cloud word7 word11",
        "apple bread cloud delta word1 word2 word50",
        "delta delta word59",
        "apple",
        '"apple bread" word5 cloud',
    ] + [" ".join(rng.sample(common, 2) + rng.sample(rare, rng.randint(1, 4))) for _ in range(8)]
    expected = {
        (query, limit, str(scope)): _brute_force(query, limit, scope)
        for query in queries
        for limit in (1, 3, 10)
        for scope in (None, [ids["a"]], [ids["a"], ids["b"]])
    }
    for budget in (3, 40, fulltext_search.FULLTEXT_CANDIDATE_BUDGET):  # several rounds, or one
        monkeypatch.setattr(fulltext_search, "FULLTEXT_CANDIDATE_BUDGET", budget)
        for query in queries:
            for limit in (1, 3, 10):
                for scope in (None, [ids["a"]], [ids["a"], ids["b"]]):
                    rows = Chunk.objects.all()
                    if scope is not None:
                        rows = rows.filter(collection_id__in=scope)
                    hits = rows.fulltext_hits(query, limit=limit, statistics_from=scope)
                    found = [(pk, round(score, 9)) for pk, score in hits]
                    assert found == expected[query, limit, str(scope)], (budget, query, limit)
    # The tight bounds stop sooner than the loose idf x (k1 + 1): fewer rounds (queries).
    monkeypatch.setattr(fulltext_search, "FULLTEXT_CANDIDATE_BUDGET", 3)

    def rounds():
        with CaptureQueriesContext(connection) as captured:
            for query in queries:
                Chunk.objects.fulltext_hits(query, limit=3)
        return len(captured)

    tight = rounds()
    k1 = 1.2
    monkeypatch.setattr(
        TermWeights,
        "upper_bound",
        lambda self, terms, boosts=(): (
            sum(self.idf[self.terms.index(t)] * (k1 + 1) for t in terms) + sum(w for _, w in boosts)
        ),
    )
    assert tight < rounds()
    monkeypatch.undo()
    # Each common term's bound is above what any chunk gets from it, and well below the loose
    # idf x (k1 + 1).
    for word in common:
        (term,) = parse_query(word).terms  # the lexeme ("apple" is stemmed)
        one = term_weights([term])
        best = max(
            Chunk.objects.matching(f"'{term}'")
            .with_bm25(one)
            .values_list("fulltext_score", flat=True)
        )
        assert best <= one.upper_bound([term]) < one.idf[0] * 2.2


def test_compaction_drops_the_rows_that_reach_zero():
    ingest(RARE, "a")
    ingest({"x": "zebra quantum"}, "b")
    compact_statistics()
    b = Collection.objects.get(name="b")
    assert TermStatistic.objects.filter(collection=b).count() == 2
    rag.delete(Document.objects.get(source_id="x"))
    compact_statistics()
    assert not TermStatistic.objects.filter(collection=b).exists()
    assert not CorpusStatistic.objects.filter(collection=b).exists()
    assert TermStatistic.objects.filter(term="quantum").count() == 1  # a's row stays
    assert_statistics_exact(bounds="terms")


@pytest.mark.parametrize("how", ["instance", "queryset"])
@pytest.mark.parametrize("compacted", [True, False])
def test_deleting_a_collection_removes_its_statistics(how, compacted):
    ingest(RARE, "kept")
    ingest({"g1": "quantum zebra", "g2": "zebra yak"}, "gone")
    if compacted:
        compact_statistics()  # base rows for "gone", then only pending deltas take them off
    gone = Collection.objects.get(name="gone")
    for document in Document.objects.filter(collection=gone):
        rag.delete(document)
    if how == "instance":
        gone.delete()
    else:
        Collection.objects.filter(name="gone").delete()
    for model in (TermStatistic, CorpusStatistic, TermDelta, CorpusDelta):
        assert not model.objects.filter(collection_id=gone.pk).exists(), model
    kept = Collection.objects.get(name="kept")
    assert corpus_statistics(collection_ids=[kept.pk]) == (4, 10)
    assert corpus_statistics() == (4, 10)
    assert term_frequencies(["quantum", "zebra"]) == {"quantum": 1}
    assert_statistics_exact(bounds="terms")


@pytest.mark.django_db(transaction=True)
def test_the_migration_recounts_per_collection_and_back():
    ingest(RARE, "a")
    ingest(COMMON, "b")
    ids = dict(Collection.objects.values_list("name", "pk"))
    executor = MigrationExecutor(connection)
    latest = executor.loader.graph.leaf_nodes("django_rag")
    try:
        executor.migrate([("django_rag", "0006_statistics_deltas")])
        with connection.cursor() as cursor:
            cursor.execute("SELECT term, document_frequency FROM django_rag_term")
            pooled = dict(cursor.fetchall())
            cursor.execute("SELECT id, chunk_count, total_length FROM django_rag_corpus")
            assert cursor.fetchall() == [(1, 10, 26)]
            cursor.execute("SELECT count(*) FROM django_rag_term_delta")
            assert cursor.fetchone() == (0,)
        assert pooled["quantum"] == 6 and pooled["cat"] == 4
    finally:
        executor = MigrationExecutor(connection)
        executor.loader.build_graph()
        executor.migrate(latest)
    assert not TermDelta.objects.exists()
    assert term_frequencies(["quantum"], collection_ids=[ids["a"]]) == {"quantum": 1}
    assert term_frequencies(["quantum"], collection_ids=[ids["b"]]) == {"quantum": 5}
    assert corpus_statistics(collection_ids=[ids["b"]]) == (6, 16)
    assert_statistics_exact(bounds="tight")  # 0008 recounts the bounds
    # The triggers write per collection again.
    rag.ingest("quantum yak", collection="a", source_id="new")
    assert term_frequencies(["quantum"], collection_ids=[ids["a"]]) == {"quantum": 2}
    assert_statistics_exact(bounds="terms")


# --- the memory store ---------------------------------------------------------------------------


def test_memory_store_ranks_with_the_collections_searched():
    store = MemoryVectorStore()
    for source_id, text in RARE.items():
        store.ingest(text, collection="rare", source_id=source_id)
    for source_id, text in COMMON.items():
        store.ingest(text, collection="common", source_id=source_id)

    def memory(query, mode="fulltext", **options):
        return scores(query, mode=mode, vector_store=store, **options)

    # The memory store's lengths are its token counts: the same as PostgreSQL's here.
    assert memory("quantum", collection="rare") == {"r1": pytest.approx(bm25(1, 3, 2.5, 4, 1))}
    found = memory("quantum", collection="common")
    assert found["c1"] == pytest.approx(bm25(2, 3, 16 / 6, 6, 5))
    assert memory("quantum")["r1"] == pytest.approx(bm25(1, 3, 2.6, 10, 6))
    assert memory("quantum", collection=["rare", "common"]) == memory("quantum")
    # Tenant isolation: writes in "common" leave "rare"'s scoped scores as they were.
    queries = ["quantum", "cat dog", "bird fish quantum", '"cat dog" bird']
    before = {
        (q, mode): memory(q, mode=mode, collection="rare")
        for q in queries
        for mode in ("fulltext", "hybrid")
    }
    added = store.ingest("quantum quantum cat dog dog bird", collection="common", source_id="n")
    store.delete(collection="common", source_id="c6")
    for (q, mode), expected in before.items():
        assert memory(q, mode=mode, collection="rare") == expected, (q, mode)
    store.delete(added)
    store.clear("common")
    for (q, mode), expected in before.items():
        assert memory(q, mode=mode, collection="rare") == expected, (q, mode)
    # A source filter keeps the collection's statistics.
    assert memory("quantum", collection="rare", source_id="r1") == before[("quantum", "fulltext")]
