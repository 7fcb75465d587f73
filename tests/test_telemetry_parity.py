"""Telemetry parity with Arcana (docs/telemetry.md): the ``chunk`` span, skipped chunks with
their reasons, the ingested document on the ``ingest`` span behind INCLUDE_TEXT, and an
evaluation run's start event with a run reference on each case's events."""

import pytest
from django.test import override_settings

import django_rag as rag
from django_rag.evaluation import create_test_case, run_evaluation
from django_rag.models import Chunk
from django_rag.signals import annotate, span

pytestmark = pytest.mark.django_db

PARAGRAPHS = "\n\n".join(
    f"Paragraph {n} says something plain about topic {n} and nothing else at all." for n in range(6)
)


def of(events, kind, name):
    return [m for k, n, m in events if (k, n) == (kind, name)]


def test_chunk_span_reports_the_chunker_and_chunk_count_inside_ingest(events):
    document = rag.ingest(PARAGRAPHS, collection="docs", chunk_size=24, chunk_overlap=0)
    (ingest,) = of(events, "start", "ingest")
    (start,) = of(events, "start", "chunk")
    (stop,) = of(events, "stop", "chunk")
    assert start["parent_id"] == ingest["span_id"]
    assert start["chars"] == len(PARAGRAPHS) and start["format"] == "text"
    assert start["chunker"]
    assert stop["chunk_count"] == document.chunks.count() > 1


def test_skipped_chunks_carry_their_reasons(events, failing_embedder):
    text = PARAGRAPHS.replace("topic 3", "topic POISON")
    document = rag.ingest(
        text,
        collection="docs",
        chunk_size=24,
        chunk_overlap=0,
        embedder=failing_embedder("POISON"),
        on_chunk_error="skip",
    )
    (stop,) = of(events, "stop", "ingest")
    assert document.skipped_chunks and len(stop["skipped_chunks"]) == len(document.skipped_chunks)
    for entry, index in zip(stop["skipped_chunks"], document.skipped_chunks, strict=True):
        assert entry == {"index": index, "reason": "RuntimeError: provider refused this input"}
    stored = Chunk.objects.filter(document=document).values_list("chunk_index", flat=True)
    assert not set(document.skipped_chunks) & set(stored)
    assert "provider refused this input" in document.error


def test_ingest_carries_the_document_only_with_include_text(events):
    document = rag.ingest("Refunds take 14 days.", collection="docs", title="Refunds")
    (stop,) = of(events, "stop", "ingest")
    assert "document" not in stop and stop["document_id"] == document.pk
    assert stop["skipped_chunks"] == []
    events.clear()
    with override_settings(DJANGO_RAG={"EMBEDDER": "hashing", "TELEMETRY": {"INCLUDE_TEXT": True}}):
        other = rag.ingest("Shipping is free.", collection="docs", title="Ship", source_id="s")
    (stop,) = of(events, "stop", "ingest")
    assert stop["document"] == {
        "id": other.pk,
        "collection": "docs",
        "source_id": "s",
        "title": "Ship",
        "content_type": "text/plain",
        "chars": len("Shipping is free."),
        "chunk_count": 1,
    }


def test_evaluation_run_starts_first_and_each_case_carries_the_run(events):
    for text in ("Refunds take 14 days.", "Shipping is free over 50 euros."):
        document = rag.ingest(text, collection="docs")
        create_test_case(text.split()[0], chunks=list(Chunk.objects.filter(document=document)))
    events.clear()
    run = run_evaluation(mode="fulltext", collection="docs", run_ref="nightly-42")
    order = [(k, n) for k, n, _ in events if n.startswith("evaluation.")]
    assert order[0] == ("start", "evaluation.run") and order[-1] == ("stop", "evaluation.run")
    (started,) = of(events, "start", "evaluation.run")
    assert started["run_id"] == run.pk and started["run_ref"] == "nightly-42"
    assert started["total"] == 2
    cases = of(events, "start", "evaluation.case")
    assert [c["index"] for c in cases] == [1, 2]
    for case in cases + of(events, "stop", "evaluation.case"):
        assert case["run_id"] == run.pk and case["run_ref"] == "nightly-42"
        assert case["total"] == 2 and case["parent_id"] == started["span_id"]
        assert "question" not in case  # user text: only with INCLUDE_TEXT
    assert run.config["run_ref"] == "nightly-42"
    events.clear()
    with override_settings(DJANGO_RAG={"EMBEDDER": "hashing", "TELEMETRY": {"INCLUDE_TEXT": True}}):
        run_evaluation(mode="fulltext", collection="docs")
    assert {c["question"] for c in of(events, "start", "evaluation.case")} == {
        "Refunds",
        "Shipping",
    }


def test_run_ref_is_bounded():
    from django_rag.exceptions import InvalidOption

    document = rag.ingest("Refunds take 14 days.", collection="docs")
    create_test_case("refunds", chunks=list(Chunk.objects.filter(document=document)))
    with pytest.raises(InvalidOption):
        run_evaluation(mode="fulltext", collection="docs", run_ref="x" * 201)


def test_annotate_reaches_the_innermost_open_span_of_its_event(events):
    annotate("outer", lost=True)  # no span open: nothing happens
    with span("outer"), span("inner"):
        annotate("outer", found=1)
        with span("outer"):
            annotate("outer", nested=2)
    stops = of(events, "stop", "outer")
    assert stops[0] == {**stops[0], "nested": 2} and "found" not in stops[0]
    assert stops[1]["found"] == 1 and "nested" not in stops[1] and "lost" not in stops[1]
    assert "found" not in of(events, "stop", "inner")[0]


def test_search_carries_its_results_only_with_include_text(events):
    rag.ingest("Refunds take 14 days.", collection="docs")
    found = rag.search("refunds", mode="fulltext", collection="docs")
    (stop,) = of(events, "stop", "search")
    assert "results" not in stop and stop["result_count"] == len(found) == 1
    events.clear()
    with override_settings(DJANGO_RAG={"EMBEDDER": "hashing", "TELEMETRY": {"INCLUDE_TEXT": True}}):
        rag.search("refunds", mode="fulltext", collection="docs")
    (stop,) = of(events, "stop", "search")
    assert stop["results"] == [
        {"chunk_id": found[0].chunk_id, "score": found[0].score, "text": "Refunds take 14 days."}
    ]
