"""Parity defects (issue 25): each reproduced against real PostgreSQL, then fixed at its root."""

import pytest

import django_rag as rag
from django_rag.exceptions import InvalidOption, InvalidParserOutput, UnknownCollection
from django_rag.ingestion.parsers import Page, ParsedDocument, Parser
from django_rag.testing import ScriptedLLM

pytestmark = pytest.mark.django_db


def test_ask_with_an_unknown_option_raises_invalid_option_naming_it():
    rag.ingest("Refunds are paid within 14 days.", collection="policies")
    llm = ScriptedLLM("unused")
    with pytest.raises(InvalidOption) as caught:
        rag.ask("refunds?", llm=llm, chunk_cap=3)
    message = str(caught.value)
    assert "ask() got an unknown option 'chunk_cap'" in message
    assert "reranker" in message and "run_search" not in message
    with pytest.raises(InvalidOption, match="did you mean 'reranker'"):
        rag.ask("refunds?", llm=llm, rerankr=False)
    assert llm.calls == []  # refused before any LLM call


def _sentences(text, *, format="text"):
    return [part.strip() + "." for part in text.split(".") if part.strip()]


def _words(text, *, format="text", chunk_size=2):
    words = text.split()
    return [" ".join(words[i : i + chunk_size]) for i in range(0, len(words), chunk_size)]


def test_a_function_chunker_refuses_options_it_does_not_take_with_a_typed_error():
    from django_rag.models import Document

    with pytest.raises(InvalidOption) as caught:
        rag.ingest("One. Two.", collection="c", chunker=_sentences, chunk_size=50)
    assert caught.value.code == "invalid_option"
    assert "'_sentences' does not take 'chunk_size'" in str(caught.value)
    assert "add a keyword parameter" in str(caught.value)
    assert not Document.objects.exists()  # refused before anything was written


def test_a_function_chunker_that_declares_the_option_receives_it():
    doc = rag.ingest("a b c d e f", collection="c", chunker=_words, chunk_size=3)
    assert [chunk.text for chunk in doc.chunks.order_by("chunk_index")] == ["a b c", "d e f"]


class PagedParser(Parser):
    """Splits on form feeds into pages; ``SPANS`` overrides the page spans it reports."""

    SPANS = None

    def parse(self, data, *, filename):
        text = data.decode()
        pages, offset = [], 0
        for number, part in enumerate(text.split("\f"), start=1):
            pages.append(Page(number, offset, offset + len(part)))
            offset += len(part) + 1
        if self.SPANS is not None:
            pages = [Page(*span) for span in self.SPANS]
        return ParsedDocument(text=text, pages=pages)


PAGED = b"First page about refunds.\fSecond page about shipping."


@pytest.mark.parametrize(
    "spans, rule",
    [
        ([(1, 0, 25), (2, 26, 900)], "outside the text"),
        ([(2, 26, 53), (1, 0, 25)], "page numbers must increase"),
        ([(1, 0, 30), (2, 26, 53)], "not overlap"),
        ([(1, -5, 25)], "outside the text"),
        ([(0, 0, 25)], "start at 1"),
    ],
)
def test_a_custom_parsers_bad_pages_raise_a_typed_error_naming_it(settings, spans, rule):
    from django_rag.models import Document

    settings.DJANGO_RAG = {"EMBEDDER": "hashing", "PARSERS": {".paged": PagedParser}}
    PagedParser.SPANS = spans
    try:
        with pytest.raises(InvalidParserOutput) as caught:
            rag.ingest_bytes(PAGED, filename="a.paged", collection="c")
    finally:
        PagedParser.SPANS = None
    assert caught.value.code == "invalid_parser_output"
    assert "tests.test_parity.PagedParser" in str(caught.value) and rule in str(caught.value)
    assert "a.paged" in str(caught.value)
    assert not Document.objects.exists()


def test_a_custom_parser_with_valid_pages_stores_them(settings):
    settings.DJANGO_RAG = {"EMBEDDER": "hashing", "PARSERS": {".paged": PagedParser}}
    doc = rag.ingest_bytes(PAGED, filename="a.paged", collection="c", chunk_size=6, chunk_overlap=0)
    pages = [(c.page_start, c.page_end) for c in doc.chunks.order_by("chunk_index")]
    assert pages[0] == (1, 1) and pages[-1] == (2, 2)


def scope_alpha(user):
    return "alpha"


def scope_mixed(user):
    return ["alpha", 7]


