"""Arcana's call surface (issue 37 item 1): function LLMs chosen by arity and given the chunks,
ask()'s prompt by arity with the graph context, rewrite_query(), the ASK and LOOP settings as
call defaults, and InvalidOption (never TypeError) for an unknown option of a public call."""

import json

import pytest
from django.core.management import call_command
from django.test import override_settings

import django_rag as rag
from django_rag import maintenance
from django_rag.exceptions import (
    ConfigurationError,
    InvalidOption,
    LLMError,
    LLMResponseError,
)
from django_rag.graph import PostgresGraphStore
from django_rag.llm import CallableLLM, get_llm
from django_rag.results import SearchResult
from django_rag.retrieval.service import MAX_REWRITTEN_QUERIES
from django_rag.testing import ScriptedLLM
from tests.helpers import DOCS, respond

pytestmark = pytest.mark.django_db

REFUNDS = "Refunds are paid within 14 days of the return reaching our warehouse."
SHIPPING = "Shipping is free for orders over 50 euros; other orders pay a flat 4 euro fee."
WARRANTY = "The warranty covers parts and labour for two years."


@pytest.fixture
def corpus():
    rag.ingest(REFUNDS, collection="policies", source_id="refunds")
    rag.ingest(SHIPPING, collection="policies", source_id="shipping")
    rag.ingest(WARRANTY, collection="policies", source_id="warranty")


def globex(query, collection_ids):
    return [e.pk for e in PostgresGraphStore().find(collection_ids, names=["globex"])]


def graph_settings():
    graph = {"ENABLED": True, "MIN_MATCH_SCORE": 0.0, "DEPTH": 1, "ENTITY_MATCHER": globex}
    return override_settings(
        DJANGO_RAG={"EMBEDDER": "hashing", "LLM": ScriptedLLM(default=respond), "GRAPH": graph}
    )


# --- function LLMs by arity ---------------------------------------------------------------------


def test_a_two_argument_function_llm_gets_the_chunks_ask_answers_from(corpus):
    seen = []

    def llm(prompt, context):
        seen.append(context)
        return "Fourteen days [1]."

    answer = rag.ask("How long do refunds take?", llm=llm, collection="policies", limit=2)
    (context,) = seen
    assert all(isinstance(chunk, SearchResult) for chunk in context)
    assert [c.chunk_id for c in context] == [c.chunk_id for c in answer.chunks]
    assert len(context) == 2


def test_a_three_argument_function_llm_gets_the_call_options_in_a_new_dict():
    seen = []

    def llm(prompt, context, opts):
        seen.append((prompt, context, opts))
        opts["temperature"] = 99  # the function's copy: nothing of the caller's changes
        return "ok"

    model = get_llm(llm)
    options = {"temperature": 0.2}
    assert model.complete("the question", system="rules", **options).text == "ok"
    assert seen == [("rules\n\nthe question", [], {"temperature": 99})]
    assert options == {"temperature": 0.2}


def test_star_args_counts_as_three_arguments():
    calls = []
    model = CallableLLM(lambda *args: calls.append(args) or "ok")
    model.complete("p", context=["c"], max_tokens=5)
    assert calls == [("p", ["c"], {"max_tokens": 5})]


def test_defaulted_parameters_keep_their_defaults_and_get_only_the_options_they_name():
    seen = []

    def llm(prompt, context=None, *, temperature=0.0):
        seen.append((context, temperature))
        return "ok"

    model = CallableLLM(llm)
    assert model.arity == 1  # a defaulted positional parameter is left to its default
    model.complete("p", context=["chunk"], temperature=0.5, top_p=0.9)
    assert seen == [(None, 0.5)]  # top_p: not a parameter of it, not sent

    def kwargs_llm(prompt, context, **options):
        seen.append((context, options))
        return "ok"

    CallableLLM(kwargs_llm).complete("p", context=["c"], top_p=0.9)
    assert seen[-1] == (["c"], {"top_p": 0.9})


