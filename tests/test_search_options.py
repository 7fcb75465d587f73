"""The search options declared once (django_rag.retrieval.options) and the modes as one table
(django_rag.store.search_modes): the typed dict and the request agree, a misspelled option is
refused by name everywhere, keyword_score_floor works on real PostgreSQL, a mode without an
implementation fails loudly, and the HTTP API and MCP accept the mode aliases."""

from __future__ import annotations

import dataclasses
import enum
import importlib.util
import json
import math
import sys

import pytest
from django.test import Client, override_settings

import django_rag as rag
from django_rag import modes
from django_rag.exceptions import InvalidOption, InvalidSearchMode
from django_rag.fusion import FUSIONS
from django_rag.models import Chunk
from django_rag.modes import SearchMode
from django_rag.retrieval import MemoryVectorStore
from django_rag.retrieval.options import (
    AgentSearchOptions,
    RequestOptions,
    ScopeOptions,
    SearchComponents,
    SearchOptions,
    search_option_names,
)
from django_rag.retrieval.request import SearchRequest, build_request
from django_rag.store import search_modes
from django_rag.store.search_modes import MODE_TABLE, complete, implementation, score_legend
from django_rag.testing import ScriptedLLM

# SearchRequest fields no caller gives: the query (positional), the query's embedding and the
# collection ids (both filled in later by the search), and the names' tuple, given as
# ``collection``.
DERIVED = {"query", "vector", "collection_ids", "collections"}


def test_the_typed_options_are_the_search_request_fields():
    fields = {field.name for field in dataclasses.fields(SearchRequest)}
    assert set(RequestOptions.__optional_keys__) == fields - DERIVED | {"collection"}
    assert not RequestOptions.__required_keys__ and not SearchOptions.__required_keys__
    assert set(SearchOptions.__optional_keys__) == set(RequestOptions.__optional_keys__) | set(
        SearchComponents.__optional_keys__
    )
    assert search_option_names() == SearchOptions.__optional_keys__


def test_an_agent_takes_every_search_option_but_the_ones_it_sets_itself():
    from django_rag.agent.context import _OWN_OPTIONS

    assert set(ScopeOptions.__optional_keys__) == _OWN_OPTIONS - {"query"}
    assert set(AgentSearchOptions.__optional_keys__) == set(SearchOptions.__optional_keys__) - set(
        ScopeOptions.__optional_keys__
    )


def test_every_request_option_reaches_the_request():
    """Each declared option, given a value other than its default, is what the request holds
    (one not carried over would fail here; a new option needs a value in this table)."""
    given = {
        "mode": "keyword",
        "limit": 7,
        "threshold": 0.25,
        "collection": "handbook",
        "source_id": "refunds",
        "metadata": {"lang": "en"},
        "fusion": "weighted",
        "rrf_k": 30,
        "semantic_weight": 0.2,
        "fulltext_weight": 0.8,
        "keyword_score_floor": 0.3,
        "candidates": 3,
        "syntax": "websearch",
        "hnsw_ef_search": 50,
        "context_window": 1,
        "diversity": 0.5,
        "database": "default",
    }
    assert set(given) == set(RequestOptions.__optional_keys__)
    request = build_request("refunds", **given)
    expected = {**given, "mode": SearchMode.FULLTEXT, "collection": ("handbook",)}
    for name, value in expected.items():
        field = "collections" if name == "collection" else name
        assert getattr(request, field) == value, name


@pytest.mark.parametrize(
    "options, message",
    [
        ({"bogus": 1}, r"search\(\) got an unknown option 'bogus'"),
        ({"limt": 3}, r"unknown option 'limt'; did you mean 'limit'\?"),
        ({"keyword_score_flor": 0.1}, r"did you mean 'keyword_score_floor'\?"),
        ({"strict_collections": True}, r"'strict_collections'; searches are always strict"),
    ],
)
def test_an_unknown_option_is_refused_by_name_before_any_work(options, message):
    with pytest.raises(InvalidOption, match=message):
        rag.search("refunds", **options)
    with pytest.raises(InvalidOption, match=message.replace(r"search\(\)", r"ask\(\)")):
        rag.ask("refunds?", llm=ScriptedLLM(default="unused"), **options)
    with pytest.raises(InvalidOption, match="unknown option"):
        build_request("refunds", **options)


def test_build_request_refuses_a_component():
    with pytest.raises(InvalidOption, match="unknown option 'reranker'"):
        build_request("refunds", reranker="cross-encoder")  # type: ignore[call-arg]


@pytest.mark.django_db
def test_chat_takes_the_search_options_and_refuses_a_misspelled_one():
    rag.ingest("Refunds are paid within 14 days.", collection="handbook", source_id="r")
    llm = ScriptedLLM(default="Within 14 days [1].")
    with pytest.raises(InvalidOption, match="did you mean 'limit'"):
        rag.chat("How fast are refunds?", llm=llm, limt=3)
    reply = rag.chat("How fast are refunds?", llm=llm, collection="handbook", mode="keyword")
    assert [c.source_id for c in reply.answer.chunks] == ["r"]


