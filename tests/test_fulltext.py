import json
import math
import statistics
from types import SimpleNamespace

import pytest
from django.db import connection
from django.db.models import Sum

import django_rag as rag
from django_rag.exceptions import InvalidOption
from django_rag.models import Chunk, CorpusStatistic, Document, TermStatistic
from django_rag.retrieval import MemoryVectorStore
from django_rag.retrieval.fulltext import parse_query
from django_rag.retrieval.fusion import fuse
from django_rag.store import compact_statistics, recount_statistics

pytestmark = pytest.mark.django_db

MODES = ["semantic", "fulltext", "hybrid"]


def idf(n, df):
    return math.log(1 + (n - df + 0.5) / (df + 0.5))


def tf_part(tf, length, average, k1=1.2, b=0.75):
    return tf * (k1 + 1) / (tf + k1 * (1 - b + b * length / average))


@pytest.mark.sql_statistics
def test_bm25_matches_a_hand_computed_example():
    rag.ingest("cat cat dog", collection="zoo", source_id="d1")
    rag.ingest("cat bird", collection="zoo", source_id="d2")
    rag.ingest("bird bird bird fish", collection="zoo", source_id="d3")
    results = rag.search("cat", mode="fulltext", collection="zoo")
    assert [r.source_id for r in results] == ["d1", "d2"]
    average = (3 + 2 + 4) / 3
    assert results[0].score == pytest.approx(idf(3, 2) * tf_part(2, 3, average))
    assert results[1].score == pytest.approx(idf(3, 2) * tf_part(1, 2, average))
    assert results[0].fulltext_score == results[0].score and results[0].semantic_score is None
    (fish,) = rag.search("fish bird", mode="fulltext", collection="zoo", limit=1)
    expected = idf(3, 1) * tf_part(1, 4, average) + idf(3, 2) * tf_part(3, 4, average)
    assert fish.source_id == "d3" and fish.score == pytest.approx(expected)


def recomputed_statistics():
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT u.lexeme, count(*) FROM django_rag_chunk c, unnest(c.search_vector) u GROUP BY 1"
        )
        terms = dict(cursor.fetchall())
        cursor.execute(
            "SELECT count(*), coalesce(sum(fts_length), 0) FROM django_rag_chunk "
            "WHERE search_vector IS NOT NULL"
        )
        corpus = cursor.fetchone()
    return terms, corpus


def stored_statistics():
    """What searches read: the base rows plus the deltas not folded in yet."""
    stored = recount_statistics()["stored"]
    return stored["terms"], (stored["chunks"], stored["length"])


def base_statistics():
    """The base rows alone, summed over collections."""
    terms = {}
    for t, df in TermStatistic.objects.values_list("term", "document_frequency"):
        terms[t] = terms.get(t, 0) + df
    corpus = CorpusStatistic.objects.aggregate(c=Sum("chunk_count"), n=Sum("total_length"))
    return {t: df for t, df in terms.items() if df}, (corpus["c"] or 0, corpus["n"] or 0)


def test_statistics_follow_ingest_replace_and_delete():
    first = rag.ingest(
        "Apples grow on trees. " * 60, collection="s", source_id="a", chunk_size=30, chunk_overlap=5
    )
    rag.ingest("Bananas grow in bunches.", collection="s", source_id="b")
    assert stored_statistics() == recomputed_statistics()
    assert stored_statistics()[1][0] == Chunk.objects.count() > 2
    rag.ingest("Cherries are red.", collection="s", source_id="a", replace=True)
    assert stored_statistics() == recomputed_statistics()
    assert not Chunk.objects.filter(document_id=first.pk).exists()
    Document.objects.filter(source_id="b").delete()  # a queryset delete, as the admin does
    assert stored_statistics() == recomputed_statistics()
    # Folding the deltas into the base rows changes no figure.
    assert compact_statistics()
    assert base_statistics() == stored_statistics() == recomputed_statistics()
    rag.delete(Document.objects.get(source_id="a"))
    assert stored_statistics() == ({}, (0, 0))


