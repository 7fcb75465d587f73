"""VECTOR_INDEX_TYPE: the chunk vectors' HNSW index holds `vector` or `halfvec`, and every
semantic query orders by the distance the index holds, so the planner uses it.

The tests that build a halfvec index skip on pgvector before 0.7 (scripts/test-pg16.sh runs
this module on pgvector 0.6.2, where the setting must give a typed error and E013 instead).
"""

import importlib
import random
from io import StringIO

import numpy as np
import pytest
from django.core.management import call_command
from django.db import connection
from hypothesis import HealthCheck, given
from hypothesis import settings as examples
from hypothesis import strategies as st

import django_rag as rag
from django_rag import maintenance
from django_rag.checks import check_database, check_settings
from django_rag.exceptions import ConfigurationError
from django_rag.models import Chunk, Job
from django_rag.models import vector_index as vi
from django_rag.models.semantic_search import pgvector_version
from django_rag.store import schema

pytestmark = pytest.mark.django_db

HALF = {"EMBEDDER": "hashing", "VECTOR_INDEX_TYPE": "halfvec"}
BIG = {"BACKEND": "hashing", "OPTIONS": {"dimensions": 3072, "model_name": "hashing-3072"}}
HALF_3072 = {"EMBEDDER": BIG, "EMBEDDING_DIMENSIONS": 3072, "VECTOR_INDEX_TYPE": "halfvec"}


def ids(messages):
    return [m.id for m in messages]


@pytest.fixture
def halfvec():
    if pgvector_version() < (0, 7):
        pytest.skip("pgvector before 0.7 has no halfvec (test_halfvec_on_pgvector_06 covers it)")


def index():
    return vi.installed_index(connection)


def explain(statement, params=()) -> str:
    """EXPLAIN with sequential scans, bitmap scans and sorts discouraged (restored after: the
    test's transaction outlives the savepoint), so that a plan without the HNSW index means
    the index cannot serve the statement's ORDER BY."""
    discouraged = ("enable_seqscan", "enable_bitmapscan", "enable_sort")
    with connection.cursor() as cursor:
        # The test's own rows, not the statistics earlier tests left (autovacuum may have
        # analyzed the table while another test's rows were in it): the plan is the same
        # whatever ran before.
        cursor.execute("ANALYZE django_rag_chunk")
        for setting in discouraged:
            cursor.execute(f"SET LOCAL {setting} = off")
        try:
            cursor.execute("EXPLAIN " + statement, params)
            return "\n".join(row[0] for row in cursor.fetchall())
        finally:
            for setting in discouraged:
                cursor.execute(f"SET LOCAL {setting} = on")


def explain_searches(run) -> list[str]:
    """The plans (:func:`explain`) of the ranking statements ``run()`` sends: those that
    order by a cosine distance with a LIMIT."""
    sent = []

    def record(execute, sql, params, many, context):
        sent.append((sql, params))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        run()
    plans = []
    for sql, params in sent:
        *prelude, statement = sql.split("; ")  # the set_config() calls of a search
        if "<=>" not in statement or "LIMIT" not in statement:
            continue
        plans.append(explain(statement, list(params or ())[2 * len(prelude) :]))
    assert plans, "no ranking statement was sent"
    return plans


