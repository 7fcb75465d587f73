"""Telemetry: every event fires with its metadata, receivers cannot break operations, the
logging receiver, Prometheus on /metrics, OpenTelemetry spans."""

import logging

import pytest
from django.test import override_settings

import django_rag as rag
from django_rag.agent import Agent
from django_rag.exceptions import UnknownCollection
from django_rag.rerankers import LLMReranker
from django_rag.signals import operation_finished, operation_started
from django_rag.telemetry import attach, detach, format_event
from django_rag.telemetry.logging import DETAILS
from django_rag.testing import ScriptedLLM

pytestmark = pytest.mark.django_db

# event: (keys in the start metadata, keys added by the stop metadata)
EVENTS = {
    "ingest": (
        {"collection", "source_id", "chars"},
        {"document_id", "chunk_count", "skipped_chunks"},
    ),
    "chunk": ({"chunker", "format", "chars"}, {"chunk_count"}),
    "ingest_many": ({"collection"}, {"document_count", "chunk_count"}),
    "delete": ({"document_id"}, set()),
    "embed": ({"model", "count"}, {"dimensions"}),
    "vector_store.store": ({"backend", "collection", "chunk_count"}, set()),
    "search": ({"mode", "limit", "collections", "reranker"}, {"result_count", "reranked"}),
    "vector_store.search": ({"backend", "mode", "limit"}, {"result_count"}),
    "rerank": ({"reranker", "candidates"}, {"kept"}),
    "ask": ({"model", "stream"}, {"context_count", "citation_count", "prompt_tokens"}),
    "llm.complete": (
        {"model", "prompt_chars"},
        {"response_chars", "prompt_tokens", "completion_tokens", "cost"},
    ),
    "agent.gate": ({"gatekeeper"}, {"skip_retrieval"}),
    "agent.rewrite": ({"rewriter"}, set()),
    "agent.select": ({"available_collections", "selector"}, {"selected_count"}),
    "agent.expand": ({"expander"}, set()),
    "agent.decompose": ({"decomposer"}, {"sub_question_count"}),
    "agent.search": ({"collections", "searcher"}, {"result_count", "total_chunks"}),
    "agent.reason": (set(), {"iterations"}),
    "agent.rerank": ({"reranker"}, {"original", "kept"}),
    "agent.answer": ({"answerer"}, {"context_chunk_count", "correction_count", "success"}),
    "agent.self_correct": ({"attempt"}, {"result"}),
    "agent.ground": (
        {"grounder", "chunks"},
        {"score", "spans", "faithful_span_count", "hallucinated_span_count"},
    ),
    "evaluation.generate": ({"sample_size", "collection"}, {"created", "skipped"}),
    "evaluation.run": (
        {"run_id", "run_ref", "mode", "total"},
        {"mrr", "ndcg_at_10", "recall_at_5"},
    ),
    "evaluation.case": (
        {"run_id", "run_ref", "index", "total", "test_case_id", "retriever"},
        {"ndcg_at_10", "retrieved"},
    ),
    "reembed": ({"model"}, {"reembedded"}),
    "graph.extraction": (set(), {"entity_count", "relationship_count"}),
    "graph.build": ({"collection", "resume"}, {"chunks", "entities", "relationships"}),
    "graph.search": ({"depth", "matcher"}, {"entities_found", "result_count"}),
    "graph.community_detection": ({"detector"}, {"community_count"}),
    "graph.community_summary": ({"entity_count"}, {"summary_length"}),
    "graph.global_search": ({"summaries"}, {"points"}),
}

RULES = {
    "requires looking things up": '{"needs_retrieval": true}',
    "clean search query": "refunds",
    "Choose the document collections": '{"collections": ["docs"]}',
    "Broaden this search query": "refunds money back",
    "self-contained sub-questions": '{"sub_questions": ["refunds"]}',
    "contain enough information": '{"sufficient": true}',
    "Rate how well each passage": '{"1": 9, "2": 9}',
    "Review an answer against": '{"grounded": true}',
    "You answer the user's question": "Refunds take 14 days [1].",
}


def exercise_everything():
    """Run one of every operation; returns the LLM used."""
    llm = ScriptedLLM(rules=RULES, cost_per_call=0.001)
    doc = rag.ingest("Refunds take 14 days after the return arrives.", collection="docs")
    rag.ingest_many(
        ["Shipping is free over 50 euros.", "Returns need a receipt."], collection="docs"
    )
    rag.search("refunds", collection="docs", reranker=LLMReranker(llm=llm))
    rag.ask("How long do refunds take?", llm=llm, collection="docs")
    (
        Agent("How long do refunds take?", llm=llm)
        .gate()
        .rewrite()
        .select()
        .expand()
        .decompose()
        .search()
        .reason()
        .rerank()
        .answer(self_correct=True)
        .ground(grounder="embedding")
    )
    from django_rag.evaluation import generate_test_cases, run_evaluation

    generate_test_cases(1, collection="docs", llm=ScriptedLLM('{"question": "refunds?"}'))
    run_evaluation(mode="fulltext", collection="docs")
    from django_rag import maintenance
    from django_rag.testing import HashingEmbedder

    rag.ingest("An old vector.", collection="docs", embedder=HashingEmbedder(model_name="old"))
    maintenance.reembed()
    exercise_graph()
    rag.delete(doc)
    return llm


