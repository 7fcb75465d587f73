"""Arcana's names for options that mean the same as ours (``collections``, ``vector_weight``,
``keyword_weight``) are accepted by search(), ask(), Agent and Loop; both names at once is an
InvalidOption."""

import pytest
from django.test import override_settings

import django_rag as rag
from django_rag.agent import Agent, Loop
from django_rag.exceptions import InvalidOption
from tests.helpers import ingest_agent_corpus

pytestmark = pytest.mark.django_db


@pytest.fixture
def corpus():
    with override_settings(DJANGO_RAG={"EMBEDDER": "hashing"}):
        ingest_agent_corpus()
        yield


def ranked(results):
    return [(r.chunk_id, round(r.score, 9)) for r in results]


def test_search_takes_collections_and_the_hybrid_weights_under_arcanas_names(corpus):
    ours = rag.search("warranty leave", mode="fulltext", collection=["hr"])
    theirs = rag.search("warranty leave", mode="fulltext", collections=["hr"])
    assert ours and {r.collection for r in theirs} == {"hr"}
    assert ranked(theirs) == ranked(ours)
    options = {"mode": "hybrid", "fusion": "weighted", "limit": 10}
    ours = rag.search("X200 warranty", semantic_weight=0.1, fulltext_weight=0.9, **options)
    theirs = rag.search("X200 warranty", vector_weight=0.1, keyword_weight=0.9, **options)
    default = rag.search("X200 warranty", **options)
    assert ranked(theirs) == ranked(ours) != ranked(default)


def test_ask_agent_and_loop_take_collections(corpus):
    answer = rag.ask("How long is the warranty?", llm=lambda prompt: "Two years [1].",
                     mode="fulltext", collections=["products"], keyword_weight=0.5)  # fmt: skip
    assert answer.chunks and {c.collection for c in answer.chunks} == {"products"}
    agent = Agent("How long is the warranty?", llm=lambda p: "x", collections=["hr"])
    assert agent.context.scope == ["hr"]
    loop = Loop("How long is the warranty?", llm=lambda p: "x", collections=["hr", "products"])
    assert sorted(loop.scope) == ["hr", "products"]


@pytest.mark.parametrize(
    "call",
    [
        lambda **o: rag.search("q", **o),
        lambda **o: rag.ask("q", llm=lambda p: "x", **o),
        lambda **o: Agent("q", **o),
        lambda **o: Loop("q", llm=lambda p: "x", **o),
    ],
    ids=["search", "ask", "Agent", "Loop"],
)
@pytest.mark.parametrize(
    "both",
    [
        {"collections": ["hr"], "collection": "hr"},
        {"vector_weight": 0.5, "semantic_weight": 0.5},
        {"keyword_weight": 0.5, "fulltext_weight": 0.5},
    ],
    ids=["collections", "vector_weight", "keyword_weight"],
)
def test_an_option_under_both_names_is_refused(call, both):
    alias = next(iter(both))
    with pytest.raises(InvalidOption, match=f"both {alias}= and .*give only one"):
        call(**both)