def test_web_search_syntax():
    rag.ingest("The quick brown fox jumps over the lazy dog.", collection="w", source_id="fox")
    rag.ingest("A brown bear is quick to anger.", collection="w", source_id="bear")
    rag.ingest("Lazy afternoons with a good book.", collection="w", source_id="book")

    def ids(q):
        return {
            r.source_id for r in rag.search(q, mode="fulltext", collection="w", syntax="websearch")
        }

    assert ids("quick brown") == {"fox", "bear"}  # any word may match
    assert ids('"quick brown"') == {"fox"}  # a phrase must match as written
    assert ids("quick -bear") == {"fox"}  # excluded words remove chunks
    assert ids("lazy OR book") == {"fox", "book"}
    assert ids("the of and") == set()  # stop words only
    assert ids("zebra") == set()  # nothing matches
    hybrid = rag.search("quick -bear", mode="hybrid", collection="w", syntax="websearch")
    assert hybrid[0].source_id == "fox"
    assert all(r.source_id != "bear" for r in hybrid)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "query",
    [
        "&",
        "|",
        "!",
        "( )",
        ":",
        "*",
        "'",
        '"',
        "\\",
        "a & b | !c",
        "fox:*",
        "'; DROP TABLE x; --",
        '"unclosed phrase',
        "-",
        "--",
        "-fox",
        "(fox",
        "fox)",
        "!!!",
        "   ",
        "",
        "\x00",
        "ʼ≠∑ 中文",
        "e-mail AT&T C:\\path 100%",
        '"" ""',
        "OR AND",
    ],
)
def test_any_query_string_is_safe(mode, query):
    rag.ingest("The quick brown fox.", collection="q")
    results = rag.search(query, mode=mode, collection="q")
    assert isinstance(results, list)
    if mode == "fulltext" and query in ("&", "'", "   ", "", "!!!", "OR AND", "-"):
        assert results == []


def test_parse_query_shapes():
    parsed = parse_query('refunds "credit card" -paypal', syntax="websearch")
    assert parsed.phrases and "credit" in parsed.terms and "paypal" not in parsed.terms
    assert parsed.exclude == "'paypal'"
    assert parse_query("the and of").match is None


def test_fusion_arithmetic():
    items = [
        SimpleNamespace(name="a", semantic_score=0.9, fulltext_score=0.0),
        SimpleNamespace(name="b", semantic_score=0.5, fulltext_score=10.0),
        SimpleNamespace(name="c", semantic_score=0.7, fulltext_score=5.0),
    ]
    rrf = fuse(list(items), fusion="rrf", rrf_k=60)
    scores = {i.name: i.score for i in rrf}
    assert scores["a"] == pytest.approx(1 / 61)  # no full-text match: no full-text rank
    assert scores["b"] == pytest.approx(1 / 63 + 1 / 61)
    assert scores["c"] == pytest.approx(1 / 62 + 1 / 62)
    assert [i.name for i in rrf] == ["b", "c", "a"]
    weighted = fuse(list(items), fusion="weighted", semantic_weight=0.6, fulltext_weight=0.4)
    scores = {i.name: i.score for i in weighted}
    assert scores["a"] == pytest.approx(0.6 * 1.0 + 0.4 * 0.0)
    assert scores["b"] == pytest.approx(0.6 * 0.0 + 0.4 * 1.0)
    assert scores["c"] == pytest.approx(0.6 * 0.5 + 0.4 * 0.5)
    assert fuse([], fusion="rrf") == []
    with pytest.raises(InvalidOption):
        fuse(list(items), fusion="borda")
    with pytest.raises(InvalidOption):
        fuse(list(items), fusion="adaptive", fulltext_weight=float("nan"))
    with pytest.raises(InvalidOption):
        fuse(list(items), fusion="weighted", semantic_weight=-1)


