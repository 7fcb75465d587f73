"""Reading and deleting evaluation test cases and runs from Python (docs/evaluation.md,
"Test cases and runs in Python"), the settings a run records, and the Arcana behaviours of
generation and manual cases: an unknown collection generates nothing, and a case is refused
when none of its relevant items lies in the collection it is filed under."""

import pytest

import django_rag as rag
from django_rag.evaluation import (
    count_test_cases,
    create_test_case,
    delete_run,
    delete_test_case,
    generate_test_cases,
    get_run,
    get_test_case,
    list_runs,
    list_test_cases,
    run_evaluation,
)
from django_rag.exceptions import InvalidInput, RunNotFound, TestCaseNotFound
from django_rag.models import Chunk, Relevance, Run, TestCase
from django_rag.testing import ScriptedLLM


@pytest.fixture
def corpus(db):
    return {
        "leave": rag.ingest("Employees get 25 days of paid leave.", collection="hr", source_id="l"),
        "remote": rag.ingest("Staff may work remotely three days.", collection="hr", source_id="r"),
        "drill": rag.ingest("The X200 drill has a 1200 watt motor.", collection="tools"),
    }


def chunk_of(document):
    return Chunk.objects.get(document=document)


def test_list_test_cases_newest_first_scoped_and_paged(corpus):
    first = create_test_case("leave days?", chunks=[chunk_of(corpus["leave"])])
    second = create_test_case("remote days?", chunks=[chunk_of(corpus["remote"])])
    drill = create_test_case("drill watts?", chunks=[chunk_of(corpus["drill"])])
    assert [c.pk for c in list_test_cases()] == [drill.pk, second.pk, first.pk]
    assert [c.pk for c in list_test_cases(collection="hr")] == [second.pk, first.pk]
    assert [c.pk for c in list_test_cases(collection=["tools", "nope"])] == [drill.pk]
    assert list_test_cases(collection="nope") == []
    assert [c.pk for c in list_test_cases(limit=1, offset=1)] == [second.pk]
    assert [c.pk for c in list_test_cases(source_id="l")] == [first.pk]
    assert count_test_cases(collection="hr") == 2 and count_test_cases() == 3
    listed = list_test_cases(collection="tools")[0]
    assert [r.chunk_id for r in listed.relevance.all()] == [chunk_of(corpus["drill"]).pk]


def test_get_test_case_by_id_in_scope(corpus):
    case = create_test_case("leave days?", chunks=[chunk_of(corpus["leave"])])
    assert get_test_case(case.pk).question == "leave days?"
    assert get_test_case(str(case.pk), collection="hr").pk == case.pk
    for bad in (case.pk + 1000, "abc", None, -1, True):
        with pytest.raises(TestCaseNotFound):
            get_test_case(bad)
    with pytest.raises(TestCaseNotFound):
        get_test_case(case.pk, collection="tools")  # out of scope looks like absent


def test_delete_test_case_never_deletes_outside_its_scope(corpus):
    case = create_test_case("leave days?", chunks=[chunk_of(corpus["leave"])])
    with pytest.raises(TestCaseNotFound):
        delete_test_case(case.pk, collection="tools")
    assert TestCase.objects.filter(pk=case.pk).exists()
    delete_test_case(case.pk, collection="hr")
    assert not TestCase.objects.filter(pk=case.pk).exists()
    assert not Relevance.objects.filter(test_case_id=case.pk).exists()
    with pytest.raises(TestCaseNotFound):
        delete_test_case(case.pk)


def runs_of(corpus):
    create_test_case("paid leave days", chunks=[chunk_of(corpus["leave"])])
    create_test_case("drill motor watt", chunks=[chunk_of(corpus["drill"])])
    hr = run_evaluation(mode="fulltext", collection="hr")
    both = run_evaluation(mode="fulltext", collection=["hr", "tools"])
    everything = run_evaluation(mode="fulltext")
    return hr, both, everything


def test_list_runs_newest_first_and_scoped_to_runs_inside_the_collections(corpus):
    hr, both, everything = runs_of(corpus)
    assert [r.pk for r in list_runs()] == [everything.pk, both.pk, hr.pk]
    assert [r.pk for r in list_runs(limit=1)] == [everything.pk]
    # Scoped: only runs scoped themselves, to allowed collections alone.
    assert [r.pk for r in list_runs(collection="hr")] == [hr.pk]
    assert [r.pk for r in list_runs(collection=["hr", "tools"])] == [both.pk, hr.pk]
    assert list_runs(collection="tools") == []