def exercise_graph():
    from django_rag.graph import build_graph, detect_communities, summarize_communities
    from tests.helpers import respond

    graph_llm = ScriptedLLM(default=respond)
    with override_settings(DJANGO_RAG={"EMBEDDER": "hashing", "LLM": graph_llm}):
        rag.ingest("Jane Doe works for Acme Corp in Berlin.", collection="g", graph=True)
        rag.ingest("Acme Corp makes the X200 drill.", collection="g")
        build_graph("g")
        detect_communities("g", min_size=2)
        summarize_communities("g")
        rag.search("Acme Corp", collection="g", graph=True, graph_depth=1)
        mapper = ScriptedLLM(default='[{"point": "Acme makes drills", "score": 50}]')
        rag.ask("What is it about?", llm=mapper, collection="g", global_search=True)


def test_every_event_fires_with_its_metadata(events):
    exercise_everything()
    for event, (start_keys, stop_keys) in EVENTS.items():
        starts = [m for kind, name, m in events if kind == "start" and name == event]
        stops = [m for kind, name, m in events if kind == "stop" and name == event]
        assert starts, f"no start event for {event}"
        assert len(stops) == len(starts), event
        assert start_keys | {"system_time", "span_id"} <= set(starts[0]), (event, starts[0])
        assert start_keys | stop_keys | {"duration", "span_id"} <= set(stops[0]), (event, stops[0])
        assert stops[0]["duration"] >= 0
    assert not [e for e in events if e[0] == "exception"]
    # Nested operations point at their parent: the search inside ask.
    ask_start = next(m for kind, name, m in events if (kind, name) == ("start", "ask"))
    inner = [
        m for kind, name, m in events if kind == "start" and m["parent_id"] == ask_start["span_id"]
    ]
    assert {"search", "llm.complete"} <= {
        name for kind, name, m in events if kind == "start" and m in inner
    }


def test_raw_text_stays_out_unless_allowed(events):
    exercise_everything()
    secret = "Refunds take 14 days after the return arrives."
    for _, _, metadata in events:
        for key in ("text", "query", "question", "answer", "prompt"):
            assert key not in metadata
        assert secret not in repr(metadata)
    events.clear()
    with override_settings(DJANGO_RAG={"EMBEDDER": "hashing", "TELEMETRY": {"INCLUDE_TEXT": True}}):
        rag.search("refund policy")
    search = next(m for kind, name, m in events if (kind, name) == ("start", "search"))
    assert search["query"] == "refund policy"


def test_a_raising_receiver_never_breaks_ingest_search_or_ask(caplog):
    def broken(sender, **kwargs):
        raise RuntimeError("receiver bug")

    operation_started.connect(broken)
    operation_finished.connect(broken)
    try:
        with caplog.at_level(logging.ERROR, logger="django_rag.signals"):
            doc = rag.ingest("Refunds take 14 days.", collection="docs")
            assert doc.chunk_count == 1
            assert rag.search("refunds", collection="docs")[0].document_id == doc.pk
            answer = rag.ask("refunds?", llm=ScriptedLLM("14 days [1]."), collection="docs")
            assert answer.citations[0].document_id == doc.pk
    finally:
        operation_started.disconnect(broken)
        operation_finished.disconnect(broken)
    assert "receiver bug" in caplog.text and "telemetry receiver" in caplog.text


def test_logging_receiver_lines_use_the_real_metadata(events, caplog):
    attach(level="DEBUG")
    try:
        with caplog.at_level(logging.DEBUG, logger="django_rag.telemetry"):
            exercise_everything()
    finally:
        detach()
    lines = [r.getMessage() for r in caplog.records if r.name == "django_rag.telemetry"]
    stops = [(name, m) for kind, name, m in events if kind == "stop"]
    assert len(lines) == len(stops)
    for name, metadata in stops:
        line = format_event(name, metadata, metadata["duration"])
        assert line in lines
        if name in DETAILS:  # every detail this receiver prints comes from real metadata
            assert "?" not in line, line
    assert any(
        line.startswith("[django_rag] search completed in ") and "result" in line for line in lines
    )
    assert any(
        "llm.complete" in line and "[scripted]" in line and "tokens" in line for line in lines
    )
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="django_rag.telemetry"):
        rag.search("refunds")
    assert not [r for r in caplog.records if r.name == "django_rag.telemetry"]


