"""search(diversity=...): maximal marginal relevance over the best candidates, on real
PostgreSQL with the stored embeddings; the picking rule itself as properties."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import django_rag as rag
from django_rag.exceptions import InvalidOption
from django_rag.retrieval.diversity import mmr_order

POLICY = "Refund policy: refunds are paid to the card within fourteen days of the return."
SHIPPING = "Refund of shipping costs: the return label is free when the item arrived damaged."
OTHER = "The warehouse opens at eight and closes at six on weekdays."


@pytest.fixture
def copies(db, settings):
    settings.DJANGO_RAG = {"EMBEDDER": "hashing"}
    for number in range(3):  # the same page stored three times, under three source ids
        rag.ingest(POLICY, collection="help", source_id=f"policy-{number}")
    rag.ingest(SHIPPING, collection="help", source_id="shipping")
    rag.ingest(OTHER, collection="help", source_id="hours")


@pytest.mark.parametrize("mode", ["semantic", "fulltext", "hybrid"])
def test_diversity_lets_a_different_chunk_past_the_copies(copies, mode):
    plain = rag.search("refund policy card", mode=mode, collection="help", limit=2)
    assert [r.text for r in plain] == [POLICY, POLICY]
    diverse = rag.search("refund policy card", mode=mode, collection="help", limit=2, diversity=0.7)
    assert [r.text for r in diverse] == [POLICY, SHIPPING]
    assert diverse[0].chunk_id == plain[0].chunk_id  # the first pick is the most relevant
    # 0 is off, and the setting is the default.
    off = rag.search("refund policy card", mode=mode, collection="help", limit=2, diversity=0)
    assert [r.chunk_id for r in off] == [r.chunk_id for r in plain]


def test_the_setting_is_the_default_and_picks_follow_the_rerankers_order(copies, settings):
    settings.DJANGO_RAG = {"EMBEDDER": "hashing", "SEARCH": {"DIVERSITY": 0.7}}
    seen = []

    def warehouse_first(query, results):  # the opposite of the retrieval order
        seen.append(len(results))
        return [9.0 if "warehouse" in r.text else 1.0 + ("shipping" in r.text) for r in results]

    retrieved = rag.search(
        "refund policy card", mode="semantic", collection="help", limit=5, diversity=0
    )
    assert retrieved[-1].text == OTHER
    found = rag.search(
        "refund policy card",
        mode="semantic",
        collection="help",
        limit=2,
        candidates=3,
        reranker=warehouse_first,
    )
    # Candidates x limit = 6 asked for; the 5 chunks there are were all reranked, and the
    # reranker's best is the first pick, its scores the relevance.
    assert seen == [5]
    # Then POLICY over SHIPPING: half its reranked relevance, but less like OTHER (0.1
    # against 0.26 with these hashed embeddings).
    assert [r.text for r in found] == [OTHER, POLICY]
    assert [r.rerank_score for r in found] == [9.0, 1.0]


def test_another_store_refuses_diversity(copies):
    from django_rag.retrieval import MemoryVectorStore

    with pytest.raises(InvalidOption, match="diversity needs the pgvector store"):
        rag.search("refund", vector_store=MemoryVectorStore(), diversity=0.3)


def test_ask_passes_diversity_to_its_search(copies):
    from django_rag.testing import ScriptedLLM

    llm = ScriptedLLM("Paid within fourteen days [1]; the label is free if damaged [2].")
    answer = rag.ask("refund policy card", llm=llm, collection="help", limit=2, diversity=0.7)
    assert [c.text for c in answer.chunks] == [POLICY, SHIPPING]
    assert SHIPPING in llm.calls[0]["prompt"]


@pytest.mark.parametrize("value", [-0.1, 1.5, "0.5", True, float("nan")])
def test_a_bad_diversity_is_a_typed_error(db, value):
    with pytest.raises(InvalidOption, match="diversity"):
        rag.search("refund", diversity=value)


def test_mmr_prefers_the_unlike_candidate_and_zero_keeps_the_ranking():
    a, b = np.array([1.0, 0.0]), np.array([0.0, 1.0])
    vectors = np.stack([a, a, b])
    assert mmr_order([1.0, 0.99, 0.5], vectors, 2, 0.0) == [0, 1]
    assert mmr_order([1.0, 0.99, 0.5], vectors, 2, 0.5) == [0, 2]
    assert mmr_order([1.0, 0.99, 0.5], vectors, 3, 0.5) == [0, 2, 1]
    # A chunk without an embedding (a zero row) is like nothing.
    assert mmr_order([1.0, 0.9, 0.8], np.stack([a, a, np.zeros(2)]), 2, 0.5) == [0, 2]
    assert mmr_order([], np.zeros((0, 2)), 3, 0.5) == []


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=30),
    st.integers(0, 40),
    st.floats(0, 1),
    st.integers(0, 2**32 - 1),
)
def test_mmr_picks_distinct_candidates_the_first_first(relevance, limit, diversity, seed):
    relevance = sorted(relevance, reverse=True)  # candidates come best first
    rows = np.random.default_rng(seed).normal(size=(len(relevance), 4))
    vectors = rows / np.linalg.norm(rows, axis=1, keepdims=True)
    order = mmr_order(relevance, vectors, limit, diversity)
    assert len(order) == len(set(order)) == min(limit, len(relevance))
    assert all(0 <= i < len(relevance) for i in order)
    assert order[:1] == [0][: len(order)]
    if diversity == 0:
        assert order == list(range(len(order)))
