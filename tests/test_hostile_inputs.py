"""Hostile inputs x entry points (the API, ingest_many, search, the dashboard, the commands).

Every entry point validates through ``django_rag.validation`` and answers bad input with the
library's typed error, writing nothing; the dashboard answers 400 or 404 (never 500); a command
raises ``CommandError`` (never a traceback).
"""

import math
import os
import subprocess
import sys
from contextlib import contextmanager
from io import StringIO

import pytest
from django.contrib.auth.models import User
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import RequestFactory, override_settings

import django_rag as rag
from django_rag.exceptions import (
    ConfigurationError,
    DimensionMismatch,
    EmbeddingFailed,
    EmptyDocument,
    InvalidInput,
    InvalidOption,
    InvalidSearchMode,
    InvalidText,
    QueryTooLong,
    UnknownCollection,
)
from django_rag.models import Chunk, Collection, Document, Job, Run, TestCase
from django_rag.testing import HashingEmbedder, ScriptedLLM
from django_rag.validation import check_vectors
from tests.helpers import url

pytestmark = pytest.mark.django_db

NAN = float("nan")
INF = float("inf")
ZERO_WIDTH = "\u200b\u200c\u200d\ufeff"
TEXT = "Refunds take 14 days."


def deep(levels: int) -> dict:
    value: dict = {}
    for _ in range(levels):
        value = {"a": value}
    return value


def rows():
    return (
        Document.objects.count(),
        Chunk.objects.count(),
        Collection.objects.count(),
        Run.objects.count(),
        Job.objects.count(),
        TestCase.objects.count(),
    )


@contextmanager
def nothing_written():
    before = rows()
    yield
    assert rows() == before


@pytest.fixture
def docs():
    rag.ingest("Shipping is free over 50 euros.", collection="docs", source_id="shipping")
    return rag.ingest(TEXT, collection="docs", source_id="refunds", title="Refunds")


# --- rag.ingest and rag.ingest_many -------------------------------------------------------------

# (fields of the document over {"text": TEXT}, collection, error)
DOCUMENT_CASES = [
    pytest.param({"title": "Re\x00funds"}, None, InvalidOption, id="nul-title"),
    pytest.param({"source_id": "refunds\x00"}, None, InvalidOption, id="nul-source_id"),
    pytest.param({}, "docs\x00", InvalidOption, id="nul-collection"),
    pytest.param({"title": 42}, None, InvalidOption, id="int-title"),
    pytest.param({"title": b"Refunds"}, None, InvalidOption, id="bytes-title"),
    pytest.param({"title": "Re\ud800"}, None, InvalidOption, id="surrogate-title"),
    pytest.param({"source_id": ["a"]}, None, InvalidOption, id="list-source_id"),
    pytest.param({"source_id": 7}, None, InvalidOption, id="int-source_id"),
    pytest.param({"source_id": "s" * 513}, None, InvalidOption, id="long-source_id"),
    pytest.param({"source_id": "\udc80"}, None, InvalidOption, id="surrogate-source_id"),
    pytest.param({}, "\u200b\ufeff", InvalidOption, id="invisible-collection"),
    pytest.param({}, "c\udc80", InvalidOption, id="surrogate-collection"),
    pytest.param({}, 5, InvalidOption, id="int-collection"),
    pytest.param({"metadata": {"score": NAN}}, None, InvalidOption, id="nan-metadata"),
    pytest.param({"metadata": {"scores": [1, INF]}}, None, InvalidOption, id="inf-metadata"),
    pytest.param({"metadata": {"x": -INF}}, None, InvalidOption, id="minus-inf-metadata"),
    pytest.param({"metadata": deep(5000)}, None, InvalidOption, id="5000-deep-metadata"),
    pytest.param({"metadata": deep(101)}, None, InvalidOption, id="101-deep-metadata"),
    pytest.param({"metadata": {"a\x00": 1}}, None, InvalidOption, id="nul-metadata-key"),
    pytest.param({"metadata": {"a": "b\x00"}}, None, InvalidOption, id="nul-metadata-value"),
    pytest.param({"metadata": {"a": "\udc80"}}, None, InvalidOption, id="surrogate-metadata"),
    pytest.param({"metadata": ["a"]}, None, InvalidOption, id="list-metadata"),
    pytest.param({"text": ZERO_WIDTH}, None, EmptyDocument, id="zero-width-text"),
    pytest.param({"text": " \u200b\n\ufeff\u2060\t"}, None, EmptyDocument, id="invisible-text"),
    pytest.param({"text": "\x00\x00"}, None, EmptyDocument, id="nul-only-text"),
    pytest.param({"text": ""}, None, EmptyDocument, id="empty-text"),
    pytest.param({"text": 42}, None, InvalidText, id="int-text"),
    pytest.param({"text": "caf\udce9"}, None, InvalidText, id="surrogate-text"),
]