def test_a_dashboard_scope_returning_one_string_means_that_collection(staff):
    from django.test import override_settings
    from django.urls import reverse

    rag.ingest("Alpha handbook on refunds.", collection="alpha", title="Alpha doc")
    rag.ingest("Letter a collection: salaries.", collection="a", title="Letter doc")
    scoped = {"EMBEDDER": "hashing", "DASHBOARD": {"COLLECTIONS": "tests.test_parity.scope_alpha"}}
    with override_settings(DJANGO_RAG=scoped):
        listing = staff.get(reverse("django_rag_dashboard:documents")).content.decode()
    assert "Alpha doc" in listing and "Letter doc" not in listing


def test_a_dashboard_scope_with_a_non_string_fails_closed_and_logs(staff, caplog):
    from django.test import override_settings
    from django.urls import reverse

    rag.ingest("Alpha handbook on refunds.", collection="alpha", title="Alpha doc")
    scoped = {"EMBEDDER": "hashing", "DASHBOARD": {"COLLECTIONS": "tests.test_parity.scope_mixed"}}
    with override_settings(DJANGO_RAG=scoped), caplog.at_level("ERROR"):
        listing = staff.get(reverse("django_rag_dashboard:documents")).content.decode()
    assert "Alpha doc" not in listing
    assert "COLLECTIONS" in caplog.text and "holding int values" in caplog.text


def _acme_extractor(text):
    entities = [
        {"name": "Acme Corp", "type": "organization", "description": "maker of drills"},
        {"name": "Berlin", "type": "location", "metadata": {"country": "DE", "wikidata": "Q64"}},
    ]
    return entities, [{"source": "Acme Corp", "target": "Berlin", "type": "LOCATED_IN"}]


def _graph_settings(embedder="hashing"):
    from django.test import override_settings

    return override_settings(
        DJANGO_RAG={
            "EMBEDDER": embedder,
            "GRAPH": {"ENABLED": True, "EXTRACTOR": _acme_extractor},
        }
    )


def _other_model():
    import numpy as np

    from django_rag.testing import HashingEmbedder

    class Reversed(HashingEmbedder):
        def _vector(self, text):
            return np.ascontiguousarray(super()._vector(text)[::-1])

    return Reversed(model_name="reversed-bow")  # same size (384), other vectors


def test_reembedding_in_place_with_another_model_refreshes_graph_entities():
    import numpy as np

    from django_rag import maintenance
    from django_rag.models import Entity

    with _graph_settings():
        rag.ingest("Acme Corp makes drills in Berlin.", collection="kb", graph=True)
    acme = Entity.objects.get(name="Acme Corp")
    assert acme.embedding_model == "hashing-bow"
    other = _other_model()
    with _graph_settings(other):
        job = maintenance.reembed()
        assert job.result["entities"] == 2
        acme.refresh_from_db()
        assert acme.embedding_model == "reversed-bow"
        expected = other.embed_documents(["Acme Corp: maker of drills"])[0]
        assert np.allclose(np.asarray(acme.embedding), expected, atol=1e-6)
        # Up to date now: nothing left, unless forced (per collection too).
        assert maintenance.embed_entities() == 0
        assert maintenance.embed_entities(collection="kb", force=True) == 2
        with pytest.raises(UnknownCollection):
            maintenance.embed_entities(collection="nope")


def test_entity_metadata_from_the_extractor_is_stored_and_merged():
    from django_rag.models import Entity

    with _graph_settings():
        rag.ingest("Acme Corp makes drills in Berlin.", collection="kb", graph=True)
    assert Entity.objects.get(name="Berlin").metadata == {"country": "DE", "wikidata": "Q64"}
    assert Entity.objects.get(name="Acme Corp").metadata == {}

    def later(text):
        return [
            {"name": "Berlin", "metadata": {"country": "XX", "population": 3_800_000}},
            {"name": "Acme Corp", "metadata": "not an object"},  # dropped, not fatal
        ], []

    from django.test import override_settings

    with override_settings(
        DJANGO_RAG={"EMBEDDER": "hashing", "GRAPH": {"ENABLED": True, "EXTRACTOR": later}}
    ):
        rag.ingest("Berlin again, and Acme Corp.", collection="kb", graph=True)
    # Keys already stored keep their value; new keys are added.
    assert Entity.objects.get(name="Berlin").metadata == {
        "country": "DE",
        "wikidata": "Q64",
        "population": 3_800_000,
    }
    assert Entity.objects.get(name="Acme Corp").metadata == {}