def test_adaptive_fusion_arithmetic():
    """Standard scores against each side's own list, weighted by how far each side's best
    candidate stands out of its list: (best - mean) / best."""
    items = [
        SimpleNamespace(name="a", semantic_score=0.9, fulltext_score=0.0),
        SimpleNamespace(name="b", semantic_score=0.5, fulltext_score=10.0),
        SimpleNamespace(name="c", semantic_score=0.7, fulltext_score=5.0),
    ]
    fused = fuse(list(items), fusion="adaptive", semantic_weight=0.6, fulltext_weight=0.4)
    semantic, fulltext = [0.9, 0.7, 0.5], [10.0, 5.0]  # each side's list (no match: not in it)
    s_out = (0.9 - statistics.fmean(semantic)) / 0.9
    f_out = (10.0 - statistics.fmean(fulltext)) / 10.0
    share = 0.6 * s_out / (0.6 * s_out + 0.4 * f_out)

    def z(value, values):
        return (value - statistics.fmean(values)) / statistics.pstdev(values)

    scores = {i.name: i.score for i in fused}
    for item in items:
        expected = share * z(item.semantic_score, semantic)
        expected += (1 - share) * z(item.fulltext_score, fulltext)
        assert scores[item.name] == pytest.approx(expected)
    assert [i.name for i in fused] == sorted(scores, key=lambda name: -scores[name])
    # The side that stands out more gets more weight: a flat full-text list counts for little.
    flat = [
        SimpleNamespace(name="a", semantic_score=0.9, fulltext_score=5.0),
        SimpleNamespace(name="b", semantic_score=0.3, fulltext_score=5.1),
    ]
    assert [
        i.name for i in fuse(flat, fusion="adaptive", semantic_weight=0.5, fulltext_weight=0.5)
    ] == ["a", "b"]
    # Nothing matched the words: the semantic order and scores stand.
    unmatched = [
        SimpleNamespace(name=n, semantic_score=s, fulltext_score=0.0)
        for n, s in (("x", 0.2), ("y", 0.8))
    ]
    assert [(i.name, i.score) for i in fuse(unmatched, fusion="adaptive")] == [
        ("y", 0.8),
        ("x", 0.2),
    ]
    # Only the `pool` best of each side define its list.
    pooled = fuse(list(items), fusion="adaptive", pool=1)
    assert {i.name: i.score for i in pooled}.keys() == {"a", "b", "c"}


def test_hybrid_carries_both_scores_and_beats_either_side_on_mixed_queries():
    rag.ingest("Error code E1234 means the disk is full.", collection="h", source_id="code")
    rag.ingest(
        "When storage runs out of space the system stops writing.",
        collection="h",
        source_id="prose",
    )
    rag.ingest("Unrelated text about gardening and tomatoes.", collection="h", source_id="garden")
    results = rag.search("E1234 storage space", mode="hybrid", collection="h", limit=3)
    assert {r.source_id for r in results[:2]} == {"code", "prose"}
    for result in results:
        assert result.semantic_score is not None and result.fulltext_score is not None
    assert results[0].score >= results[1].score >= results[2].score
    rrf = rag.search("E1234 storage space", mode="hybrid", fusion="rrf", collection="h", limit=3)
    by_semantic = sorted(rrf, key=lambda r: -r.semantic_score)
    by_fulltext = sorted((r for r in rrf if r.fulltext_score > 0), key=lambda r: -r.fulltext_score)
    for result in rrf:
        expected = 1 / (60 + by_semantic.index(result) + 1)
        if result in by_fulltext:
            expected += 1 / (60 + by_fulltext.index(result) + 1)
        assert result.score == pytest.approx(expected)


@pytest.mark.parametrize("fusion", ["adaptive", "weighted", "rrf"])
def test_readable_fused_scores_keep_the_order_and_are_never_negative(fusion):
    import random

    generator = random.Random(7)
    for size in (1, 2, 5, 40):
        items = [
            SimpleNamespace(
                name=i,
                semantic_score=generator.uniform(-0.3, 0.9),
                fulltext_score=generator.choice([0.0, generator.uniform(0.1, 12.0)]),
            )
            for i in range(size)
        ]
        options = {"fusion": fusion, "semantic_weight": 0.7, "fulltext_weight": 0.6, "pool": 30}
        raw = fuse([SimpleNamespace(**vars(i)) for i in items], **options)
        readable = fuse([SimpleNamespace(**vars(i)) for i in items], readable=True, **options)
        assert [i.name for i in readable] == [i.name for i in raw]
        assert all(0 <= i.score <= 1 for i in readable), [i.score for i in readable]
        assert [i.score for i in readable] == sorted((i.score for i in readable), reverse=True)
    # Nothing matched the words: still the semantic order, on the same 0..1 scale.
    unmatched = [SimpleNamespace(name=n, semantic_score=s, fulltext_score=0.0) for n, s in
                 (("x", -0.4), ("y", -0.1), ("z", 0.3))]  # fmt: skip
    fused = fuse(unmatched, fusion="adaptive", readable=True)
    assert [i.name for i in fused] == ["z", "y", "x"]
    assert all(0 < i.score < 1 for i in fused)


