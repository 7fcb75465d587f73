"""Arcana parity gaps of issue 25 (per-call ef_search, collection descriptions and strict
ingest, the document read API, ...), each against real PostgreSQL + pgvector."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

import django_rag as rag
from django_rag.exceptions import InvalidOption

pytestmark = pytest.mark.django_db


def _ef_search_settings(captured):
    sql = " ".join(query["sql"] for query in captured.captured_queries)
    return sql.count("set_config('hnsw.ef_search'"), sql


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("mode", ["semantic", "hybrid"])
def test_per_call_hnsw_ef_search_is_set_for_the_search_only(mode):
    for i in range(3):
        rag.ingest(f"Refunds take {i + 10} days to reach the card.", collection="ef")
    with connection.cursor() as cursor:
        cursor.execute("SHOW hnsw.ef_search")
        before = cursor.fetchone()[0]
    with CaptureQueriesContext(connection) as captured:
        results = rag.search("refunds card", mode=mode, limit=2, hnsw_ef_search=37)
    count, sql = _ef_search_settings(captured)
    assert count == 1 and "set_config('hnsw.ef_search', '37', true)" in sql
    assert len(results) == 2
    with connection.cursor() as cursor:  # SET LOCAL: gone with the search's transaction
        cursor.execute("SHOW hnsw.ef_search")
        assert cursor.fetchone()[0] == before
    # Raised to the rows the scan must return when smaller, as the setting is (hybrid's
    # semantic side reads limit x candidates).
    with CaptureQueriesContext(connection) as captured:
        rag.search("refunds card", mode=mode, limit=3, candidates=4, hnsw_ef_search=1)
    raised = 3 if mode == "semantic" else 12
    assert f"set_config('hnsw.ef_search', '{raised}', true)" in _ef_search_settings(captured)[1]


def test_hnsw_ef_search_defaults_to_the_setting(settings):
    rag.ingest("Refunds take ten days.", collection="ef")
    settings.DJANGO_RAG = {**settings.DJANGO_RAG, "SEARCH": {"HNSW_EF_SEARCH": 55}}
    with CaptureQueriesContext(connection) as captured:
        rag.search("refunds", limit=1)
    assert "set_config('hnsw.ef_search', '55', true)" in _ef_search_settings(captured)[1]


@pytest.mark.parametrize("value", [0, 1001, "40", 2.5, True])
def test_hnsw_ef_search_out_of_range_is_refused_before_any_query(value):
    with CaptureQueriesContext(connection) as captured, pytest.raises(InvalidOption) as caught:
        rag.search("refunds", hnsw_ef_search=value)
    assert "hnsw_ef_search must be an integer from 1 to 1000" in str(caught.value)
    assert caught.value.code == "invalid_option"
    assert captured.captured_queries == []