@pytest.fixture
def corpus():
    """300 chunks of random words in two collections (1 in 10 in 'few')."""
    rng = random.Random(3)
    words = [f"w{i}" for i in range(400)]
    rag.ingest_many(
        [{"text": " ".join(rng.choices(words, k=30)), "source_id": f"d{i}"} for i in range(270)],
        collection="many",
    )
    rag.ingest_many(
        [{"text": " ".join(rng.choices(words, k=30)), "source_id": f"f{i}"} for i in range(30)],
        collection="few",
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE django_rag_chunk")
    return rng, words


# --- the setting -------------------------------------------------------------------------------


def test_the_setting_takes_vector_or_halfvec(settings):
    settings.DJANGO_RAG = {"EMBEDDER": "hashing", "VECTOR_INDEX_TYPE": "float16"}
    (error,) = check_settings()
    assert error.id == "django_rag.E005" and "VECTOR_INDEX_TYPE" in error.msg
    assert "'vector'" in error.msg and "'halfvec'" in error.msg
    settings.DJANGO_RAG = HALF
    assert check_settings() == []


def test_models_over_2000_dimensions_need_halfvec(settings):
    settings.DJANGO_RAG = {**HALF_3072, "VECTOR_INDEX_TYPE": "vector"}
    (error,) = check_settings()
    assert error.id == "django_rag.E005"
    assert "VECTOR_INDEX_TYPE = 'halfvec'" in error.msg and "2000" in error.msg
    settings.DJANGO_RAG = HALF_3072
    assert check_settings() == []
    big = {"BACKEND": "hashing", "OPTIONS": {"dimensions": 4001}}
    settings.DJANGO_RAG = {**HALF, "EMBEDDER": big, "EMBEDDING_DIMENSIONS": 4001}
    (error,) = check_settings()
    assert error.id == "django_rag.E005" and "above 4000" in error.msg


# --- rebuilding, the check, the command, the migration ------------------------------------------


def test_switching_the_setting_and_rebuilding_gives_an_index_of_that_type(halfvec, settings):
    assert index().kind == "vector" and schema.index_state()["matches"]
    assert "django_rag.W007" not in ids(check_database(databases=["default"]))

    settings.DJANGO_RAG = HALF
    (warning,) = [m for m in check_database(databases=["default"]) if m.id == "django_rag.W007"]
    assert "holds vector" in warning.msg and "'halfvec'" in warning.msg
    assert "rag_maintenance vector-index --apply" in warning.hint
    out = StringIO()
    call_command("rag_maintenance", "vector-index", stdout=out)
    assert "is vector but VECTOR_INDEX_TYPE='halfvec'. Dry run" in out.getvalue()
    assert index().kind == "vector"

    out = StringIO()
    call_command("rag_maintenance", "vector-index", "--apply", stdout=out)
    assert "Rebuilt the HNSW index as halfvec(384)" in out.getvalue()
    found = index()
    assert (found.kind, found.dimensions) == ("halfvec", 384)
    assert "halfvec_cosine_ops" in found.definition and "m='16'" in found.definition
    assert check_database(databases=["default"]) == []
    out = StringIO()
    call_command("rag_info", stdout=out)
    assert "Vector index: halfvec(384) (VECTOR_INDEX_TYPE='halfvec')" in out.getvalue()
    assert maintenance.vector_index(apply=True)["rebuilt"] is False  # already matches

    settings.DJANGO_RAG = {"EMBEDDER": "hashing"}
    assert "holds halfvec(384)" in " ".join(
        m.msg for m in check_database(databases=["default"]) if m.id == "django_rag.W007"
    )
    state = maintenance.vector_index(apply=True)
    assert state == {
        "configured": "vector",
        "dimensions": 384,
        "index": "vector",
        "matches": True,
        "rebuilt": True,
    }
    assert "vector_cosine_ops" in index().definition
    assert check_database(databases=["default"]) == []


def test_the_info_page_shows_the_index_type(staff, settings):
    from django.urls import reverse

    body = staff.get(reverse("django_rag_dashboard:info")).content.decode()
    assert "Vector index: vector (VECTOR_INDEX_TYPE vector)" in body
    assert "does not match" not in body
    settings.DJANGO_RAG = HALF
    body = staff.get(reverse("django_rag_dashboard:info")).content.decode()
    assert "VECTOR_INDEX_TYPE halfvec)" in body
    assert "rag_maintenance vector-index --apply" in body


def test_a_missing_index_is_w006(settings):
    with connection.cursor() as cursor:
        cursor.execute(f"DROP INDEX {vi.HNSW_INDEX}")
    (warning,) = [m for m in check_database(databases=["default"]) if m.id == "django_rag.W007"]
    assert "is missing" in warning.msg
    assert maintenance.vector_index(apply=True)["index"] == "vector"


def test_migration_0016_rebuilds_an_index_of_another_type(halfvec, settings):
    migration = importlib.import_module("django_rag.migrations.0016_vector_index_type")

    class Editor:
        pass

    editor = Editor()
    editor.connection = connection
    migration.sync(None, editor)  # the setting says vector, as the index: nothing to do
    assert index().kind == "vector"
    settings.DJANGO_RAG = HALF
    migration.sync(None, editor)
    assert index().describe() == "halfvec(384)"


@pytest.mark.django_db(transaction=True)
def test_the_command_builds_concurrently_outside_a_transaction(halfvec, settings):
    """Outside a transaction (the command's case) the new index is built with CREATE INDEX
    CONCURRENTLY under another name, then swapped in."""
    sent = []

    def record(execute, sql, params, many, context):
        sent.append(sql)
        return execute(sql, params, many, context)

    settings.DJANGO_RAG = HALF
    try:
        with connection.execute_wrapper(record):
            call_command("rag_maintenance", "vector-index", "--apply", stdout=StringIO())
        assert index().describe() == "halfvec(384)"
        assert any(s.startswith("CREATE INDEX CONCURRENTLY django_rag_chunk_hnsw_rebuilt")
                   for s in sent)  # fmt: skip
    finally:
        settings.DJANGO_RAG = {"EMBEDDER": "hashing"}
        maintenance.vector_index(apply=True)
    assert index().kind == "vector"
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_class WHERE relname LIKE 'django_rag_chunk_hnsw%'")
        assert cursor.fetchone()[0] == 1


# --- searching ---------------------------------------------------------------------------------


def test_every_semantic_query_uses_the_halfvec_index(halfvec, settings, corpus):
    # A scoped search over more than EXACT_SEARCH_MAX_ROWS chunks goes through the index too
    # (iterative scans on pgvector 0.8, a widened candidate list before).
    settings.DJANGO_RAG = {**HALF, "SEARCH": {"EXACT_SEARCH_MAX_ROWS": 1}}
    maintenance.vector_index(apply=True)
    for run in (
        lambda: rag.search("w1 w2 w3", limit=5),
        lambda: rag.search("w1 w2 w3", mode="hybrid", limit=5),
        lambda: rag.search("w1 w2 w3", limit=5, collection="few"),
        lambda: rag.search("w1 w2 w3", mode="hybrid", limit=5, collection="few"),
    ):
        (plan,) = explain_searches(run)
        assert vi.HNSW_INDEX in plan and "halfvec(384)" in plan, plan
    # The ORDER BY must be the index's expression: the full-precision distance cannot use it.
    ranked = Chunk.objects.all()._ranked(Chunk.objects.values_list("embedding", flat=True)[0])
    for order, used in (("rank", True), ("distance", False)):
        sql, params = ranked.order_by(order).values_list("pk")[:5].query.sql_with_params()
        assert (vi.HNSW_INDEX in explain(sql, params)) is used


def test_halfvec_results_match_the_exact_top_results(halfvec, settings, corpus):
    rng, words = corpus
    settings.DJANGO_RAG = HALF
    maintenance.vector_index(apply=True)
    stored = dict(Chunk.objects.values_list("pk", "embedding"))
    pks = list(stored)
    matrix = np.asarray([stored[pk] for pk in pks], dtype=np.float64)
    matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)
    from django_rag.embeddings import get_embedder

    for _ in range(10):
        query = " ".join(rng.choices(words, k=8))
        vector = np.asarray(get_embedder().embed_query(query), dtype=np.float64)
        exact = np.sort(matrix @ (vector / np.linalg.norm(vector)))[::-1][:10]
        hits = rag.search(query, limit=10)
        scores = [hit.score for hit in hits]
        # Scores are full-precision cosine similarities, best first...
        assert scores == sorted(scores, reverse=True) and len(hits) == 10
        for hit in hits:
            row = matrix[pks.index(hit.chunk_id)]
            assert hit.score == pytest.approx(
                float(row @ vector / np.linalg.norm(vector)), abs=1e-6
            )
        # ...of the exact top 10 (a near tie may swap within half precision's error).
        assert np.allclose(scores, exact, atol=2e-3), (scores, exact)