# --- keyword_score_floor -------------------------------------------------------------------


def _weighted_top(query: str, floor: float | None, **options) -> float:
    """The best hybrid score when only the full-text side counts (weighted fusion)."""
    extra = {} if floor is None else {"keyword_score_floor": floor}
    (best,) = rag.search(
        query,
        mode="hybrid",
        fusion="weighted",
        semantic_weight=0,
        fulltext_weight=1,
        limit=1,
        **extra,
        **options,
    )
    return best.score


@pytest.mark.django_db
def test_keyword_score_floor_keeps_a_weak_full_text_side_weak_on_postgresql(settings):
    topics = ["rivers", "engines", "violins", "glaciers", "tariffs", "orchids", "comets"]
    for i, topic in enumerate(topics * 3):
        rag.ingest(
            f"Quarterly report number {i} about {topic}.", collection="floor", source_id=str(i)
        )
    (top,) = rag.search("report", mode="fulltext", collection="floor", limit=1)
    bm25 = top.score
    assert 0 < bm25  # "report" is in every chunk: a weak BM25
    # Divided by the best candidate's BM25 when the floor is below it...
    assert _weighted_top("report", 0, collection="floor") == pytest.approx(1.0)
    assert _weighted_top("report", bm25 / 2, collection="floor") == pytest.approx(1.0)
    # ... by the floor when above it: the side stays as weak as its BM25 is.
    assert _weighted_top("report", bm25 * 4, collection="floor") == pytest.approx(0.25)
    # The default is SEARCH["KEYWORD_SCORE_FLOOR"], 0.05 (Arcana's).
    assert _weighted_top("report", None, collection="floor") == pytest.approx(
        bm25 / max(bm25, 0.05)
    )
    settings.DJANGO_RAG = {**settings.DJANGO_RAG, "SEARCH": {"KEYWORD_SCORE_FLOOR": bm25 * 2}}
    assert _weighted_top("report", None, collection="floor") == pytest.approx(0.5)
    # The other fusions do not divide by the best: the floor changes nothing there.
    for fusion in ("adaptive", "rrf"):
        scores = {
            floor: rag.search(
                "report", mode="hybrid", fusion=fusion, keyword_score_floor=floor, limit=3
            )
            for floor in (0, 100)
        }
        assert [(r.chunk_id, r.score) for r in scores[0]] == [
            (r.chunk_id, r.score) for r in scores[100]
        ]


@pytest.mark.django_db
def test_the_memory_store_applies_the_same_floor():
    store = MemoryVectorStore()
    for i, topic in enumerate(["rivers", "engines", "violins", "glaciers"] * 3):
        store.add([1.0, float(i), 0.5], text=f"Quarterly report {i} on {topic}.", collection="m")
    options = {"vector_store": store, "embedder": lambda texts: [[1.0, 2.0, 0.5] for _ in texts]}
    (top,) = rag.search("report", mode="fulltext", limit=1, **options)
    assert _weighted_top("report", 0, **options) == pytest.approx(1.0)
    assert _weighted_top("report", top.score * 4, **options) == pytest.approx(0.25)


@pytest.mark.parametrize("bad", [-0.1, math.nan, math.inf, "0.1", True])
def test_a_bad_keyword_score_floor_is_refused(bad):
    with pytest.raises(InvalidOption, match="keyword_score_floor"):
        build_request("refunds", keyword_score_floor=bad)


# --- modes as a table ----------------------------------------------------------------------


def test_every_mode_has_one_entry_saying_what_it_needs():
    assert set(MODE_TABLE) == set(SearchMode)
    needs = {
        mode: (MODE_TABLE[mode].uses_vector, MODE_TABLE[mode].uses_text) for mode in SearchMode
    }
    assert needs == {
        SearchMode.SEMANTIC: (True, False),
        SearchMode.FULLTEXT: (False, True),
        SearchMode.HYBRID: (True, True),
    }
    assert implementation("vector") is MODE_TABLE[SearchMode.SEMANTIC]
    assert implementation("keyword") is MODE_TABLE[SearchMode.FULLTEXT]
    assert score_legend("semantic", "rrf").startswith("score: cosine similarity")
    assert score_legend("keyword", "rrf").startswith("score: BM25")
    legends = {score_legend("hybrid", fusion) for fusion in FUSIONS}
    assert len(legends) == len(FUSIONS) and all("{" not in text for text in legends)


def test_a_table_missing_a_mode_is_refused():
    partial = {SearchMode.SEMANTIC: 1, SearchMode.FULLTEXT: 2}
    with pytest.raises(TypeError, match=r"missing \['hybrid'\]"):
        complete(partial, "partial")
    with pytest.raises(TypeError, match=r"unknown \['psychic'\]"):
        complete({**partial, SearchMode.HYBRID: 3, "psychic": 4}, "extra")