@pytest.mark.parametrize("fields, collection, error", DOCUMENT_CASES)
def test_ingest_refuses_with_a_typed_error_and_writes_nothing(docs, fields, collection, error):
    fields = {"text": TEXT + " Hostile.", **fields}
    text = fields.pop("text")
    with nothing_written(), pytest.raises(error):
        rag.ingest(text, collection=collection or "docs", **fields)


@pytest.mark.parametrize("fields, collection, error", DOCUMENT_CASES)
def test_ingest_many_refuses_with_a_typed_error_and_writes_nothing(docs, fields, collection, error):
    items = ["A first, valid document.", {"text": TEXT + " Hostile.", **fields}]
    with nothing_written(), pytest.raises(error) as info:
        rag.ingest_many(items, collection=collection or "docs", on_error="raise")
    if collection is None:
        assert "in documents[1]" in info.value.__notes__


@pytest.mark.parametrize("fields, collection, error", DOCUMENT_CASES)
def test_ingest_many_skips_a_hostile_document_and_stores_the_others(
    docs, fields, collection, error
):
    items = ["A first, valid document.", {"text": TEXT + " Hostile.", **fields}]
    if collection is not None:  # wrong for every document: the call fails, nothing stored
        with nothing_written(), pytest.raises(error):
            rag.ingest_many(items, collection=collection)
        return
    first, second = rag.ingest_many(items, collection="docs")
    assert isinstance(second, error) and "in documents[1]" in second.__notes__
    assert first.pk and first.content == "A first, valid document."


def test_metadata_within_the_limits_is_stored(docs):
    doc = rag.ingest(TEXT + " Nested.", collection="docs", metadata={"deep": deep(90), "n": 1.5})
    doc.refresh_from_db()
    assert doc.metadata["n"] == 1.5 and "deep" in doc.metadata


def test_visible_text_with_zero_width_characters_is_ingested(docs):
    doc = rag.ingest("\u200bRefunds\u200d policy\ufeff", collection="docs")
    assert doc.chunk_count == 1


@pytest.mark.parametrize("group_size", [0, -1, "3", True, 2.5])
def test_ingest_many_refuses_a_bad_group_size(docs, group_size):
    with nothing_written(), pytest.raises(InvalidOption, match="group_size"):
        rag.ingest_many(["One.", "Two."], collection="docs", group_size=group_size)


@pytest.mark.parametrize("filename", ["notes\x00.txt", "\udc80.txt"])
def test_ingest_bytes_refuses_a_hostile_filename(docs, filename):
    with nothing_written(), pytest.raises(InvalidOption, match="filename"):
        rag.ingest_bytes(b"Refunds take 14 days.", filename=filename, collection="docs")


# --- vectors from the embedder ------------------------------------------------------------------


def test_check_vectors():
    check_vectors([[0.1, 0.2], [0.3, -0.4]], dimensions=2, what="chunk")
    check_vectors([[0.1, 0.2, 0.3]], dimensions=None, what="chunk")
    with pytest.raises(DimensionMismatch, match="3-dimensional"):
        check_vectors([[0.1, 0.2], [0.1, 0.2, 0.3]], dimensions=2, what="chunk")
    with pytest.raises(DimensionMismatch):
        check_vectors([[0.1, 0.2], [0.1, 0.2, 0.3]], dimensions=None, what="chunk")
    for bad in ([0.0, 0.0], [NAN, 1.0], [1.0, INF], [1e39, 1.0], ["a", 1.0], [[1.0], [2.0]]):
        with pytest.raises(EmbeddingFailed) as info:
            check_vectors([[1.0, 0.0], bad], dimensions=2, what="chunk")
        assert info.value.chunk_index == 1 and "chunk 1" in str(info.value)