@pytest.mark.parametrize(
    "func, message",
    [
        (lambda a, b, c, d: "x", "needs 4 positional arguments"),
        (lambda: "x", "takes no positional argument"),
        (lambda prompt, *, model: "x", "needs the keyword argument"),
    ],
)
def test_a_function_llm_that_fits_no_call_is_refused_when_given(func, message):
    with pytest.raises(InvalidOption, match=message):
        get_llm(func)
    with override_settings(DJANGO_RAG={"LLM": func}):
        with pytest.raises(ConfigurationError, match=message) as caught:
            get_llm()
    assert "LLM" in str(caught.value)


def test_a_function_llm_failing_is_still_an_llm_error():
    def llm(prompt, context):
        raise RuntimeError("provider down")

    with pytest.raises(LLMError, match="provider down"):
        get_llm(llm).complete("p", context=[])


def test_streaming_ask_gives_a_three_argument_llm_the_chunks(corpus):
    seen = []

    def llm(prompt, context, opts):
        seen.append(len(context))
        return iter(["Free over ", "50 euros [1]."])

    stream = rag.ask("Is shipping free?", llm=llm, collection="policies", limit=1, stream=True)
    assert "".join(stream) == "Free over 50 euros [1]."
    assert seen == [1] and len(stream.answer.chunks) == 1


def test_the_llm_span_counts_the_context_chunks(corpus, events):
    rag.ask("refunds", llm=ScriptedLLM("Yes [1]."), collection="policies", limit=2)
    (stop,) = [m for kind, event, m in events if kind == "stop" and event == "llm.complete"]
    assert stop["context_count"] == 2


def test_the_agent_answer_step_passes_its_chunks_as_context(corpus):
    seen = []

    def llm(prompt, context):
        seen.append([c.chunk_id for c in context])
        return "Fourteen days [1]."

    ctx = rag.Agent("How long do refunds take?", llm=llm).search(collection="policies").answer()
    assert ctx.error is None and ctx.answer
    assert seen == [[c.chunk_id for c in ctx.chunks]] and seen[0]


def test_ask_with_the_graph_gives_a_three_argument_llm_the_graph_context():
    seen = []

    def llm(prompt, context, opts):
        seen.append(opts)
        return "Paris [1]."

    with graph_settings():
        for source_id, text in DOCS.items():
            rag.ingest(text, collection="kb", source_id=source_id)
        answer = rag.ask("Where is Globex?", collection="kb", graph=True, llm=llm)
    (opts,) = seen
    assert opts["graph_context"] is answer.graph
    assert "Globex" in [e.name for e in opts["graph_context"]["entities"]]


# --- ask(prompt=...) by arity --------------------------------------------------------------------


def test_a_two_argument_prompt_gets_the_question_and_chunks(corpus):
    seen = []

    def prompt(question, chunks):
        seen.append((question, len(chunks)))
        return "custom prompt"

    llm = ScriptedLLM("Yes [1].")
    rag.ask("refunds", llm=llm, prompt=prompt, collection="policies", limit=2)
    assert seen == [("refunds", 2)] and llm.calls[0]["prompt"] == "custom prompt"


def test_a_three_argument_prompt_gets_an_empty_graph_context_without_the_graph(corpus):
    seen = []

    def prompt(question, chunks, graph_context):
        seen.append(graph_context)
        return ("system rules", "user text")

    llm = ScriptedLLM("Yes [1].")
    rag.ask("refunds", llm=llm, prompt=prompt, collection="policies")
    assert seen == [{}]
    assert (llm.calls[0]["system"], llm.calls[0]["prompt"]) == ("system rules", "user text")


def test_a_three_argument_prompt_gets_the_graph_context():
    seen = []

    def prompt(question, chunks, graph_context):
        seen.append(graph_context)
        return "custom"

    with graph_settings():
        for source_id, text in DOCS.items():
            rag.ingest(text, collection="kb", source_id=source_id)
        rag.ask("Where is Globex?", collection="kb", graph=True, prompt=prompt)
    assert "Globex" in [e.name for e in seen[0]["entities"]]