# --- 3,072 dimensions ------------------------------------------------------------------------


def test_a_3072_dimension_model_is_stored_and_searched_with_halfvec(halfvec, settings):
    """A fresh install with a 3,072-dimension model: the column and the index as migrate's
    schema editor creates them (0001's AddIndex), then ingest and search end to end."""
    with connection.cursor() as cursor:
        cursor.execute(f"DROP INDEX {vi.HNSW_INDEX}")
        cursor.execute("ALTER TABLE django_rag_chunk ALTER COLUMN embedding TYPE vector(3072)")
    (model_index,) = [i for i in Chunk._meta.indexes if i.name == vi.HNSW_INDEX]
    settings.DJANGO_RAG = {**HALF_3072, "VECTOR_INDEX_TYPE": "vector"}
    with pytest.raises(ConfigurationError, match="VECTOR_INDEX_TYPE = 'halfvec'"):
        with connection.schema_editor() as editor:
            editor.add_index(Chunk, model_index)
    settings.DJANGO_RAG = HALF_3072
    with connection.schema_editor() as editor:
        editor.add_index(Chunk, model_index)
    assert index().describe() == "halfvec(3072)"
    assert check_database(databases=["default"]) == [] and check_settings() == []

    texts = [f"Report {i} about topic{i} and the shared budget review." for i in range(40)]
    rag.ingest_many([{"text": t, "source_id": str(i)} for i, t in enumerate(texts)])
    assert len(Chunk.objects.values_list("embedding", flat=True)[0]) == 3072
    hits = rag.search("topic17 budget", limit=3)
    assert hits[0].source_id == "17" and hits[0].score > hits[1].score
    assert rag.search("topic23", mode="hybrid", limit=1)[0].source_id == "23"
    (plan,) = explain_searches(lambda: rag.search("topic5", limit=3))
    assert vi.HNSW_INDEX in plan and "halfvec(3072)" in plan