def constant(vector):
    return lambda texts: [list(vector) for _ in texts]


@pytest.mark.parametrize("mode", ["semantic", "hybrid"])
@pytest.mark.parametrize(
    "embedder, error",
    [
        pytest.param(HashingEmbedder(dimensions=8), DimensionMismatch, id="8-dimensions"),
        pytest.param(constant([0.0] * 384), EmbeddingFailed, id="zero-vector"),
        pytest.param(constant([NAN] + [0.1] * 383), EmbeddingFailed, id="nan-vector"),
        pytest.param(constant([INF] + [0.1] * 383), EmbeddingFailed, id="inf-vector"),
    ],
)
def test_search_refuses_a_bad_query_vector_before_the_sql(docs, mode, embedder, error):
    with pytest.raises(error):
        rag.search("refunds", mode=mode, embedder=embedder)
    # Full-text mode does not embed the query: it still works.
    assert rag.search("refunds", mode="fulltext", embedder=embedder)


# --- rag.search -----------------------------------------------------------------------------------

SEARCH_CASES = [
    pytest.param({"mode": "hybrid", "candidates": 10**20}, InvalidOption, id="huge-candidates"),
    pytest.param({"mode": "hybrid", "candidates": 101}, InvalidOption, id="101-candidates"),
    pytest.param({"candidates": 0}, InvalidOption, id="zero-candidates"),
    pytest.param({"candidates": True}, InvalidOption, id="bool-candidates"),
    pytest.param({"threshold": NAN}, InvalidOption, id="nan-threshold"),
    pytest.param({"threshold": INF}, InvalidOption, id="inf-threshold"),
    pytest.param({"threshold": "0.5"}, InvalidOption, id="str-threshold"),
    pytest.param({"threshold": True}, InvalidOption, id="bool-threshold"),
    pytest.param({"mode": "hybrid", "semantic_weight": NAN}, InvalidOption, id="nan-sw"),
    pytest.param({"mode": "hybrid", "semantic_weight": INF}, InvalidOption, id="inf-sw"),
    pytest.param({"mode": "hybrid", "fulltext_weight": NAN}, InvalidOption, id="nan-fw"),
    pytest.param({"mode": "hybrid", "fulltext_weight": -INF}, InvalidOption, id="-inf-fw"),
    pytest.param({"mode": "hybrid", "fulltext_weight": 10**400}, InvalidOption, id="huge-fw"),
    pytest.param({"mode": "hybrid", "fusion": "rrf", "rrf_k": NAN}, InvalidOption, id="nan-k"),
    pytest.param({"mode": "hybrid", "fusion": "rrf", "rrf_k": INF}, InvalidOption, id="inf-k"),
    pytest.param({"mode": "hybrid", "fusion": "rrf", "rrf_k": -1}, InvalidOption, id="neg-k"),
    pytest.param({"mode": "hybrid", "fusion": "rrf", "rrf_k": True}, InvalidOption, id="bool-k"),
    pytest.param({"source_id": ["refunds"]}, InvalidOption, id="list-source_id"),
    pytest.param({"source_id": "refunds\x00"}, InvalidOption, id="nul-source_id"),
    pytest.param({"collection": "docs\x00"}, InvalidOption, id="nul-collection"),
    pytest.param({"collection": ["docs", "\udc80"]}, InvalidOption, id="surrogate-collection"),
    pytest.param({"collection": 5}, InvalidOption, id="int-collection"),
    pytest.param({"collection": {"docs": 1}}, InvalidOption, id="dict-collection"),
    pytest.param({"collection": [None]}, InvalidOption, id="none-in-collections"),
    pytest.param({"metadata": {"x": NAN}}, InvalidOption, id="nan-metadata"),
    pytest.param({"metadata": deep(5000)}, InvalidOption, id="deep-metadata"),
    pytest.param({"metadata": {"a": "\x00"}}, InvalidOption, id="nul-metadata"),
    pytest.param({"mode": ["semantic"]}, InvalidSearchMode, id="list-mode"),
    pytest.param({"limit": True}, InvalidOption, id="bool-limit"),
    pytest.param({"limit": 10**20}, InvalidOption, id="huge-limit"),
]