@pytest.mark.parametrize("prompt", [lambda question: "x", "not a function", lambda: "x"])
def test_a_prompt_that_fits_no_call_is_refused_before_any_search(corpus, prompt, events):
    llm = ScriptedLLM()
    with pytest.raises(InvalidOption, match="prompt"):
        rag.ask("refunds", llm=llm, prompt=prompt)
    assert llm.calls == [] and not [e for _, e, _ in events if e == "search"]


# --- rewrite_query() ------------------------------------------------------------------------------


def test_rewrite_query_returns_what_a_function_rewriter_gives():
    assert rag.rewrite_query("refund policy", rewriter=lambda q: q.upper()) == "REFUND POLICY"
    assert rag.rewrite_query("a and b", rewriter=lambda q: ["a", "b", "a"]) == ["a", "b"]


def test_rewrite_query_with_a_built_in_rewriter_uses_the_llm_given():
    llm = ScriptedLLM('{"sub_questions": ["What is A?", "What is B?"]}')
    assert rag.rewrite_query("Compare A and B", rewriter="decompose", llm=llm) == [
        "What is A?",
        "What is B?",
    ]
    assert "Compare A and B" in llm.calls[0]["prompt"]
    expanded = rag.rewrite_query("k8s", rewriter="expand", llm=ScriptedLLM("k8s kubernetes\n"))
    assert expanded == "k8s kubernetes"


@pytest.mark.parametrize(
    "rewriter, message",
    [
        (None, "needs rewriter="),
        ("expnad", "known rewriters are"),
        (42, "bad rewriter"),
        (lambda a, b: a, "needs 2 positional arguments"),
    ],
)
def test_rewrite_query_refuses_a_missing_or_bad_rewriter(rewriter, message):
    with pytest.raises(InvalidOption, match=message):
        rag.rewrite_query("refunds", rewriter=rewriter)


def test_rewrite_query_bounds_what_the_rewriter_returns():
    many = [f"query {n}" for n in range(100)]
    assert len(rag.rewrite_query("q", rewriter=lambda q: many)) == MAX_REWRITTEN_QUERIES
    huge = "word " * 50_000
    with pytest.raises(LLMResponseError, match="no usable query"):
        rag.rewrite_query("q", rewriter=lambda q: huge)
    with pytest.raises(LLMResponseError):
        rag.rewrite_query("q", rewriter=lambda q: None)
    assert rag.rewrite_query("q", rewriter=lambda q: [huge, 7, "kept"]) == ["kept"]


def test_rewrite_query_raises_the_rewriters_failure():
    with pytest.raises(LLMError):
        rag.rewrite_query("q", rewriter="expand", llm=ScriptedLLM(RuntimeError("down")))


# --- ASK and LOOP settings -----------------------------------------------------------------------


def numbered_prompt(question, chunks):
    return f"{len(chunks)} chunks for {question}"


def test_ask_settings_fill_the_options_a_call_leaves_unset(corpus):
    ask_settings = {"LIMIT": 1, "PROMPT": "tests.test_call_surface.numbered_prompt"}
    with override_settings(DJANGO_RAG={"EMBEDDER": "hashing", "ASK": ask_settings}):
        llm = ScriptedLLM("a [1].", "b [1].")
        first = rag.ask("refunds", llm=llm, collection="policies")
        second = rag.ask("refunds", llm=llm, collection="policies", limit=3, prompt=None)
    assert len(first.chunks) == 1 and llm.calls[0]["prompt"] == "1 chunks for refunds"
    assert len(second.chunks) == 3 and llm.calls[1]["prompt"] == "3 chunks for refunds"


def test_ask_mode_and_ground_settings_apply(corpus, events):
    def grounder(text, chunks):
        return []

    ask_settings = {"MODE": "fulltext", "GROUND": grounder}
    with override_settings(DJANGO_RAG={"EMBEDDER": "hashing", "ASK": ask_settings}):
        answer = rag.ask("refunds", llm=ScriptedLLM("a [1]."), collection="policies")
        off = rag.ask("refunds", llm=ScriptedLLM("a [1]."), collection="policies", ground=False)
    modes = [m["mode"] for kind, e, m in events if kind == "start" and e == "search"]
    assert modes == ["fulltext", "fulltext"]
    assert answer.grounding is not None and off.grounding is None