def test_logging_receiver_reports_failures_at_warning(caplog):
    attach()
    try:
        with caplog.at_level(logging.INFO, logger="django_rag.telemetry"):
            with pytest.raises(UnknownCollection):
                rag.search("x", collection="nope")
    finally:
        detach()
    failures = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert failures and "search failed after" in failures[0].getMessage()
    assert "UnknownCollection" in failures[0].getMessage()


def test_duration_formatting():
    assert format_event("x", {}, 2.345) == "[django_rag] x completed in 2.35s"
    assert format_event("x", {}, 0.012) == "[django_rag] x completed in 12ms"
    assert format_event("x", {}, 0.0001) == "[django_rag] x completed in <1ms"


def test_prometheus_metrics_on_the_metrics_endpoint(client, settings):
    from prometheus_client import REGISTRY

    # Collection names are labels only when the project allows it (docs/telemetry.md).
    settings.DJANGO_RAG = {
        **settings.DJANGO_RAG,
        "TELEMETRY": {"PROMETHEUS_COLLECTION_LABELS": True},
    }

    def value(name, **labels):
        return REGISTRY.get_sample_value(name, labels) or 0.0

    before = {
        "chunks": value("django_rag_chunks_ingested_total", collection="metrics"),
        "search": value(
            "django_rag_operation_duration_seconds_count", operation="search", mode="fulltext"
        ),
        "prompt": value("django_rag_llm_tokens_total", model="scripted", direction="prompt"),
        "cost": value("django_rag_llm_cost_usd_total", model="scripted"),
        "errors": value("django_rag_operation_errors_total", operation="search"),
    }
    doc = rag.ingest("Refunds take 14 days. " * 40, collection="metrics")
    rag.search("refunds", collection="metrics", mode="fulltext")
    rag.ask("refunds?", llm=ScriptedLLM("14 days [1].", cost_per_call=0.5), collection="metrics")
    with pytest.raises(UnknownCollection):
        rag.search("refunds", collection="no-such-collection")
    assert value("django_rag_chunks_ingested_total", collection="metrics") == (
        before["chunks"] + doc.chunk_count
    )
    assert (
        value("django_rag_operation_duration_seconds_count", operation="search", mode="fulltext")
        == before["search"] + 1
    )
    assert (
        value("django_rag_llm_tokens_total", model="scripted", direction="prompt")
        > before["prompt"]
    )
    assert value("django_rag_llm_cost_usd_total", model="scripted") == pytest.approx(
        before["cost"] + 0.5
    )
    assert value("django_rag_operation_errors_total", operation="search") == before["errors"] + 1
    body = client.get("/metrics").content.decode()
    assert 'django_rag_chunks_ingested_total{collection="metrics"}' in body
    assert (
        'django_rag_operation_duration_seconds_bucket{le="0.005",mode="fulltext",operation="search"}'
        in body
    )
    assert 'django_rag_llm_tokens_total{direction="completion",model="scripted"}' in body


def test_opentelemetry_spans_nest_and_record_errors():
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import StatusCode

    from django_rag.telemetry import opentelemetry as otel

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    otel.attach(tracer_provider=provider)
    try:
        rag.ingest("Refunds take 14 days.", collection="docs")
        rag.ask("refunds?", llm=ScriptedLLM("14 days [1]."), collection="docs")
        with pytest.raises(UnknownCollection):
            rag.search("x", collection="missing")
    finally:
        otel.detach()
    finished = exporter.get_finished_spans()
    ask = next(s for s in finished if s.name == "django_rag.ask")
    children = [s for s in finished if s.parent and s.parent.span_id == ask.context.span_id]
    assert {"django_rag.search", "django_rag.llm.complete"} <= {s.name for s in children}
    inner_search = next(s for s in children if s.name == "django_rag.search")
    assert "django_rag.vector_store.search" in {
        s.name for s in finished if s.parent and s.parent.span_id == inner_search.context.span_id
    }
    assert ask.attributes["django_rag.context_count"] == 1
    ingest = next(s for s in finished if s.name == "django_rag.ingest")
    assert ingest.attributes["django_rag.chunk_count"] == 1 and ingest.parent is None
    failed = [s for s in finished if s.status.status_code == StatusCode.ERROR]
    # The unknown collection fails where the request's scope is resolved (once, before the
    # store is asked: no vector_store.search span is opened) and is recorded on search's span.
    assert [s.name for s in failed] == ["django_rag.search"]
    assert failed[0].events[0].name == "exception"