def test_hybrid_scores_are_readable_and_the_ranking_unchanged():
    from django_rag.conf import search_setting

    texts = [
        "Refunds are processed within five business days of the return.",
        "A refund goes back to the card used for the purchase.",
        "Shipping is free above fifty euros; refunds exclude shipping costs.",
        "Our office is closed on public holidays.",
        "Gift cards cannot be refunded or exchanged for cash.",
        "Tomatoes grow best in full sun with regular watering.",
    ]
    for number, text in enumerate(texts):
        rag.ingest(text, collection="scores", source_id=f"t{number}")
    for query in ("how long do refunds take", "refund gift card", "sunny garden"):
        results = rag.search(query, mode="hybrid", collection="scores", limit=20)
        assert len(results) == len(texts)  # the whole corpus: every chunk is a candidate
        assert all(0 <= r.score <= 1 for r in results), [r.score for r in results]
        # The raw adaptive fusion of the same components ranks them identically.
        raw = fuse(
            [
                SimpleNamespace(
                    pk=r.chunk_id, semantic_score=r.semantic_score, fulltext_score=r.fulltext_score
                )
                for r in sorted(results, key=lambda r: r.chunk_id)
            ],  # fmt: skip
            fusion="adaptive",
            semantic_weight=search_setting("SEMANTIC_WEIGHT"),
            fulltext_weight=search_setting("FULLTEXT_WEIGHT"),
            pool=20 * search_setting("CANDIDATES"),
        )
        assert [r.chunk_id for r in results] == [item.pk for item in raw], query
        assert results[0].score > 0.5  # the best hit is above the query's average candidate


def test_threshold_per_mode():
    rag.ingest("alpha beta gamma", collection="t")
    rag.ingest("alpha delta", collection="t")
    fulltext = rag.search("alpha beta", mode="fulltext", collection="t")
    cut = fulltext[0].score - 1e-9
    assert len(rag.search("alpha beta", mode="fulltext", collection="t", threshold=cut)) == 1
    hybrid = rag.search("alpha beta", mode="hybrid", collection="t")
    assert (
        rag.search("alpha beta", mode="hybrid", collection="t", threshold=hybrid[0].score + 1) == []
    )


@pytest.mark.parametrize("mode", MODES)
def test_metadata_filter_in_every_mode(mode):
    rag.ingest(
        "Refund policy for books.", collection="m", metadata={"lang": "en", "tags": ["a", "b"]}
    )
    rag.ingest("Refund policy for toys.", collection="m", metadata={"lang": "fr", "tags": ["b"]})
    found = rag.search("refund policy", mode=mode, metadata={"lang": "en"})
    assert [r.metadata["lang"] for r in found] == ["en"]
    assert len(rag.search("refund policy", mode=mode, metadata={"tags": ["b"]})) == 2
    assert rag.search("refund policy", mode=mode, metadata={"lang": "de"}) == []
    store = MemoryVectorStore()
    store.ingest(
        "Refund policy for books.", collection="m", metadata={"lang": "en", "tags": ["a", "b"]}
    )
    store.ingest("Refund policy for toys.", collection="m", metadata={"lang": "fr", "tags": ["b"]})
    found = rag.search("refund policy", mode=mode, metadata={"lang": "en"}, vector_store=store)
    assert [r.metadata["lang"] for r in found] == ["en"]
    assert (
        len(rag.search("refund policy", mode=mode, metadata={"tags": ["b"]}, vector_store=store))
        == 2
    )


