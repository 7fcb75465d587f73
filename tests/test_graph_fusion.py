"""The graph list in search fusion: weighted RRF, the match-strength gate, their settings."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
from django.test import override_settings

import django_rag as rag
from django_rag.checks import check_settings
from django_rag.exceptions import ConfigurationError, InvalidOption
from django_rag.fusion import rrf_merge
from django_rag.models import Entity
from django_rag.signals import operation_finished
from django_rag.testing import ScriptedLLM
from tests.helpers import DOCS, respond


def items(*ids):
    return [SimpleNamespace(chunk_id=i, score=0.0) for i in ids]


def scores(merged):
    return [(r.chunk_id, r.score) for r in merged]


# --- weighted reciprocal rank fusion ----------------------------------------------------------


def test_weighted_rrf_by_hand():
    merged = rrf_merge([items("a", "b", "c"), items("c", "d")], rrf_k=10, weights=[1, 0.5])
    # a: 1/11; b: 1/12; c: 1/13 + 0.5/11; d: 0.5/12
    assert [r.chunk_id for r in merged] == ["c", "a", "b", "d"]
    expected = {"a": 1 / 11, "b": 1 / 12, "c": 1 / 13 + 0.5 / 11, "d": 0.5 / 12}
    for chunk_id, score in scores(merged):
        assert score == pytest.approx(expected[chunk_id])


def test_weighted_rrf_can_let_the_second_list_lead():
    merged = rrf_merge([items("a", "b"), items("b", "a")], rrf_k=0, weights=[1, 3])
    # a: 1/1 + 3/2 = 2.5; b: 1/2 + 3/1 = 3.5
    assert scores(merged) == [("b", pytest.approx(3.5)), ("a", pytest.approx(2.5))]


def test_unit_weights_are_the_plain_fusion():
    lists = [items("a", "b", "c"), items("c", "a", "x")]
    plain = scores(rrf_merge([list(r) for r in lists], rrf_k=60))
    weighted = scores(rrf_merge([list(r) for r in lists], rrf_k=60, weights=[1.0, 1.0]))
    assert plain == weighted
    assert plain[0] == ("a", pytest.approx(1 / 61 + 1 / 62))


def test_a_list_of_weight_zero_takes_no_part():
    alone = scores(rrf_merge([items("a", "b")], rrf_k=60))
    with_zero = scores(rrf_merge([items("a", "b"), items("z", "b")], rrf_k=60, weights=[1, 0]))
    assert with_zero == alone  # "z" only in the zero-weight list: left out
    assert rrf_merge([items("a")], weights=[0]) == []


@pytest.mark.parametrize(
    "weights",
    [
        [1],  # one per ranking
        [1, 2, 3],
        [1, -0.5],
        [1, math.nan],
        [1, math.inf],
        [1, True],
        [1, "0.5"],
        [1, None],
        "11",
        0.5,
    ],
)
def test_weights_are_validated(weights):
    with pytest.raises(InvalidOption):
        rrf_merge([items("a"), items("b")], weights=weights)


# --- the graph list in search -----------------------------------------------------------------


def graph_on(**graph):
    return override_settings(
        DJANGO_RAG={
            "EMBEDDER": "hashing",
            "LLM": ScriptedLLM(default=respond),
            "GRAPH": {"ENABLED": True, **graph},
        }
    )


@pytest.fixture
def corpus(db):
    with graph_on():
        for source_id, text in DOCS.items():
            rag.ingest(text, collection="kb", source_id=source_id)
    return Entity.objects.get(collection__name="kb", normalized_name="globex").pk


@pytest.fixture
def spans():
    found = []

    def receive(sender, *, event, metadata, **kwargs):
        found.append((event, metadata))

    operation_finished.connect(receive)
    yield found
    operation_finished.disconnect(receive)


def plain(query):
    return [(r.chunk_id, r.score, r.graph_score) for r in rag.search(query, graph=False, **OPTIONS)]


OPTIONS = {"collection": "kb", "mode": "fulltext", "limit": 10}
QUERY = "Jane Doe engineer Acme"  # full text finds "jane" then "acme"; the graph adds "globex"


def test_a_weak_match_leaves_the_results_as_without_the_graph(corpus, spans):
    with graph_on(MIN_MATCH_SCORE=0.5):
        without = plain(QUERY)
        assert [r.source_id for r in rag.search(QUERY, graph=False, **OPTIONS)] == ["jane", "acme"]
        hits = rag.search(QUERY, graph=True, entity_matcher=lambda q, c: {corpus: 0.49}, **OPTIONS)
    assert [(r.chunk_id, r.score, r.graph_score) for r in hits] == without
    graph_span = [m for e, m in spans if e == "graph.search"][-1]
    assert graph_span["skipped"] == "weak match" and graph_span["result_count"] == 0
    assert graph_span["match_score"] == pytest.approx(0.49)
    search_span = [m for e, m in spans if e == "search"][-1]
    assert search_span["graph_enhanced"] is False
    assert search_span["graph_skipped"] == "weak match"


def test_a_strong_match_fuses_the_graph_list_with_its_weight(corpus, spans):
    with graph_on(MIN_MATCH_SCORE=0.5, WEIGHT=0.25, RRF_K=10):
        hits = rag.search(QUERY, graph=True, entity_matcher=lambda q, c: {corpus: 0.5}, **OPTIONS)
    by_source = {h.source_id: h for h in hits}
    assert [h.source_id for h in hits] == ["jane", "acme", "globex"]
    assert by_source["jane"].score == pytest.approx(1 / 11)
    assert by_source["acme"].score == pytest.approx(1 / 12)
    assert by_source["globex"].score == pytest.approx(0.25 / 11)
    assert by_source["globex"].graph_score == pytest.approx(0.5)
    assert by_source["jane"].graph_score is None
    search_span = [m for e, m in spans if e == "search"][-1]
    assert search_span["graph_enhanced"] is True and "graph_skipped" not in search_span
    # A heavier graph list moves its chunk to the top: 3/11 > 1/11.
    with graph_on(MIN_MATCH_SCORE=0.5, WEIGHT=3, RRF_K=10):
        hits = rag.search(QUERY, graph=True, entity_matcher=lambda q, c: {corpus: 0.9}, **OPTIONS)
    assert [h.source_id for h in hits][0] == "globex"


def test_weight_zero_keeps_the_ranking_without_the_graph(corpus, spans):
    with graph_on(WEIGHT=0, MIN_MATCH_SCORE=0):
        without = plain(QUERY)
        hits = rag.search(QUERY, graph=True, entity_matcher=lambda q, c: {corpus: 1.0}, **OPTIONS)
    assert [(r.chunk_id, r.score, r.graph_score) for r in hits] == without
    assert [m for e, m in spans if e == "search"][-1]["graph_skipped"] == "weight 0"


def test_the_gate_does_not_change_the_answer_context(corpus):
    """ask(graph=True) shows the same entities and relationships whether or not the gate
    drops the graph list from the ranking (the neighbours are then expanded for the prompt)."""

    def context(gate):
        with graph_on(MIN_MATCH_SCORE=gate):
            answer = rag.ask(
                "What is Globex?",
                collection="kb",
                graph=True,
                graph_depth=1,
                entity_matcher=lambda q, c: {corpus: 0.5},
                llm=ScriptedLLM("Globex is in Paris [1]."),
            )
        graph = answer.graph
        return (
            [e.name for e in graph["entities"]],
            sorted((r.source.name, r.target.name, r.type) for r in graph["relationships"]),
        )

    gated, fused = context(0.9), context(0.0)
    assert gated == fused == (["Globex"], [("Globex", "Paris", "LOCATED_IN")])


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("WEIGHT", -1),
        ("WEIGHT", "1"),
        ("WEIGHT", math.nan),
        ("WEIGHT", math.inf),
        ("WEIGHT", True),
        ("WEIGHT", 10**400),
        ("MIN_MATCH_SCORE", 1.5),
        ("MIN_MATCH_SCORE", -0.1),
        ("MIN_MATCH_SCORE", None),
        ("RRF_K", -1),
    ],
)
def test_graph_fusion_settings_are_validated(corpus, key, value):
    with graph_on(**{key: value}):
        (error,) = check_settings()
        assert error.id == "django_rag.E005" and f"GRAPH.{key}" in error.msg
        with pytest.raises(ConfigurationError, match=f"GRAPH.{key}"):
            rag.search(QUERY, graph=True, **OPTIONS)
        rag.search(QUERY, graph=False, **OPTIONS)  # without the graph it is not read


def test_valid_graph_fusion_settings_pass_the_check(db):
    with graph_on(WEIGHT=0, MIN_MATCH_SCORE=1, RRF_K=0):
        assert check_settings() == []


def collection_lookups(captured) -> list[str]:
    """The statements that read the collection table by name (resolving a scope)."""
    return [
        q["sql"]
        for q in captured.captured_queries
        if 'FROM "django_rag_collection"' in q["sql"]
        and '"django_rag_collection"."name"' in q["sql"]
    ]


def test_a_scoped_hybrid_graph_search_resolves_its_collections_once(corpus):
    """One search request resolves its collection names to ids once: the store, the chunk
    scope and the graph search share the ids (the embedder is warm, so no early check)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with graph_on(MIN_MATCH_SCORE=0.0):
        options = {"collection": ["kb"], "mode": "hybrid", "limit": 5, "graph": True}
        matcher = lambda q, c: {corpus: 0.9}  # noqa: E731
        rag.search(QUERY, entity_matcher=matcher, **options)  # warm the embedder
        with CaptureQueriesContext(connection) as captured:
            hits = rag.search(QUERY, entity_matcher=matcher, **options)
    assert hits and any(h.graph_score for h in hits)
    assert len(collection_lookups(captured)) == 1, collection_lookups(captured)