def test_get_and_delete_run_respect_the_scope(corpus):
    hr, both, everything = runs_of(corpus)
    assert get_run(hr.pk, collection="hr").pk == hr.pk
    with pytest.raises(RunNotFound):
        get_run(everything.pk, collection="hr")
    with pytest.raises(RunNotFound):
        get_run("x")
    with pytest.raises(RunNotFound):
        delete_run(both.pk, collection="hr")
    assert Run.objects.filter(pk=both.pk).exists()
    delete_run(both.pk)
    assert not Run.objects.filter(pk=both.pk).exists()
    with pytest.raises(RunNotFound):
        delete_run(both.pk)


def test_runs_record_the_vector_store_and_graph_settings_they_used(corpus, settings):
    create_test_case("paid leave days", chunks=[chunk_of(corpus["leave"])])
    run = run_evaluation(mode="fulltext", collection="hr")
    assert run.config["vector_store"] == "pgvector"
    assert run.config["graph"]["enabled"] is False
    assert run.config["graph"]["extractor"] == "llm"
    settings.DJANGO_RAG = {
        **settings.DJANGO_RAG,
        "GRAPH": {
            "ENABLED": True,
            "EXTRACTOR": {"BACKEND": "llm", "OPTIONS": {"api_key": "sk-secret-123"}},
        },
    }
    # graph=False for the search: the run records what it searched with, not the default.
    run = run_evaluation(mode="fulltext", collection="hr", graph=False)
    stored = Run.objects.get(pk=run.pk).config
    assert stored["graph"]["enabled"] is False
    assert stored["graph"]["extractor"]["BACKEND"] == "llm"
    assert "sk-secret-123" not in str(stored)


def test_generate_test_cases_on_an_unknown_collection_returns_no_cases(corpus):
    llm = ScriptedLLM(default='{"question": "q?"}')
    result = generate_test_cases(5, collection="nope", llm=llm)
    assert result.created == [] and result.skipped == 0
    assert llm.calls == [] and not TestCase.objects.exists()


def test_explicit_collection_that_none_of_the_chunks_belong_to_is_refused(corpus):
    with pytest.raises(InvalidInput, match="None of the relevant chunks"):
        create_test_case("drill?", chunks=[chunk_of(corpus["drill"])], collection="hr")
    with pytest.raises(InvalidInput, match="None of the relevant documents"):
        create_test_case("drill?", documents=[corpus["drill"]], collection="hr")
    assert not TestCase.objects.exists()
    # One of them in the collection is enough (the case spans collections on purpose).
    mixed = create_test_case(
        "days?", chunks=[chunk_of(corpus["leave"]), chunk_of(corpus["drill"])], collection="hr"
    )
    assert mixed.collection.name == "hr"


def test_a_scoped_caller_never_sees_a_case_linking_another_collections_chunk(corpus):
    mixed = create_test_case(
        "days?", chunks=[chunk_of(corpus["leave"]), chunk_of(corpus["drill"])], collection="hr"
    )
    own = create_test_case("leave?", chunks=[chunk_of(corpus["leave"])])
    assert [c.pk for c in list_test_cases(collection="hr")] == [own.pk]
    assert count_test_cases(collection="hr") == 1
    with pytest.raises(TestCaseNotFound):
        get_test_case(mixed.pk, collection="hr")
    with pytest.raises(TestCaseNotFound):
        delete_test_case(mixed.pk, collection="hr")
    assert TestCase.objects.filter(pk=mixed.pk).exists()
    # Allowed both collections, it is seen; unscoped, too.
    assert get_test_case(mixed.pk, collection=["hr", "tools"]).pk == mixed.pk
    assert {c.pk for c in list_test_cases()} == {mixed.pk, own.pk}
    # A document-level case counts its documents' collections the same way.
    by_doc = create_test_case("docs?", documents=[corpus["leave"], corpus["drill"]])
    assert by_doc.collection is None
    TestCase.objects.filter(pk=by_doc.pk).update(collection=corpus["leave"].collection)
    assert by_doc.pk not in {c.pk for c in list_test_cases(collection="hr")}
    assert by_doc.pk in {c.pk for c in list_test_cases(collection=["hr", "tools"])}