def test_memory_store_fulltext_and_hybrid():
    store = MemoryVectorStore()
    store.ingest("cat cat dog", source_id="d1")
    store.ingest("cat bird", source_id="d2")
    store.ingest("bird bird bird fish", source_id="d3")
    results = rag.search("cat", mode="fulltext", vector_store=store)
    average = 3
    assert [r.source_id for r in results] == ["d1", "d2"]
    assert results[0].score == pytest.approx(idf(3, 2) * tf_part(2, 3, average))
    websearch = {"mode": "fulltext", "vector_store": store, "syntax": "websearch"}
    assert [r.source_id for r in rag.search('"bird fish"', **websearch)] == ["d3"]
    assert [r.source_id for r in rag.search("bird -fish", **websearch)] == ["d2"]
    hybrid = rag.search("cat", mode="hybrid", fusion="rrf", vector_store=store)
    # d1 and d2 have the same cosine up to float32 rounding, so which of them ranks first on
    # the semantic side depends on the machine (exactly equal on some, where the tie keeps the
    # order of ingestion): RRF is checked against the semantic ranking the store gives.
    semantic = rag.search("cat", mode="semantic", vector_store=store)
    semantic_rank = {r.source_id: rank for rank, r in enumerate(semantic, start=1)}
    fulltext_rank = {"d1": 1, "d2": 2}  # d3 matches no word: no full-text rank
    expected = {
        source: 1 / (60 + rank)
        + (1 / (60 + fulltext_rank[source]) if source in fulltext_rank else 0)
        for source, rank in semantic_rank.items()
    }
    assert {r.source_id: r.score for r in hybrid} == pytest.approx(expected)
    assert {r.source_id for r in hybrid[:2]} == {"d1", "d2"} and hybrid[2].source_id == "d3"
    assert all(r.fulltext_score > 0 for r in hybrid[:2])
    assert rag.search("zebra", mode="fulltext", vector_store=store) == []


def test_search_command_modes():
    from io import StringIO

    from django.core.management import call_command

    rag.ingest("The quick brown fox.", collection="cmd")
    out = StringIO()
    call_command("rag_search", "fox", "--mode", "fulltext", stdout=out)
    assert "quick brown fox" in out.getvalue()


NATURAL = {
    "cooking": "Cooking Light is a magazine about healthy cooking and recipes.",
    "vibe": "Vibe is a magazine about music and hip hop culture.",
    "manson": "Manson is a documentary film about Charles Manson.",
    "years": "500 Years Later is a documentary film about the African diaspora.",
    "state": "A state-of-the-art drill from O'Brien's workshop.",
}


@pytest.mark.parametrize("mode", ["fulltext", "hybrid"])
@pytest.mark.parametrize(
    ("question", "expected"),
    [
        ('Are both "Cooking Light" and "Vibe" magazines?', {"cooking", "vibe"}),
        ('What type of film are both "500 Years Later" and "Manson"?', {"years", "manson"}),
        ("Which drill came from O'Brien's state-of-the-art workshop?", {"state"}),
        ("-5 reasons Vibe matters", {"vibe"}),
        ('"magazine"', {"cooking", "vibe"}),
    ],
)
def test_questions_are_not_queries(mode, question, expected):
    """By default quotes and minus signs never filter: any indexed word of a question finds
    something, and a quoted phrase ranks the chunks holding it first."""
    for source_id, text in NATURAL.items():
        rag.ingest(text, collection="q", source_id=source_id)
    found = rag.search(question, mode=mode, collection="q", limit=5)
    assert found, question
    assert expected <= {r.source_id for r in found[: len(expected)]}
    # The same questions as strict web-search syntax mostly find nothing (the old default).
    if mode == "fulltext" and " and " in question:
        assert rag.search(question, mode=mode, collection="q", syntax="websearch") == []


def test_a_quoted_phrase_boosts_instead_of_filtering():
    rag.ingest("The credit card was declined at the shop.", collection="p", source_id="phrase")
    rag.ingest("Card games need credit for every win and card.", collection="p", source_id="words")
    found = [
        r.source_id for r in rag.search('"credit card" refunds', mode="fulltext", collection="p")
    ]
    assert found == ["phrase", "words"]
    # Memory store: the same reading.
    store = MemoryVectorStore()
    store.ingest("The credit card was declined at the shop.", source_id="phrase")
    store.ingest("Card games need credit for every win and card.", source_id="words")
    found = rag.search('"credit card" refunds', mode="fulltext", vector_store=store)
    assert [r.source_id for r in found] == ["phrase", "words"]
    with pytest.raises(InvalidOption, match="syntax"):
        rag.search("cards", mode="fulltext", syntax="lucene")


def test_search_command_reads_both_syntaxes():
    from io import StringIO

    from django.core.management import call_command

    rag.ingest("Refunds by credit card take five days.", collection="c", source_id="card")
    rag.ingest("Refunds by paypal take two days.", collection="c", source_id="paypal")

    def sources(*extra):
        out = StringIO()
        call_command(
            "rag_search", "refunds -paypal", "--mode", "fulltext", "--json", *extra, stdout=out
        )
        return {r["source_id"] for r in json.loads(out.getvalue())}

    assert sources() == {"card", "paypal"}
    assert sources("--syntax", "websearch") == {"card"}