def test_a_bad_ask_prompt_setting_names_the_setting(corpus):
    with override_settings(DJANGO_RAG={"EMBEDDER": "hashing", "ASK": {"PROMPT": len}}):
        with pytest.raises(ConfigurationError, match="ASK.PROMPT"):
            rag.ask("refunds", llm=ScriptedLLM("x"))


def test_loop_settings_fill_the_options_a_call_leaves_unset(corpus):
    controller = ScriptedLLM("done")
    loop_settings = {
        "MAX_ITERATIONS": 2,
        "MAX_CHUNKS": 7,
        "KEEP_SOURCES": "best",
        "LLM": controller,
    }
    with override_settings(DJANGO_RAG={"EMBEDDER": "hashing", "LOOP": loop_settings}):
        loop = rag.Loop("refunds?", collection="policies")
        given = rag.Loop("refunds?", collection="policies", max_iterations=4, llm=ScriptedLLM())
    assert (loop.max_iterations, loop.max_chunks, loop.keep_sources) == (2, 7, "best")
    assert loop.llm is controller and loop.limit == 5  # LIMIT: the schema's default
    assert given.max_iterations == 4 and given.llm is not controller


def test_a_bad_loop_setting_names_it():
    with override_settings(DJANGO_RAG={"LOOP": {"MAX_ITERATIONS": "ten"}}):
        with pytest.raises(ConfigurationError, match="LOOP.MAX_ITERATIONS"):
            rag.Loop("refunds?", llm=ScriptedLLM())


def test_rag_info_and_the_info_page_show_the_ask_and_loop_settings(admin_client, capsys):
    with override_settings(
        DJANGO_RAG={"EMBEDDER": "hashing", "ASK": {"LIMIT": 3}, "LOOP": {"MAX_ITERATIONS": 4}}
    ):
        data = maintenance.info()
        call_command("rag_info", "--json")
        page = admin_client.get("/tools/rag/info/")
    assert data["settings"]["ASK"]["LIMIT"] == 3 and data["settings"]["LOOP"]["MAX_ITERATIONS"] == 4
    printed = json.loads(capsys.readouterr().out)
    assert printed["settings"]["ASK"]["LIMIT"] == 3
    assert printed["settings"]["LOOP"]["MAX_CHUNKS"] == 30
    text = page.content.decode()
    assert '"ASK"' in text.replace("&quot;", '"') and "MAX_ITERATIONS" in text


# --- InvalidOption, never TypeError ----------------------------------------------------------------


@pytest.mark.parametrize(
    "call",
    [
        lambda: rag.search("x", bogus=1),
        lambda: rag.ask("x", llm=ScriptedLLM(), bogus=1),
        lambda: rag.chat("x", llm=ScriptedLLM(), bogus=1),
        lambda: rag.Agent("x", llm=ScriptedLLM(), bogus=1),
        lambda: rag.Loop("x", llm=ScriptedLLM(), bogus=1),
        lambda: rag.rewrite_query("x", rewriter=str.upper, bogus=1),
        lambda: rag.summarize_communities(bogus=1),
        lambda: rag.summarize_community([], [], bogus=1),
        lambda: rag.indexed(bogus=1),
        lambda: rag.with_objects([], bogus=1),
    ],
    ids=[
        "search",
        "ask",
        "chat",
        "Agent",
        "Loop",
        "rewrite_query",
        "summarize_communities",
        "summarize_community",
        "indexed",
        "with_objects",
    ],
)
def test_an_unknown_option_of_a_public_call_is_an_invalid_option_naming_it(call):
    with pytest.raises(InvalidOption, match="'bogus'"):
        call()


def test_an_unknown_option_suggests_the_closest_one():
    with pytest.raises(InvalidOption, match="did you mean 'rewriter'"):
        rag.rewrite_query("x", rewritter="expand")