@pytest.mark.parametrize("options, error", SEARCH_CASES)
def test_search_refuses_bad_options(docs, options, error):
    with pytest.raises(error):
        rag.search("refunds", **options)


@pytest.mark.parametrize("mode", ["semantic", "fulltext", "hybrid"])
@pytest.mark.parametrize(
    "query, error",
    [
        pytest.param("\ud800 refunds", InvalidText, id="lone-high-surrogate"),
        pytest.param("refunds \udfff", InvalidText, id="lone-low-surrogate"),
        pytest.param("x" * 10_001, QueryTooLong, id="10001-chars"),
        pytest.param("refunds days " * 10_000, QueryTooLong, id="130k-chars"),
        pytest.param(b"refunds", InvalidOption, id="bytes"),
        pytest.param(None, InvalidOption, id="none"),
    ],
)
def test_search_refuses_bad_queries(docs, mode, query, error):
    with pytest.raises(error):
        rag.search(query, mode=mode)


@pytest.mark.parametrize("mode", ["semantic", "fulltext", "hybrid"])
def test_queries_that_are_blank_or_carry_nul_are_answered(docs, mode):
    assert rag.search(ZERO_WIDTH, mode=mode) == []
    assert rag.search(" \u200b\n", mode=mode) == []
    assert rag.search("refunds\x00", mode=mode, collection="docs")[0].source_id == "refunds"
    assert rag.search("r" * 10_000, mode=mode) is not None  # at the limit: accepted


def test_max_query_chars_is_a_setting(docs):
    with override_settings(DJANGO_RAG={"EMBEDDER": "hashing", "MAX_QUERY_CHARS": 20}):
        assert rag.search("refunds" + " " * 13, mode="fulltext")
        with pytest.raises(QueryTooLong, match="MAX_QUERY_CHARS") as info:
            rag.search("refunds" + " " * 14, mode="fulltext")
        assert info.value.code == "query_too_long" and info.value.details["limit"] == 20


def test_ask_validates_the_question_before_calling_the_llm(docs):
    llm = ScriptedLLM(default="Never called.")
    for question, error in [("x" * 10_001, QueryTooLong), ("why\ud800", InvalidText)]:
        with pytest.raises(error):
            rag.ask(question, llm=llm)
    assert llm.calls == []


# --- the dashboard --------------------------------------------------------------------------------

HOSTILE = ["abc", "a\x00b", "\x00", str(10**30), "-5", "0", "nan", "1e309", "x" * 20_000]

GET_PARAMS = {
    "documents": ["collection", "status", "source", "page"],
    "collections": ["page"],
    "search": ["q", "mode", "limit", "collection", "semantic_weight", "fulltext_weight"],
    "ask": ["question"],
    "graph": ["tab", "q", "collection", "type", "entity", "page"],
    "maintenance": ["collection"],
    "evaluation": ["collection", "case"],
    "evaluation_jobs": ["collection"],
    "info": ["collection"],
}

POST_FORMS = {
    "ingest_text": {"collection": "docs", "title": "t", "source_id": "s", "text": "Hi there."},
    "save_collection": {"name": "docs", "description": "d"},
    "maintenance": {"action": "reembed", "collection": "docs"},
    "evaluation": {"action": "run", "collection": "docs", "mode": "hybrid"},
    "ask": {"question": "refunds?", "collection": "docs", "mode": "hybrid", "limit": "5"},
    "ask_stream": {"question": "refunds?", "collection": "docs", "mode": "hybrid", "limit": "5"},
}


def test_every_get_view_with_hostile_parameters_answers_without_a_500(staff, docs):
    bad = []
    for view, names in GET_PARAMS.items():
        for name in names:
            for value in HOSTILE:
                status = staff.get(url(view), {name: value}).status_code
                if status not in (200, 400, 404):
                    bad.append((view, name, value[:20], status))
    assert bad == []


def test_every_post_with_hostile_parameters_answers_without_a_500(staff, docs):
    bad = []
    for view, form in POST_FORMS.items():
        for name in [*form, "action", "case", "sample_size", "steps", "format", "resume"]:
            for value in HOSTILE:
                with nothing_written_unless(view):
                    status = staff.post(url(view), {**form, name: value}).status_code
                if status not in (200, 302, 400, 404):
                    bad.append((view, name, value[:20], status))
    assert bad == []