def test_a_model_switch_to_3072_dimensions_builds_a_halfvec_shadow_index(halfvec, settings):
    for i in range(6):
        rag.ingest(f"Note {i} on subject{i}.", source_id=str(i))
    # With a vector index the switch is refused before anything is embedded.
    settings.DJANGO_RAG = {"EMBEDDER": "hashing", "NEXT_EMBEDDER": BIG}
    with pytest.raises(ConfigurationError, match="VECTOR_INDEX_TYPE = 'halfvec'"):
        maintenance.reembed()
    assert schema.shadow_dimensions() is None
    assert Job.objects.get(kind=Job.Kind.SWITCH).status == Job.Status.FAILED

    settings.DJANGO_RAG = {**HALF, "NEXT_EMBEDDER": BIG}
    maintenance.vector_index(apply=True)
    job = maintenance.reembed(batch_size=4)
    assert job.status == "completed" and job.done == 6
    assert index().describe() == "halfvec(3072)"
    assert set(Chunk.objects.values_list("embedding_model", flat=True)) == {"hashing-3072"}
    assert rag.search("subject4", limit=1)[0].source_id == "4"
    assert schema.index_state()["matches"]
    # The switch ran in this test's one transaction. Its updates are HOT where the table's
    # pages had room (free space earlier tests left), and an index built over HOT chains its
    # own transaction broke is unusable until that transaction ends (pg_index.indcheckxmin):
    # the plan says whether searches use it only when the build left none. Outside a test the
    # switch commits batch by batch, and the shadow index is built after. The plan of a search
    # on a halfvec(3072) index is checked by
    # test_a_3072_dimension_model_is_stored_and_searched_with_halfvec.
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indcheckxmin FROM pg_index WHERE indexrelid = %s::regclass", [vi.HNSW_INDEX]
        )
        (unusable_in_this_transaction,) = cursor.fetchone()
    if not unusable_in_this_transaction:
        (plan,) = explain_searches(lambda: rag.search("subject2", limit=2))
        assert vi.HNSW_INDEX in plan and "halfvec(3072)" in plan, plan


# --- pgvector 0.6: no halfvec ------------------------------------------------------------------


def test_halfvec_on_pgvector_06_is_a_typed_error_and_e013(settings, monkeypatch):
    """On pgvector 0.6 (the PostgreSQL 16 lane) for real; elsewhere the version is faked."""
    from django_rag import checks as rag_checks
    from django_rag.models import semantic_search

    rag.ingest("Some text about apples.", collection="c")
    if pgvector_version() >= (0, 7):
        postgresql, _, _ = rag_checks.server_versions(connection)
        old = (0, 6, 2)
        monkeypatch.setattr(
            rag_checks, "server_versions", lambda connection: (postgresql, old, old)
        )
        monkeypatch.setitem(semantic_search._pgvector_versions, "default", old)
        monkeypatch.setattr(vi, "extension_version", lambda connection: old)
    settings.DJANGO_RAG = HALF
    messages = check_database(databases=["default"])
    assert ids(messages) == ["django_rag.E013"]
    assert "0.6" in messages[0].msg and "0.7" in messages[0].msg
    assert "VECTOR_INDEX_TYPE back to 'vector'" in messages[0].hint
    for call in (
        lambda: rag.search("apples", limit=3),
        lambda: rag.search("apples", mode="hybrid", limit=3),
        lambda: maintenance.vector_index(apply=True),
    ):
        with pytest.raises(ConfigurationError, match="needs pgvector 0.7 or newer"):
            call()
    assert index().kind == "vector"
    settings.DJANGO_RAG = {"EMBEDDER": "hashing"}
    assert rag.search("apples", limit=1)[0].text == "Some text about apples."
    assert "django_rag.E013" not in ids(check_database(databases=["default"]))


@examples(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(
        st.floats(width=32, allow_nan=False, allow_infinity=False, allow_subnormal=False),
        min_size=1,
        max_size=64,
    )
)
def test_the_query_vector_text_reads_back_as_the_same_single_precision_values(values):
    """A search writes its query vector with nine significant digits (``vector_literal``):
    pgvector must read back every single-precision component exactly."""
    literal = vi.vector_literal(values)
    with connection.cursor() as cursor:
        cursor.execute("SELECT %s::vector::real[]", [literal])
        (stored,) = cursor.fetchone()
    assert (
        np.array(stored, dtype=np.float32).tobytes() == np.array(values, dtype=np.float32).tobytes()
    )
    assert vi.vector_literal(literal) == literal  # a text is taken as it is
