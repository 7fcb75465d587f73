"""A word repeated in a full-text query: ``SEARCH["BM25_K3"]`` weighs it by its count with BM25's
k3 saturation (0: once, None: its raw count), on the SQL backend and in the memory store; the
cap on query terms and phrase boosts keep their meaning."""

import math
import random

import pytest
from django.core.management import call_command

import django_rag as rag
from django_rag.exceptions import ConfigurationError
from django_rag.models import Chunk
from django_rag.models.fulltext import (
    TermWeights,
    limit_terms,
    parse_query,
    query_term_weight,
    term_weights,
)
from django_rag.retrieval import MemoryVectorStore

pytestmark = pytest.mark.django_db


def _search_settings(settings, **search):
    """DJANGO_RAG with these SEARCH keys (the run's other keys kept)."""
    current = dict(settings.DJANGO_RAG)
    current["SEARCH"] = {**current.get("SEARCH", {}), **search}
    settings.DJANGO_RAG = current


def idf(n, df):
    return math.log(1 + (n - df + 0.5) / (df + 0.5))


def tf_part(tf, length, average, k1=1.2, b=0.75):
    return tf * (k1 + 1) / (tf + k1 * (1 - b + b * length / average))


# --- the rule ------------------------------------------------------------------------------------


@pytest.mark.django_db(False)
def test_k3_zero_counts_a_word_once_whatever_its_count():
    assert [query_term_weight(n, 0) for n in (1, 2, 5, 100)] == [1.0, 1.0, 1.0, 1.0]


@pytest.mark.django_db(False)
def test_k3_none_weighs_the_raw_count():
    assert [query_term_weight(n, None) for n in (1, 2, 7)] == [1.0, 2.0, 7.0]


@pytest.mark.django_db(False)
@pytest.mark.parametrize("k3", [0.5, 1, 2, 8, 1000])
def test_k3_saturates_between_once_and_k3_plus_one(k3):
    weights = [query_term_weight(n, k3) for n in range(1, 50)]
    assert weights[0] == pytest.approx(1.0)  # a word once weighs as it always did
    assert all(a < b for a, b in zip(weights, weights[1:], strict=False))  # more is more...
    assert all(w < k3 + 1 for w in weights)  # ...up to k3 + 1
    assert query_term_weight(2, k3) == pytest.approx((k3 + 1) * 2 / (k3 + 2))


@pytest.mark.django_db(False)
def test_a_large_k3_approaches_the_raw_count_and_a_count_below_one_counts_once():
    assert query_term_weight(3, 1e9) == pytest.approx(3.0, rel=1e-6)
    assert query_term_weight(0, 2) == 1.0 and query_term_weight(-4, None) == 1.0


# --- parsing -------------------------------------------------------------------------------------


def test_parse_query_counts_each_scoring_word_stems_and_phrases_included():
    parsed = parse_query('Cats cat CAT "cat food" dog the the the')
    assert dict(zip(parsed.terms, [parsed.counts[t] for t in parsed.terms], strict=True)) == {
        "cat": 4,
        "dog": 1,
        "food": 1,
    }
    assert "the" not in parsed.counts  # a stop word scores nothing and is not counted
    websearch = parse_query('cat cat "cat food" -cat -dog', syntax="websearch")
    assert websearch.counts == {"cat": 3, "food": 1}  # excluded words are not scoring words


# --- SQL backend -------------------------------------------------------------------------------


@pytest.fixture
def orchard():
    """Two documents of two words: "apple" in one, "banana" and "cherry" in the other, each word
    in one chunk of six (same idf, same length)."""
    rag.ingest("apple orchard", collection="fruit", source_id="apple")
    rag.ingest("banana cherry", collection="fruit", source_id="banana-cherry")
    for i in range(4):
        rag.ingest(f"gravel pebble{i}", collection="fruit", source_id=f"filler{i}")


QUERY = "apple apple apple banana cherry"