# A SearchMode with one more member, as a contributor adding a mode would write it.
Extended = enum.StrEnum("Extended", {**{m.name: m.value for m in SearchMode}, "QUANTUM": "quantum"})


def test_a_new_mode_without_an_implementation_fails_at_import_not_as_hybrid(monkeypatch):
    monkeypatch.setattr(modes, "SearchMode", Extended)
    spec = importlib.util.spec_from_file_location(
        "django_rag.store.search_modes_with_a_new_mode", search_modes.__file__
    )
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses look their module up
    with pytest.raises(TypeError, match=r"MODE_TABLE must have one entry per search mode: "
                       r"missing \['quantum'\]"):  # fmt: skip
        spec.loader.exec_module(module)
    monkeypatch.undo()
    # And a mode the table lacks is never looked up as another one.
    with pytest.raises(InvalidSearchMode):
        implementation(Extended.QUANTUM)


@pytest.mark.django_db
def test_a_request_in_a_mode_without_an_entry_raises_in_the_store(monkeypatch):
    """Even a request that slipped past parsing (a mode added to the enum only) raises in the
    store instead of running as hybrid."""
    rag.ingest("Refunds are paid within 14 days.", collection="handbook")
    request = dataclasses.replace(build_request("refunds", mode="hybrid"), vector=[0.1] * 384)
    monkeypatch.setattr(SearchMode, "parse", classmethod(lambda cls, value: value))
    monkeypatch.setattr(
        search_modes, "MODE_TABLE", {m: MODE_TABLE[m] for m in MODE_TABLE if m != "hybrid"}
    )
    with pytest.raises(InvalidSearchMode, match="no implementation"):
        rag.retrieval.PgVectorStore().search(request)


# --- the HTTP API and MCP read the same declarations ----------------------------------------


def test_the_mode_names_are_the_modes_then_their_aliases():
    assert modes.NAMES == ("semantic", "fulltext", "hybrid", "vector", "keyword")


@pytest.mark.django_db
def test_the_api_accepts_the_mode_aliases_and_describes_them(settings):
    pytest.importorskip("ninja", reason="the API needs the 'api' extra (django-ninja)")
    from django.contrib.auth.models import User

    settings.DJANGO_RAG = {
        **settings.DJANGO_RAG,
        "LLM": ScriptedLLM(default="Radium [1]."),
        "API": {"RATE_LIMIT": None, "TOKEN_BUDGET": None, "READ_ALL": "staff"},
    }
    rag.ingest("Marie Curie discovered radium.", collection="help", source_id="curie")
    rag.ingest("The Eiffel Tower is in Paris.", collection="help", source_id="eiffel")
    client = Client()
    client.force_login(User.objects.create_user("staff", is_staff=True))

    def post(path, body):
        return client.post("/rag/api" + path, json.dumps(body), content_type="application/json")

    for mode in ("keyword", "vector", "fulltext"):
        response = post("/search", {"query": "radium", "mode": mode, "limit": 1})
        assert response.status_code == 200, response.content
        assert [r["source_id"] for r in response.json()["results"]] == ["curie"], mode
    response = post("/ask", {"question": "Who found radium?", "mode": "keyword"})
    assert response.status_code == 200, response.content
    curie = Chunk.objects.get(document__source_id="curie").pk
    assert [c["chunk_id"] for c in response.json()["chunks"]] == [curie]
    bad = post("/search", {"query": "radium", "mode": "psychic"})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_input"
    schema = client.get("/rag/api/openapi.json").json()["components"]["schemas"]
    for name in ("SearchIn", "AskIn", "MessageIn"):
        (choice,) = [s for s in schema[name]["properties"]["mode"]["anyOf"] if "enum" in s]
        assert tuple(choice["enum"]) == modes.NAMES, name


@pytest.mark.django_db
def test_the_mcp_tools_accept_the_mode_aliases_and_list_them():
    from django_rag.mcp.tools import ASK_ARGUMENTS, SEARCH_ARGUMENTS, TOOLS, McpConfig, call_tool

    rag.ingest("Refunds are paid within 14 days.", collection="handbook", source_id="refunds")
    with override_settings(
        DJANGO_RAG={"EMBEDDER": "hashing", "MCP": {"COLLECTIONS": ["handbook"]}}
    ):
        config = McpConfig.from_settings()
    for mode in ("keyword", "vector"):
        result, is_error = call_tool("search", {"query": "refunds", "mode": mode}, config)
        assert not is_error, result
        assert [r["source_id"] for r in result["results"]] == ["refunds"]
    for tool in ("search", "ask"):
        assert tuple(TOOLS[tool].schema(config)["properties"]["mode"]["enum"]) == modes.NAMES
    # The tools' search arguments are search options (the query, the question aside).
    assert {*SEARCH_ARGUMENTS, *ASK_ARGUMENTS} - {"query", "question"} <= search_option_names()
