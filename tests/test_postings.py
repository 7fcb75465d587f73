"""The impact-ordered posting lists and the full-text search over them (threshold algorithm):
the same top k as scoring every chunk, on random corpora and queries, through inserts,
replaces, re-indexing, deletes, trimming and concurrent writers; a damaged structure found and
repaired by ``rag_maintenance postings``; the cost bounded by the depth read, not by how many
chunks hold a word."""

import random
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import django_rag as rag
from django_rag.models import (
    Chunk,
    Collection,
    Document,
    Posting,
    TermStatistic,
    fulltext_search,
    impact_search,
    postings,
)
from django_rag.models.fulltext import parse_query
from django_rag.retrieval.fulltext import index_chunks
from django_rag.store import check_postings, compact_statistics, rebuild_postings
from tests.helpers import assert_statistics_exact, brute_force_bm25
from tests.test_concurrency import run_threads

pytestmark = pytest.mark.django_db(transaction=True)

CLEAN = {"missing": 0, "stray": 0, "wrong_impact": 0}
# A skewed vocabulary: the first words are in most chunks, the last in few.
WORDS = [f"w{i}x" for i in range(30)]
SKEWED = [word for i, word in enumerate(WORDS) for _ in range(max(1, 12 - i))]


@pytest.fixture
def shallow(monkeypatch):
    """Lists cut to 3 postings past 6, and searches that start 2 deep: trimming, floors,
    several rounds and fallbacks to MaxScore happen on a few dozen chunks."""
    return lists_of(monkeypatch, 3)


@pytest.fixture
def short(monkeypatch):
    """Lists cut to 12 postings past 24: deep enough to prove most top 10s."""
    return lists_of(monkeypatch, 12)


def lists_of(monkeypatch, depth):
    monkeypatch.setattr(postings, "LIST_DEPTH", depth)
    monkeypatch.setattr(postings, "TRIM_AT", 2 * depth)
    monkeypatch.setattr(impact_search, "FIRST_DEPTH", 2)
    monkeypatch.setattr(impact_search, "DEPTH_PER_RESULT", 1)


@pytest.fixture
def answered(monkeypatch):
    """Counts the searches the posting lists answered and those they left to MaxScore."""
    counts = {"lists": 0, "fallback": 0}

    def counting(*args, **kwargs):
        hits = impact_search.impact_hits(*args, **kwargs)
        counts["lists" if hits is not None else "fallback"] += 1
        return hits

    monkeypatch.setattr(fulltext_search, "impact_hits", counting)
    return counts


def fulltext(query, limit, scope=None):
    rows = Chunk.objects.all()
    if scope is not None:
        rows = rows.filter(collection_id__in=scope)
    hits = rows.fulltext_hits(query, limit=limit, statistics_from=scope)
    return [(pk, round(score, 9)) for pk, score in hits]


def assert_equal_to_brute_force(queries, scopes=(None,)):
    for query in queries:
        for limit in (1, 3, 10):
            for scope in scopes:
                expected = brute_force_bm25(query, limit, scope)
                assert fulltext(query, limit, scope) == expected, (query, limit, scope)


def ingest_chunks(texts, collection, prefix):
    for n, text in enumerate(texts):
        rag.ingest(text, collection=collection, source_id=f"{prefix}{n}")