@pytest.mark.sql_statistics
@pytest.mark.parametrize(
    "k3, first",
    [
        (0, "banana-cherry"),  # apple counts once: two matching words beat one
        (1, "banana-cherry"),  # 3 apples weigh 1.5 < 2 words
        (8, "apple"),  # 3 apples weigh 27/11 = 2.45 > 2 words
        (None, "apple"),  # 3 apples weigh 3
    ],
)
def test_a_repeated_word_ranks_its_document_first_only_when_weighed(settings, orchard, k3, first):
    _search_settings(settings, BM25_K3=k3)
    results = rag.search(QUERY, mode="fulltext", collection="fruit")
    assert [r.source_id for r in results] == [
        first,
        "banana-cherry" if first == "apple" else "apple",
    ]
    scores = {r.source_id: r.score for r in results}
    part = idf(6, 1) * tf_part(1, 2, 2.0)
    assert scores["apple"] == pytest.approx(part * query_term_weight(3, k3))
    assert scores["banana-cherry"] == pytest.approx(2 * part)
    # Hybrid's full-text side carries the same BM25.
    hybrid = {r.source_id: r for r in rag.search(QUERY, mode="hybrid", collection="fruit")}
    assert hybrid["apple"].fulltext_score == pytest.approx(scores["apple"])


@pytest.mark.sql_statistics
def test_the_default_is_k3_8_and_k3_0_counts_a_repeated_word_once(settings, orchard):
    by_default = rag.search(QUERY, mode="fulltext", collection="fruit")
    _search_settings(settings, BM25_K3=8)
    assert [(r.source_id, r.score) for r in by_default] == [
        (r.source_id, r.score) for r in rag.search(QUERY, mode="fulltext", collection="fruit")
    ]
    _search_settings(settings, BM25_K3=0)
    once = rag.search("apple banana cherry", mode="fulltext", collection="fruit")
    repeated = rag.search(QUERY, mode="fulltext", collection="fruit")
    assert [(r.source_id, r.score) for r in repeated] == [(r.source_id, r.score) for r in once]


@pytest.mark.sql_statistics
def test_the_term_cap_keeps_the_rarest_words_with_their_query_weights(settings, orchard):
    _search_settings(settings, BM25_K3=None, MAX_QUERY_TERMS=2)
    # "gravel" is in four chunks: dropped by the cap however often the query repeats it.
    parsed = parse_query("gravel gravel gravel gravel apple apple banana")
    capped, weights = limit_terms(parsed, collection_ids=None)
    assert capped.terms == ["appl", "banana"] and capped.counts == {"appl": 2, "banana": 1}
    assert weights.terms == capped.terms and weights.query_weights == [2.0, 1.0]
    results = rag.search(
        "gravel gravel gravel gravel apple apple banana", mode="fulltext", collection="fruit"
    )
    part = idf(6, 1) * tf_part(1, 2, 2.0)
    assert [(r.source_id, pytest.approx(r.score)) for r in results] == [
        ("apple", pytest.approx(2 * part)),
        ("banana-cherry", pytest.approx(part)),
    ]


@pytest.mark.sql_statistics
def test_a_phrase_boost_weighs_its_words_idf_not_their_repeats(settings):
    _search_settings(settings, BM25_K3=None)
    rag.ingest("apple pie recipe", collection="bake", source_id="pie")
    rag.ingest("apple tart pie", collection="bake", source_id="tart")
    for i in range(3):
        rag.ingest(f"flour sugar{i}", collection="bake", source_id=f"f{i}")
    parsed = parse_query('"apple pie" apple apple')
    assert parsed.counts == {"appl": 3, "pie": 1}
    weights = term_weights(parsed.terms, counts=parsed.counts)
    assert weights.query_weights == [3.0, 1.0]
    (boost,) = weights.boosts(parsed)
    assert boost[1] == pytest.approx(sum(weights.idf))  # plain idf: the words carry the repeats
    results = {
        r.source_id: r.score
        for r in rag.search('"apple pie" apple apple', mode="fulltext", collection="bake")
    }
    average = (3 + 3 + 2 + 2 + 2) / 5
    idf_apple, idf_pie = idf(5, 2), idf(5, 2)
    expected_pie = (
        3 * idf_apple * tf_part(1, 3, average)
        + idf_pie * tf_part(1, 3, average)
        + idf_apple
        + idf_pie
    )
    assert results["pie"] == pytest.approx(expected_pie)
    assert results["tart"] == pytest.approx(
        3 * idf_apple * tf_part(1, 3, average) + idf_pie * tf_part(1, 3, average)
    )


def _brute_force(query: str, limit: int):
    parsed = parse_query(query)
    weights = term_weights(parsed.terms, counts=parsed.counts)
    scored = (
        Chunk.objects.matching(parsed.match)
        .with_bm25(weights, weights.boosts(parsed))
        .values_list("pk", "fulltext_score")
    )
    return [(pk, round(s, 9)) for pk, s in sorted(scored, key=lambda h: (-h[1], h[0]))[:limit]]