def test_ingest_with_graph_emits_the_graph_build_span(events):
    with _graph_settings():
        rag.ingest("Acme Corp makes drills in Berlin.", collection="kb", graph=True)
    starts = [meta for kind, event, meta in events if kind == "start" and event == "graph.build"]
    stops = [meta for kind, event, meta in events if kind == "stop" and event == "graph.build"]
    assert len(starts) == len(stops) == 1
    assert starts[0]["collection"] == "kb" and starts[0]["ingest"] is True
    assert stops[0]["chunks"] == 1 and stops[0]["entities"] == 2
    assert stops[0]["relationships"] == 1 and stops[0]["failed"] == 0


def test_the_graph_page_keeps_its_type_filter_across_pages_and_links(staff):
    import html
    import re
    from urllib.parse import parse_qs, urlsplit

    from django.urls import reverse

    from django_rag.models import Collection, Entity

    kb = Collection.objects.create(name="kb")
    Entity.objects.bulk_create(
        [
            Entity(collection=kb, name=f"P{i:03}", normalized_name=f"p{i:03}", type="person")
            for i in range(60)
        ]
        + [
            Entity(collection=kb, name=f"L{i:03}", normalized_name=f"l{i:03}", type="location")
            for i in range(60)
        ]
    )
    url = reverse("django_rag_dashboard:graph")
    first = staff.get(url, {"tab": "entities", "collection": "kb", "type": "person"})
    body = first.content.decode()
    assert "<option selected>person</option>" in body
    links = [html.unescape(h) for h in re.findall(r'href="(\?[^"]*)"', body)]
    following = next(h for h in links if "page=2" in h)
    assert parse_qs(urlsplit(following).query)["type"] == ["person"]
    entity_links = [h for h in links if "entity=" in h]
    assert entity_links and all(parse_qs(h[1:])["type"] == ["person"] for h in entity_links)
    second = staff.get(url + following).content.decode()
    assert "Page 2 of 2" in second
    assert re.search(r">P0\d\d<", second) and not re.search(r">L0\d\d<", second)


def scope_handbook(user):
    return ["handbook"]


def test_a_test_case_without_collection_takes_its_relevant_chunks_collection(staff):
    from django.test import override_settings
    from django.urls import reverse

    from django_rag.evaluation import create_test_case, run_evaluation
    from django_rag.exceptions import InvalidInput

    handbook = rag.ingest("Refunds take 14 days.", collection="handbook")
    other = rag.ingest("Salaries are paid monthly.", collection="hr")
    case = create_test_case("How long do refunds take?", chunks=list(handbook.chunks.all()))
    assert case.collection.name == "handbook"
    by_document = create_test_case("refund delay", documents=[handbook])
    assert by_document.collection.name == "handbook"
    mixed = create_test_case(
        "pay and refunds", chunks=[handbook.chunks.first(), other.chunks.first()]
    )
    assert mixed.collection is None  # spread over two collections: no single owner
    with pytest.raises(InvalidInput, match="No chunk with id 999999"):
        create_test_case("ghost", chunks=[999999])

    run = run_evaluation(mode="semantic", collection="handbook")
    assert run.test_case_count == 2  # both single-collection cases, not the mixed one
    scoped = {
        "EMBEDDER": "hashing",
        "DASHBOARD": {"COLLECTIONS": "tests.test_parity.scope_handbook"},
    }
    with override_settings(DJANGO_RAG=scoped):
        page = staff.get(reverse("django_rag_dashboard:evaluation")).content.decode()
    assert "How long do refunds take?" in page and "pay and refunds" not in page


def test_the_migration_gives_stored_cases_their_single_collection():
    import importlib

    from django.db import connection

    from django_rag.models import Relevance, TestCase

    backfill = importlib.import_module("django_rag.migrations.0014_test_case_collection").BACKFILL
    a = rag.ingest("Refunds take 14 days.", collection="handbook")
    b = rag.ingest("Salaries are paid monthly.", collection="hr")
    single = TestCase.objects.create(question="refunds")
    Relevance.objects.create(test_case=single, chunk=a.chunks.first())
    by_doc = TestCase.objects.create(question="refund doc", level="document")
    Relevance.objects.create(test_case=by_doc, document=a)
    mixed = TestCase.objects.create(question="both")
    Relevance.objects.create(test_case=mixed, chunk=a.chunks.first())
    Relevance.objects.create(test_case=mixed, chunk=b.chunks.first())
    with connection.cursor() as cursor:
        cursor.execute(backfill)
    names = {
        case.question: case.collection and case.collection.name
        for case in TestCase.objects.select_related("collection")
    }
    assert names == {"refunds": "handbook", "refund doc": "handbook", "both": None}