def test_impacts_and_the_bound():
    # The stored impact is BM25's tf part with the reference parameters.
    assert postings.impact(1, 100) == pytest.approx(2.2 / 2.2)
    assert postings.impact(3, 50) > postings.impact(1, 50) > postings.impact(1, 200)
    # Whatever the real parameters, the bound at a chunk's own impact covers its real tf part.
    rng = random.Random(3)
    for _ in range(2000):
        tf, length = rng.randint(1, 40), rng.randint(1, 3000)
        k1, b, average = rng.uniform(0, 3), rng.uniform(0, 1), rng.uniform(5, 500)
        real = tf * (k1 + 1) / (tf + k1 * (1 - b + b * length / average))
        bound = postings.unseen_bound(
            postings.impact(tf, length),
            k1=k1,
            b=b,
            average_length=average,
            max_tf=tf + rng.randint(0, 5),
            min_length=max(1, length - rng.randint(0, 50)),
        )
        assert bound >= real * (1 - 1e-12)
    # Nothing left below a floor of 0; an unknown max tf bounds with the part's limit.
    assert postings.unseen_bound(0, k1=1.2, b=0.75, average_length=80, max_tf=3, min_length=1) == 0
    kwargs = {"k1": 1.2, "b": 0.75, "average_length": 80, "min_length": 1}
    assert postings.unseen_bound(0.5, max_tf=None, **kwargs) == pytest.approx(2.2)


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    chunks=st.lists(
        st.lists(st.sampled_from(SKEWED), min_size=1, max_size=14), min_size=4, max_size=28
    ),
    rewrites=st.lists(st.tuples(st.integers(0, 27), st.booleans()), max_size=6),
    queries=st.lists(
        st.lists(st.sampled_from(WORDS), min_size=1, max_size=5), min_size=1, max_size=5
    ),
)
def test_top_k_equals_brute_force_on_random_corpora(shallow, answered, chunks, rewrites, queries):
    Document.objects.all().delete()
    Collection.objects.all().delete()
    ingest_chunks([" ".join(words) for words in chunks[::2]], "a", "a")
    ingest_chunks([" ".join(words) for words in chunks[1::2]], "b", "b")
    # Replaces (new chunk versions) and deletes.
    for index, delete in rewrites:
        document = Document.objects.filter(source_id=f"a{index % max(1, len(chunks) // 2)}")
        if delete:
            for pk in document.values_list("pk", flat=True):
                rag.delete(pk)
        else:
            rag.ingest(
                " ".join(chunks[index % len(chunks)] * 2),
                collection="a",
                source_id=f"a{index}",
                replace=True,
            )
    assert_statistics_exact()  # statistics and the lists' invariant
    ids = dict(Collection.objects.values_list("name", "pk"))
    scopes = (None, [ids["a"]], [ids["a"], ids["b"]]) if "b" in ids else (None,)
    assert_equal_to_brute_force([" ".join(words) for words in queries], scopes)


def test_lists_are_trimmed_and_searches_stop_early(short, answered):
    rng = random.Random(5)
    # Chunks of 50 to 150 words: about the lists' reference length (REFERENCE_LENGTH), as the
    # default chunk size gives.
    vocabulary = [f"v{i}x" for i in range(400)]
    weights = [1 / (i + 1) for i in range(400)]
    texts = [" ".join(rng.choices(vocabulary, weights, k=rng.randint(50, 150))) for _ in range(120)]
    ingest_chunks(texts, "docs", "d")
    compact_statistics()
    common = TermStatistic.objects.get(term=parse_query("v0x").terms[0])
    assert common.document_frequency > 60
    # Cut to at most TRIM_AT postings; what was cut is at or below the floor.
    assert 0 < Posting.objects.filter(term=common.term).count() <= postings.TRIM_AT
    assert common.impact_floor > 0
    assert check_postings() == CLEAN
    queries = ["v0x", "v0x v1x", "v0x v1x v2x v3x", "v2x v25x", "v5x v6x v70x"]
    assert_equal_to_brute_force(queries)
    assert answered["lists"] > answered["fallback"]  # most answered by the lists...
    # ... and a one-word search over a word in most chunks scores a few of them, not all.
    scored = []
    original = impact_search.list_heads

    def spying(terms, depth, **kwargs):
        heads = original(terms, depth, **kwargs)
        scored.append(len(set(heads.chunks.tolist())))
        return heads

    impact_search.list_heads = spying
    try:
        assert len(fulltext("v0x", 1)) == 1
    finally:
        impact_search.list_heads = original
    assert max(scored) < common.document_frequency


