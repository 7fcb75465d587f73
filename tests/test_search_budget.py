"""The cost budget of one search: ``SEARCH["MAX_QUERY_TERMS"]`` caps the distinct words a query
scores with (the most selective kept), ``SEARCH["STATEMENT_TIMEOUT"]`` cancels a statement that
runs too long with a typed error. On both full-text backends (scripts/test-textsearch.sh runs
this file on pg_textsearch)."""

import pytest
from django.core.management import call_command
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

import django_rag as rag
from django_rag.exceptions import ConfigurationError, SearchTimeout
from django_rag.models.fulltext import limit_terms, parse_query
from django_rag.models.managers import ChunkQuerySet

pytestmark = pytest.mark.django_db

COMMON = ["anchor", "lantern", "meadow", "harbor"]  # each its own lexeme
RARE = ["quokka", "zephyr", "nimbus"]


def _budget(settings, **search):
    """DJANGO_RAG with these SEARCH keys (the run's FULLTEXT_BACKEND kept)."""
    current = dict(settings.DJANGO_RAG)
    current["SEARCH"] = {**current.get("SEARCH", {}), **search}
    settings.DJANGO_RAG = current


@pytest.fixture
def corpus():
    """Twelve chunks: the common words in every one, each rare word in one."""
    for i in range(12):
        words = [*COMMON, "filler"]
        if i < len(RARE):
            words.append(RARE[i])
        rag.ingest(" ".join(words) + ".", collection="budget", source_id=f"d{i}")


def _ranking_sql(captured) -> list[str]:
    """The statements that score chunks: the SQL backend's BM25, the index's to_bm25query."""
    return [
        q["sql"] for q in captured if "fulltext_score" in q["sql"] or "to_bm25query" in q["sql"]
    ]


@pytest.mark.parametrize("mode", ["fulltext", "hybrid"])
def test_a_query_over_the_cap_scores_only_its_most_selective_words(settings, corpus, mode):
    _budget(settings, MAX_QUERY_TERMS=3)
    query = " ".join([*COMMON, *RARE, "xylograph"])  # 8 distinct words, one in no chunk
    parsed = parse_query(query)
    capped, _ = limit_terms(parsed)
    assert sorted(capped.terms) == sorted(RARE)  # the three in the fewest chunks
    assert capped.dropped_terms == len(parsed.terms) - 3
    assert sorted(capped.words) == sorted(RARE)
    assert capped.match == " | ".join(f"'{t}'" for t in capped.terms)

    with CaptureQueriesContext(connection) as captured:
        results = rag.search(query, mode=mode, collection="budget", limit=10)
    ranking = _ranking_sql(captured)
    assert ranking
    for sql in ranking:  # the SQL parameters of every scoring statement
        assert all(word in sql for word in RARE), sql
        assert not any(word in sql for word in [*COMMON, "xylograph"]), sql
    holders = {f"d{i}" for i in range(len(RARE))}
    top = [r.source_id for r in results if r.fulltext_score]
    assert set(top) == holders  # only the chunks holding a kept word score

    _budget(settings, MAX_QUERY_TERMS=None)  # no cap: every word scores, as before
    with CaptureQueriesContext(connection) as captured:
        rag.search(query, mode=mode, collection="budget", limit=10)
    assert any("anchor" in sql for sql in _ranking_sql(captured))


def test_a_query_within_the_cap_is_unchanged(settings, corpus):
    _budget(settings, MAX_QUERY_TERMS=4)
    for query in ["quokka anchor", "zephyr nimbus meadow harbor", "lantern"]:
        parsed = parse_query(query)
        assert limit_terms(parsed)[0] is parsed
    queries = ["quokka anchor", "zephyr nimbus meadow", "harbor lantern quokka filler"]
    capped = [[r.chunk_id for r in rag.search(q, mode="fulltext", limit=5)] for q in queries]
    _budget(settings, MAX_QUERY_TERMS=None)
    assert capped == [
        [r.chunk_id for r in rag.search(q, mode="fulltext", limit=5)] for q in queries
    ]