@pytest.mark.sql_statistics
@pytest.mark.parametrize("k3", [0, 1.2, None])
def test_pruned_ranking_equals_brute_force_with_repeated_common_words(settings, monkeypatch, k3):
    """A common word repeated in the query weighs more than its idf alone: the bound that lets
    the search stop before the common words must grow with it, or a chunk of common words only
    would be missed."""
    from django_rag.models import fulltext_search

    _search_settings(settings, BM25_K3=k3)
    rng = random.Random(3)
    common = ["apple", "bread", "cloud"]
    rare = [f"word{i}" for i in range(40)]
    for d in range(60):
        words = [
            rng.choice(common) if rng.random() < 0.7 else rng.choice(rare)
            for _ in range(rng.randint(2, 14))
        ]
        rag.ingest(" ".join(words), source_id=f"d{d}")
    monkeypatch.setattr(fulltext_search, "FULLTEXT_CANDIDATE_BUDGET", 2)  # force rounds
    query = "apple apple apple apple bread word1 word2 word3"
    for limit in (1, 3, 10):
        hits = Chunk.objects.fulltext_hits(query, limit=limit)
        assert [(pk, round(s, 9)) for pk, s in hits] == _brute_force(query, limit)


@pytest.mark.sql_statistics
@pytest.mark.parametrize("k3", [0, 8, None])
def test_a_repeated_common_word_is_not_pruned_away(settings, monkeypatch, k3):
    """The rare word's chunk is found first (its postings fit the first round); chunks of the
    common word only win once the query's six repeats weigh in: the search must read them."""
    from django_rag.models import fulltext_search

    _search_settings(settings, BM25_K3=k3)
    rag.ingest("word1 " + " ".join(f"filler{i}" for i in range(9)), source_id="rare")
    for i in range(30):
        rag.ingest(f"apple apple apple. Note {i}.", source_id=f"apple{i}")
    for i in range(20):
        rag.ingest(f"pebble stone{i}", source_id=f"pebble{i}")
    monkeypatch.setattr(fulltext_search, "FULLTEXT_CANDIDATE_BUDGET", 2)
    query = "apple " * 6 + "word1"
    (hit,) = Chunk.objects.fulltext_hits(query, limit=1)
    assert [(hit[0], round(hit[1], 9))] == _brute_force(query, 1)
    first = Chunk.objects.get(pk=hit[0]).document.source_id
    assert first == ("rare" if k3 == 0 else "apple0")  # ties of equal chunks: the first pk


@pytest.mark.django_db(False)
def test_upper_bound_includes_the_query_weight():
    weights = TermWeights(
        ["a"], [1], [2.0], 10.0, max_tf=[None], min_length=[None], query_weights=[3.0]
    )
    assert weights.upper_bound(["a"]) == pytest.approx(2.0 * 3.0 * (1.2 + 1))


# --- memory store ------------------------------------------------------------------------------


@pytest.mark.parametrize("k3, first", [(0, "banana-cherry"), (8, "apple"), (None, "apple")])
def test_memory_store_weighs_repeats_with_the_same_rule(settings, k3, first):
    _search_settings(settings, BM25_K3=k3)
    store = MemoryVectorStore()
    store.ingest("apple orchard", source_id="apple")
    store.ingest("banana cherry", source_id="banana-cherry")
    for i in range(4):
        store.ingest(f"gravel pebble{i}", source_id=f"filler{i}")
    results = rag.search(QUERY, mode="fulltext", vector_store=store)
    assert results[0].source_id == first
    scores = {r.source_id: r.score for r in results}
    part = idf(6, 1) * tf_part(1, 2, 2.0)
    assert scores["apple"] == pytest.approx(part * query_term_weight(3, k3))
    assert scores["banana-cherry"] == pytest.approx(2 * part)


# --- the setting ---------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [-1, float("nan"), float("inf"), "2", True, [1]])
def test_a_bad_k3_is_a_configuration_error(settings, orchard, value):
    _search_settings(settings, BM25_K3=value)
    with pytest.raises(ConfigurationError, match="SEARCH.BM25_K3") as caught:
        rag.search(QUERY, mode="fulltext", collection="fruit")
    assert caught.value.code
    from django.core.management.base import SystemCheckError

    with pytest.raises(SystemCheckError, match="django_rag.E005"):
        call_command("check")


@pytest.mark.parametrize("value", [0, 0.5, 8, None])
def test_good_k3_values_pass_the_system_check(settings, value):
    _search_settings(settings, BM25_K3=value)
    call_command("check")