@contextmanager
def nothing_written_unless(view):
    # Ingest and collection forms may write with valid values; the others never write documents.
    before = (Document.objects.count(), Chunk.objects.count())
    yield
    if view not in ("ingest_text", "save_collection"):
        assert (Document.objects.count(), Chunk.objects.count()) == before


@pytest.mark.parametrize("pk", ["0", str(2**63), str(10**30), "9" * 5000])
@pytest.mark.parametrize("view", ["document", "delete_document", "delete_collection"])
def test_ids_in_the_path_that_cannot_exist_are_404(staff, docs, view, pk):
    send = staff.get if view == "document" else staff.post
    with nothing_written():
        assert send(url(view, 12345).replace("12345", pk)).status_code == 404


@pytest.mark.parametrize("value", ["abc", "1.5", str(10**30), "-3", "\x00"])
def test_graph_entity_and_evaluation_case_ids_are_404(staff, docs, value):
    assert staff.get(url("graph"), {"entity": value}).status_code == 404
    with nothing_written():
        response = staff.post(url("evaluation"), {"action": "delete_case", "case": value})
    assert response.status_code == 404


@pytest.mark.parametrize(
    "view, name",
    [
        ("documents", "collection"),
        ("documents", "status"),
        ("documents", "source"),
        ("graph", "collection"),
        ("graph", "q"),
        ("graph", "type"),
    ],
)
def test_list_filters_with_nul_are_400(staff, docs, view, name):
    response = staff.get(url(view), {name: "a\x00b"})
    assert response.status_code == 400
    assert response["Content-Type"].startswith("text/plain")
    assert "NUL" in response.content.decode()


@pytest.mark.parametrize("view", ["maintenance", "evaluation"])
def test_job_forms_with_nul_in_the_collection_are_400_and_start_nothing(staff, docs, view):
    action = "reembed" if view == "maintenance" else "run"
    with nothing_written():
        response = staff.post(url(view), {"action": action, "collection": "docs\x00"})
    assert response.status_code == 400


def test_an_unknown_evaluation_mode_is_400(staff, docs):
    with nothing_written():
        response = staff.post(url("evaluation"), {"action": "run", "mode": "psychic"})
    assert response.status_code == 400 and "Unknown search mode" in response.content.decode()


def test_search_and_ask_forms_bound_the_query(staff, docs):
    response = staff.get(url("search"), {"q": "refunds " * 2_000})
    assert response.status_code == 200
    assert "at most 10000 characters" in response.content.decode()
    response = staff.post(url("ask"), {**POST_FORMS["ask"], "question": "why " * 3_000})
    assert response.status_code == 200
    assert "at most 10000 characters" in response.content.decode()
    response = staff.post(url("ask_stream"), {**POST_FORMS["ask"], "question": "why " * 3_000})
    assert response.status_code == 400
    with override_settings(DJANGO_RAG={"EMBEDDER": "hashing", "MAX_QUERY_CHARS": 5}):
        assert 'maxlength="5"' in staff.get(url("search")).content.decode()