def test_the_longest_accepted_query_scores_with_at_most_the_default_cap(settings):
    """The issue's case: 10,000 characters of distinct corpus words (1,400 scored each
    candidate before). The default cap applies without any setting."""
    vocabulary = [f"qz{i:04d}x" for i in range(1400)]
    for start in range(0, len(vocabulary), 100):
        rag.ingest(" ".join(vocabulary[start : start + 100]), source_id=f"v{start}")
    query = " ".join(vocabulary)[:10_000]
    default = limit_terms(parse_query(query))[0]
    assert 0 < len(default.terms) <= 32 < len(parse_query(query).terms)
    with CaptureQueriesContext(connection) as captured:
        assert rag.search(query, mode="fulltext", limit=5)
    for sql in _ranking_sql(captured):
        assert sum(word in sql for word in vocabulary) <= 32


@pytest.mark.parametrize(
    "key, value",
    [
        ("MAX_QUERY_TERMS", 0),
        ("MAX_QUERY_TERMS", "64"),
        ("MAX_QUERY_TERMS", True),
        ("STATEMENT_TIMEOUT", 0),
        ("STATEMENT_TIMEOUT", -1),
        ("STATEMENT_TIMEOUT", float("nan")),
        ("STATEMENT_TIMEOUT", "5s"),
    ],
)
def test_bad_budget_settings_are_configuration_errors(settings, corpus, key, value):
    _budget(settings, **{key: value})
    with pytest.raises(ConfigurationError, match=f"SEARCH.{key}"):
        rag.search(" ".join([*COMMON, *RARE]), mode="fulltext")
    from django.core.management.base import SystemCheckError

    with pytest.raises(SystemCheckError, match="django_rag.E005"):
        call_command("check")


@pytest.fixture
def slow_statement(monkeypatch):
    """Every full-text ranking first runs a statement that takes a second."""
    original = ChunkQuerySet.fulltext_hits

    def slow(self, *args, **kwargs):
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_sleep(1)")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(ChunkQuerySet, "fulltext_hits", slow)


def _statement_timeout() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SHOW statement_timeout")
        return cursor.fetchone()[0]


@pytest.fixture
def fresh_backend():
    """A new server backend: pg_textsearch 1.0 stops honouring statement_timeout in a backend
    once a transaction that wrote to its index rolled back (every earlier test's did), and
    for the rest of a transaction that wrote to it (docs/search.md, "Cost budget")."""
    connection.close()


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("fresh_backend")
def test_a_statement_past_the_timeout_raises_search_timeout(settings, corpus, slow_statement):
    before = _statement_timeout()
    _budget(settings, STATEMENT_TIMEOUT=0.05)
    with pytest.raises(SearchTimeout) as caught:
        rag.search("quokka", mode="fulltext", collection="budget")
    error = caught.value
    assert error.code == "search_timeout" and isinstance(error, TimeoutError)
    assert error.seconds == 0.05 and error.database == "default"
    assert "STATEMENT_TIMEOUT" in str(error) and "MAX_QUERY_TERMS" in str(error)
    # The connection is usable and its own timeout untouched.
    assert _statement_timeout() == before
    _budget(settings, STATEMENT_TIMEOUT=30)
    assert [r.source_id for r in rag.search("quokka", mode="fulltext", collection="budget")] == [
        "d0"
    ]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("fresh_backend")
def test_the_timeout_ends_with_the_search(settings, corpus):
    """Inside the caller's transaction the search's timeout does not outlive the search."""
    _budget(settings, STATEMENT_TIMEOUT=0.2)
    with transaction.atomic():
        before = _statement_timeout()
        assert rag.search("zephyr", mode="hybrid", collection="budget")
        assert _statement_timeout() == before
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_sleep(0.4)")  # the caller's statement: not cancelled
    _budget(settings, STATEMENT_TIMEOUT=None)
    assert rag.search("zephyr", mode="fulltext", collection="budget")