def test_reindexing_and_moving_chunks_keep_the_lists(shallow):
    """UPDATEs of the chunk table (a new text search configuration, a chunk moved to another
    collection) replace the chunks' postings in the same statement."""
    rng = random.Random(11)
    texts = [" ".join(rng.choice(SKEWED) for _ in range(rng.randint(3, 12))) for _ in range(30)]
    ingest_chunks(texts, "a", "a")
    index_chunks(config="simple")  # every search vector changes (no stemming, no stop words)
    assert check_postings() == CLEAN
    b = Collection.objects.create(name="b")
    Chunk.objects.filter(document__source_id__in=["a1", "a2", "a3"]).update(collection=b)
    compact_statistics()
    assert_statistics_exact()
    assert_equal_to_brute_force(["w0x w1x", "w3x", "w1x w9x w4x"], (None, [b.pk]))


def test_a_damaged_structure_is_found_and_repaired(shallow):
    rng = random.Random(7)
    texts = [" ".join(rng.choice(SKEWED) for _ in range(rng.randint(3, 16))) for _ in range(60)]
    ingest_chunks(texts, "docs", "d")
    compact_statistics()
    queries = ["w0x", "w0x w1x w2x", "w4x w11x"]
    expected = {query: brute_force_bm25(query, 10) for query in queries}
    with connection.cursor() as cursor:
        # The best postings of a common word lost, another's impacts wrong, a stray posting.
        cursor.execute(
            "DELETE FROM django_rag_posting WHERE (chunk_id, term) IN (SELECT chunk_id, term "
            "FROM django_rag_posting WHERE term = %s ORDER BY impact DESC LIMIT 2)",
            [parse_query("w0x").terms[0]],
        )
        cursor.execute(
            "UPDATE django_rag_posting SET impact = impact / 3 WHERE term = %s",
            [parse_query("w1x").terms[0]],
        )
        cursor.execute(
            "INSERT INTO django_rag_posting (chunk_id, term, collection_id, impact, tf, length) "
            "SELECT id, 'zzz', collection_id, 1, 1, 1 FROM django_rag_chunk LIMIT 1"
        )
    found = check_postings()
    assert found["missing"] >= 2 and found["wrong_impact"] > 0 and found["stray"] == 1
    out = StringIO()
    call_command("rag_maintenance", "postings", stdout=out)  # dry run: reports, changes nothing
    assert "missing" in out.getvalue() and check_postings() == found
    call_command("rag_maintenance", "postings", "--apply", stdout=out)
    assert check_postings() == CLEAN
    assert "Rebuilt" in out.getvalue()
    assert {query: brute_force_bm25(query, 10) for query in queries} == expected
    assert {query: fulltext(query, 10) for query in queries} == expected
    assert rebuild_postings() == Posting.objects.count()


@pytest.mark.slow
def test_concurrent_writers_keep_the_invariant(shallow, answered):
    """Four threads insert, replace and delete documents of one collection while their
    compactions trim the lists: afterwards no posting above a floor is missing and every
    search equals brute force."""

    def writer(index):
        rng = random.Random(index)
        for _ in range(40):
            source = f"s{rng.randint(0, 15)}"
            if rng.random() < 0.8:
                text = " ".join(rng.choice(SKEWED) for _ in range(rng.randint(3, 18)))
                rag.ingest(text, collection="shared", source_id=source, replace=True)
            else:
                for pk in Document.objects.filter(source_id=source).values_list("pk", flat=True):
                    try:
                        rag.delete(pk)
                    except Exception:  # deleted by another thread meanwhile
                        pass

    assert run_threads(4, writer) == []
    compact_statistics()
    assert_statistics_exact()
    assert Posting.objects.count() < sum(
        TermStatistic.objects.values_list("document_frequency", flat=True)
    )  # trimmed
    assert_equal_to_brute_force(["w0x", "w0x w1x", "w2x w3x w4x", "w1x w20x", "w7x w8x"])