def test_the_longest_accepted_query_stays_within_the_search_budget(staff, docs):
    """The costliest accepted query, 10,000 characters of distinct corpus words, from the
    dashboard's Search page in every mode (compare): answered, and every statement that scores
    chunks holds at most SEARCH["MAX_QUERY_TERMS"] (32) of its words, where it used to score
    each candidate against all of them (tests/test_search_budget.py has the rest)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    vocabulary = [f"qz{i:04d}x" for i in range(1400)]
    rag.ingest(" ".join(vocabulary), collection="docs", source_id="vocabulary")
    query = " ".join(vocabulary)[:10_000]
    with CaptureQueriesContext(connection) as captured:
        response = staff.get(url("search"), {"q": query, "compare": "on"})
    assert response.status_code == 200
    scoring = [
        q["sql"] for q in captured if "fulltext_score" in q["sql"] or "to_bm25query" in q["sql"]
    ]
    assert scoring and all(sum(word in sql for word in vocabulary) <= 32 for sql in scoring)


@pytest.mark.parametrize("filename", ["notes\x00.txt", "x" * 300 + ".txt", "\u200b.txt"])
def test_upload_with_a_hostile_filename_is_never_a_500(staff, docs, filename):
    # Django's upload parser drops non-printable characters and shortens long names.
    upload = SimpleUploadedFile(filename, b"Refunds take 14 days.", content_type="text/plain")
    response = staff.post(url("upload"), {"collection": "docs", "file": upload})
    assert response.status_code == 302
    names = Document.objects.values_list("original_filename", flat=True)
    assert not any("\x00" in name for name in names)


def test_a_library_error_escaping_a_view_is_a_400_with_its_message():
    from django_rag.dashboard.access import dashboard_view

    @dashboard_view
    def view(request):
        raise InvalidOption("limit must be an integer from 1 to 1000, got <b>0</b>")

    @dashboard_view
    def misconfigured(request):
        raise ConfigurationError("LLM", {"api_key": "sk-secret"}, "unknown backend")

    request = RequestFactory().get("/")
    request.user = User.objects.create_user("s", password="pw", is_staff=True)
    response = view(request)
    assert response.status_code == 400 and response["Content-Type"].startswith("text/plain")
    assert "limit must be an integer" in response.content.decode()
    response = misconfigured(request)
    assert response.status_code == 400 and "sk-secret" not in response.content.decode()
    assert "'LLM'" in response.content.decode()


# --- management commands --------------------------------------------------------------------------


def command(*args):
    call_command(*args, stdout=StringIO(), stderr=StringIO())


COMMAND_CASES = [
    ("rag_eval", "list", "--limit", "-1"),
    ("rag_eval", "list", "--limit", "0"),
    ("rag_eval", "list", "--limit", "ten"),
    ("rag_eval", "run", "--limit", "0"),
    ("rag_eval", "run", "--limit", "1001"),
    ("rag_eval", "run", "--mode", "psychic"),
    ("rag_eval", "run", "--fail-under", "mrr=nan"),
    ("rag_eval", "run", "--fail-under", "mrr=inf"),
    ("rag_eval", "generate", "--sample-size", "0"),
    ("rag_eval", "generate", "--sample-size", "-2"),
    ("rag_eval", "show", "-1"),
    ("rag_eval", "show", str(10**30)),
    ("rag_eval", "compare", "1", str(10**30)),
    ("rag_graph", "detect-communities", "--resolution", "nan"),
    ("rag_graph", "detect-communities", "--resolution", "inf"),
    ("rag_graph", "detect-communities", "--resolution", "0"),
    ("rag_graph", "detect-communities", "--resolution", "-1"),
    ("rag_graph", "detect-communities", "--min-size", "-5"),
    ("rag_graph", "detect-communities", "--min-size", "0"),
    ("rag_graph", "detect-communities", "--levels", "0"),
    ("rag_graph", "detect-communities", "--collection", "nope"),
    ("rag_graph", "rebuild", "--concurrency", "0"),
    ("rag_graph", "summarize-communities", "--concurrency", "-1"),
    ("rag_graph", "summarize-communities", "--levels", "-1"),
    ("rag_reembed", "--concurrency", "0"),
    ("rag_reembed", "--concurrency", "-3"),
    ("rag_reembed", "--batch-size", "0"),
    ("rag_search", "refunds", "--limit", "0"),
    ("rag_search", "refunds", "--limit", "1001"),
    ("rag_search", "refunds", "--threshold", "nan"),
    ("rag_search", "refunds", "--collection", "nope"),
    ("rag_search", "x" * 10_001),
    ("rag_maintenance", "nothing"),
]


@pytest.mark.parametrize("args", COMMAND_CASES, ids=lambda args: " ".join(args)[:60])
def test_commands_refuse_bad_arguments_with_a_command_error(docs, args):
    with nothing_written(), pytest.raises(CommandError):
        command(*args)


def test_rag_ask_refuses_a_question_over_max_query_chars(docs):
    llm = ScriptedLLM(default="Never called.")
    with override_settings(DJANGO_RAG={"EMBEDDER": "hashing", "LLM": llm}):
        with pytest.raises(CommandError, match="MAX_QUERY_CHARS"):
            command("rag_ask", "x" * 10_001)
        with pytest.raises(CommandError, match="MAX_QUERY_CHARS"):
            command("rag_search", "x" * 10_001)
    assert llm.calls == []


def test_rag_eval_run_names_an_unknown_collection(docs):
    with nothing_written(), pytest.raises(CommandError, match="No collection named 'nope'"):
        command("rag_eval", "run", "--collection", "nope")
    with nothing_written(), pytest.raises(CommandError, match="No collection named 'nope'"):
        with override_settings(DJANGO_RAG={"EMBEDDER": "hashing", "LLM": ScriptedLLM()}):
            command("rag_eval", "generate", "--collection", "nope")


def test_a_bad_argument_on_the_real_command_line_prints_no_traceback():
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONPATH": os.getcwd()}
    for args in (["rag_eval", "list", "--limit", "-1"], ["rag_reembed", "--concurrency", "-3"]):
        proc = subprocess.run(
            [sys.executable, "-m", "django", *args], capture_output=True, text=True, env=env
        )
        assert proc.returncode != 0
        assert "Traceback" not in proc.stderr and "integer >= 1" in proc.stderr


# --- the service functions behind the commands (one layer) ---------------------------------------


def test_run_evaluation_refuses_an_unknown_collection_and_bad_limits(docs):
    from django_rag.evaluation import NoTestCases, run_evaluation

    with nothing_written(), pytest.raises(UnknownCollection) as info:
        run_evaluation(collection=["docs", "nope"])
    assert isinstance(info.value, NoTestCases)  # what an unknown collection raised before
    for limit in (0, -1, True, "5", 1001):
        with nothing_written(), pytest.raises(InvalidOption):
            run_evaluation(collection="docs", limit=limit)


def test_test_cases_validate_their_collection_and_question(docs):
    from django_rag.evaluation import create_test_case, generate_test_cases

    chunk = Chunk.objects.first()
    with nothing_written(), pytest.raises(UnknownCollection):
        create_test_case("refunds?", chunks=[chunk], collection="nope")
    with nothing_written(), pytest.raises(InvalidOption):
        create_test_case("refunds?", chunks=[chunk], collection="docs\x00")
    with nothing_written(), pytest.raises(InvalidText):
        create_test_case("refunds\ud800?", chunks=[chunk])
    with nothing_written(), pytest.raises(InvalidInput):
        create_test_case(ZERO_WIDTH, chunks=[chunk])
    llm = ScriptedLLM()
    with nothing_written():  # as in Arcana: no such collection, no chunks, nothing generated
        assert generate_test_cases(3, collection="nope", llm=llm).created == []
    assert llm.calls == []
    with nothing_written(), pytest.raises(InvalidOption):
        generate_test_cases(3, collection="docs\x00", llm=llm)
    with nothing_written(), pytest.raises(InvalidInput):
        generate_test_cases(True, llm=ScriptedLLM())


@pytest.mark.parametrize(
    "options",
    [
        {"resolution": NAN},
        {"resolution": INF},
        {"resolution": 0},
        {"resolution": True},
        {"min_size": -5},
        {"min_size": 0},
        {"levels": 0},
        {"levels": 1.5},
        {"max_cluster_size": 0},
        {"seed": "1"},
    ],
    ids=str,
)
def test_detect_communities_refuses_bad_options(docs, options):
    from django_rag.graph.communities import detect_communities

    with pytest.raises(InvalidOption):
        detect_communities(**options)


@pytest.mark.parametrize("options", [{"concurrency": 0}, {"concurrency": -3}, {"concurrency": "2"}])
def test_reembed_refuses_bad_concurrency(docs, options):
    from django_rag.maintenance import reembed

    with nothing_written(), pytest.raises(InvalidInput, match="concurrency"):
        reembed(**options)


def test_numbers_at_the_edges_are_accepted(docs):
    assert rag.search("refunds", mode="hybrid", fusion="rrf", rrf_k=0, candidates=100)
    assert rag.search("refunds", mode="hybrid", semantic_weight=0, fulltext_weight=1e6)
    assert rag.search("refunds", threshold=-1e300) and not rag.search("refunds", threshold=2)
    assert math.isfinite(rag.search("refunds", mode="hybrid", fusion="rrf", rrf_k=10**30)[0].score)
