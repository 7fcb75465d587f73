"""The Ask page shows the work: pipeline steps, the loop's tool calls, chunks and their scores,
grounding highlights, usage and the request's telemetry timeline; scoping holds in every mode."""

import html
import json
import re
import threading
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest
from django.test import override_settings

from django_rag.dashboard import views
from django_rag.dashboard.trace import capture_spans, timeline
from django_rag.results import GroundedSpan
from django_rag.signals import span
from django_rag.testing import ScriptedLLM
from tests.helpers import (
    ANSWER,
    CORRECT,
    DECOMPOSE,
    EXPAND,
    GATE,
    JUDGE,
    RERANK,
    REWRITE,
    SELECT,
    SUFFICIENT,
    ingest_agent_corpus,
    url,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def corpus():
    ingest_agent_corpus()


def only_hr(user):
    return ["hr"]


def nothing(user):
    return []


def settings(llm, **extra):
    return override_settings(DJANGO_RAG={"EMBEDDER": "hashing", "LLM": llm, **extra})


def post(client, **data):
    data = {"question": "What warranty does the X200 have?", "mode": "fulltext", "limit": 3, **data}
    response = client.post(url("ask"), data)
    assert response.status_code == 200
    return response.content.decode()


def step_text(body: str, name: str) -> str:
    """The text of one step's row of the pipeline's trace."""
    return text_of(body, f"step-{name}", end="dd")


def text_of(body: str, element_id: str, end: str = "dd|table|p|section|div") -> str:
    """The text inside the element with this id (tags removed, whitespace collapsed) up to
    the first closing tag of the ``end`` names."""
    match = re.search(rf'id="{element_id}"[^>]*>(.*?)</({end})>', body, re.S)
    assert match, f"no #{element_id} on the page"
    return " ".join(re.sub(r"<[^>]+>", " ", match.group(1)).split())


def pipeline_llm():
    judged = []

    def sufficient(prompt):
        # The first judgement asks for a follow-up search; the next one is satisfied.
        judged.append(prompt)
        if len(judged) == 1:
            return '{"sufficient": false, "follow_up_query": "X100 motor power"}'
        return '{"sufficient": true}'

    verdicts = iter(['{"grounded": false, "feedback": "Say it is the X200."}'])
    return ScriptedLLM(
        rules={
            GATE: '{"needs_retrieval": true, "reasoning": "It asks about a product."}',
            REWRITE: "X200 drill warranty",
            SELECT: '{"collections": ["products"], "reasoning": "Manuals cover drills."}',
            EXPAND: "X200 drill warranty guarantee",
            DECOMPOSE: '{"sub_questions": ["X200 warranty", "X200 guarantee length"]}',
            SUFFICIENT: sufficient,
            RERANK: lambda prompt: json.dumps(
                {
                    i: (9 if "X200" in t else 2)
                    for i, t in re.findall(r'id="(\d+)">\n([^<]*)', prompt)
                }
            ),
            JUDGE: lambda prompt: next(verdicts, '{"grounded": true}'),
            CORRECT: "The X200 has a two year warranty [1].",
            ANSWER: "Two years [1].",
        },
        cost_per_call=0.01,
    )


STEPS = ["gate", "rewrite", "select", "expand", "decompose", "reason", "rerank", "self_correct"]


def test_pipeline_mode_shows_every_step(staff, corpus):
    with settings(pipeline_llm()):
        body = post(staff, kind="pipeline", steps=STEPS)
    assert "The X200 has a two year warranty [1]." in text_of(body, "answer")
    assert text_of(body, "steps-run") == (
        "Steps: gate → rewrite → select → expand → decompose → search → reason → rerank → "
        "answer → self_correct"
    )
    # Each step's trace: the context fields it declares it produces, under their labels.
    assert step_text(body, "gate") == "Decision: retrieve Reasoning: It asks about a product."
    assert step_text(body, "rewrite") == "Query: X200 drill warranty"
    assert step_text(body, "select") == (
        "Chose: products Offered: hr products Reasoning: Manuals cover drills."
    )
    assert step_text(body, "expand") == "Query: X200 drill warranty guarantee"
    assert step_text(body, "decompose") == "Sub-questions: X200 warranty X200 guarantee length"
    search = step_text(body, "search")
    assert search.startswith("Collections: products Queries: X200 warranty X200 guarantee length")
    assert "“X200 warranty” in products: 1 chunk(s)" in search
    assert step_text(body, "reason").startswith("Follow-up searches: 1 Queries searched:")
    assert step_text(body, "reason").endswith("X100 motor power")
    assert step_text(body, "rerank") == "Kept: x200 (9.00) Dropped: x100 (2.00)"
    assert (
        step_text(body, "answer") == "Corrections: Say it is the X200. (replaced: Two years [1].)"
    )
    # Every chunk with its scores: the kept one used, the dropped ones shown as dropped.
    rows = re.findall(r'<tr class="(kept|dropped)" data-chunk="(\d+)">', body)
    assert [kind for kind, _ in rows] == ["kept", "dropped"]
    chunks = text_of(body, "chunks")
    assert "x200" in chunks and "9.00" in chunks and "2.00" in chunks
    # Usage and cost: one call per step's LLM use, $0.01 each.
    usage = text_of(body, "usage")
    assert "openai" not in usage and "Total" in usage and "0.1" in usage
    # The timeline holds this request's spans, the agent's steps among them.
    events = re.findall(r'<span style="padding-left: \d+px">([\w.]+)</span>', body)
    for event in ["agent.gate", "agent.select", "agent.search", "agent.rerank", "agent.answer"]:
        assert event in events
    assert events.count("search") >= 3  # sub-questions and the follow-up, nested in steps
    assert "agent.self_correct" in events


def test_pipeline_shows_a_skipped_search_and_a_failed_step(staff, corpus):
    with settings(ScriptedLLM(default="{}")):
        body = post(staff, kind="pipeline", steps=["gate"], mode="nonsense-mode")
    assert "Select a valid choice" in body  # a bad form is refused before anything runs
    llm = ScriptedLLM(rules={GATE: '{"needs_retrieval": false, "reasoning": "Chit-chat."}'},
                      default="Hello!")  # fmt: skip
    with settings(llm):
        body = post(staff, kind="pipeline", steps=["gate"], question="Hello there")
    assert step_text(body, "gate") == "Decision: answer without retrieval Reasoning: Chit-chat."
    assert step_text(body, "search") == "Skipped (the gate decided no retrieval was needed)."
    assert "No chunk." in body
    # The answer step fails (the provider is down): the work up to it is still shown.
    llm = ScriptedLLM(rules={REWRITE: "X200 warranty", ANSWER: RuntimeError("provider down")})
    with settings(llm):
        body = post(staff, kind="pipeline", steps=["rewrite"])
    assert text_of(body, "failed-step").startswith("The answer step failed: ")
    assert "provider down" in text_of(body, "failed-step")
    assert 'class="messages"' in body and step_text(body, "rewrite") == "Query: X200 warranty"
    assert 'class="kept" data-chunk=' in body  # the chunks found are still listed
    assert 'id="answer-card" hidden' in body  # no answer to show


def test_loop_mode_shows_the_tool_trace_and_stop_reason(staff, corpus):
    llm = ScriptedLLM(
        ("search", {"query": "X200 warranty", "limit": 2}),
        ("search", {"query": "<script>alert(1)</script>", "collection": "nope"}),
        ("answer", {"text": "Two years [1]."}),
    )
    with settings(llm):
        body = post(staff, kind="loop", max_iterations=4)
    assert text_of(body, "answer") == "Two years [1]."
    assert text_of(body, "loop-summary").startswith("Stopped by answer after 3 turn(s)")
    trace = text_of(body, "tool-calls")
    assert "search query=X200 warranty; limit=2" in trace and "answer text=Two years [1]." in trace
    assert "nope" in trace
    assert "<script>alert(1)" not in body and "&lt;script&gt;alert(1)" in body  # escaped
    assert body.count('class="case-failed"') == 1  # the unknown collection: an error result
    assert 'class="kept" data-chunk=' in body
    assert "agent.loop" in body and "agent.loop.tool" in body
    assert llm.calls[0]["tools"] == ["search", "answer", "give_up"]


def test_single_ask_without_javascript_shows_chunks_usage_and_timeline(staff, corpus):
    with settings(ScriptedLLM(default="Two years [1].")):
        body = post(staff, kind="ask", steps=["rerank"])  # steps are ignored for a single ask
    assert text_of(body, "answer") == "Two years [1]."
    assert "step-rerank" not in body and 'id="chunks"' in body
    assert re.search(r'<span style="padding-left: 0px">ask</span>', body)
    assert re.search(r'<span style="padding-left: 12px">search</span>', body)  # nested in ask


def test_the_form_offers_kinds_grouped_steps_and_toggles(staff):
    body = staff.get(url("ask")).content.decode()
    for kind in ["ask", "pipeline", "loop"]:
        assert f'name="kind" value="{kind}"' in body
    assert 'data-steps="all"' in body and 'data-steps="none"' in body
    assert body.count('class="step-group"') == 3
    # Every optional step of the registry, by phase; search and answer always run.
    boxes = re.findall(r'name="steps" value="(\w+)"', body)
    assert boxes == [
        "gate", "rewrite", "select", "expand", "decompose", "reason", "rerank", "self_correct",
        "ground",
    ]  # fmt: skip
    assert 'title="Decide whether the question needs retrieval' in body
    assert 'name="max_iterations"' in body
    assert 'name="graph"' not in body  # no collection has a graph: no graph toggle


@dataclass
class Span:
    start: int
    end: int
    text: str
    verdict: str
    chunk_ids: list = field(default_factory=list)
    score: float | None = None


@dataclass
class Grounding:
    score: float
    spans: list
    grounder: str = "test"
    warnings: list = field(default_factory=list)


def test_grounded_segments_cover_the_answer_once():
    text = "Two years. Made on Mars. Blue."
    grounding = Grounding(
        0.5,
        [
            Span(11, 24, "Made on Mars.", "contradicted", [3], 0.1),
            Span(0, 10, "Two years.", "supported", [1, 2], 0.9),
            Span(5, 10, "overlap", "supported"),  # inside an earlier span: left out
            Span(20, 26, "Mars. B", "supported"),  # clipped to what is left
            Span(40, 50, "out of range", "supported"),
            Span(25, 30, "Blue.", "made-up verdict"),
        ],
    )
    segments = views.grounded_segments(text, grounding)
    assert "".join(s["text"] for s in segments) == text
    assert [(s["text"], s["verdict"]) for s in segments] == [
        ("Two years.", "supported"),
        (" ", None),
        ("Made on Mars.", "contradicted"),
        (" B", "supported"),
        ("lue.", "unsupported"),
    ]
    assert segments[0]["chunk_ids"] == [1, 2]
    assert views.grounded_segments(text, None) == [{"text": text, "verdict": None}]


def test_grounding_highlights_render_in_the_answer(staff, corpus, monkeypatch):
    real_ask = views.ask

    def grounded_ask(*args, **kwargs):
        answer = real_ask(*args, **kwargs)
        answer.grounding = Grounding(
            0.5,
            [
                Span(0, 10, "Two years.", "supported", [7], 0.93),
                Span(11, 19, "<b>!</b>", "contradicted"),
            ],
            grounder="judge",
            warnings=["one claim could not be parsed"],
        )
        drill = SimpleNamespace(name="X200", type="product", description="")
        maker = SimpleNamespace(name="Acme", type="company", description="")
        answer.graph = {
            "entities": [drill, maker],
            "relationships": [SimpleNamespace(source=maker, type="MAKES", target=drill)],
            "summaries": ["Acme makes <drills>."],
        }
        return answer

    monkeypatch.setattr(views, "ask", grounded_ask)
    with settings(ScriptedLLM(default="Two years. <b>!</b> [1]")):
        body = post(staff, kind="ask")
    assert (
        '<mark class="grounded supported" data-verdict="supported" '
        'title="supported (0.93); chunks 7">Two years.</mark>'
    ) in body
    assert (
        '<mark class="grounded contradicted" data-verdict="contradicted" title="contradicted">&lt;b&gt;!&lt;/b&gt;</mark>'
        in body
    )
    assert "<b>!</b>" not in body  # the answer is escaped, highlighted or not
    assert "Grounding (judge): score 0.50" in text_of(body, "grounding")
    assert "one claim could not be parsed" in body
    # The graph context given to the LLM is shown, escaped.
    graph = text_of(body, "graph-given", end="div")
    assert "X200 (product)" in graph and "Acme —MAKES→ X200" in graph
    assert "Acme makes &lt;drills&gt;." in graph


def all_supported(text, chunks):
    return [GroundedSpan(0, len(text), text, "supported", [chunks[0].chunk_id])]


def test_the_ground_step_runs_with_the_configured_grounder(staff, corpus):
    llm = ScriptedLLM(rules={ANSWER: "Two years [1]."})
    with settings(llm, GROUNDER="tests.test_dashboard_ask.all_supported"):
        body = post(staff, kind="pipeline", steps=["ground"])
    assert '<mark class="grounded supported"' in body and "→ ground" in text_of(body, "steps-run")
    assert step_text(body, "ground") == "Grounding: score 1.00 (all_supported)"


# --- scoping -------------------------------------------------------------------------------------


def test_every_mode_stays_inside_the_users_collections(staff, corpus):
    scoped = {"DASHBOARD": {"COLLECTIONS": "tests.test_dashboard_ask.only_hr"}}
    # The pipeline: select is offered the user's collections only; naming another is ignored.
    llm = ScriptedLLM(
        rules={SELECT: '{"collections": ["products"]}', ANSWER: "Leave is 25 days [1]."}
    )
    with settings(llm, **scoped):
        body = post(staff, kind="pipeline", steps=["select"], question="drill leave warranty")
    select_prompt = next(c["prompt"] for c in llm.calls if SELECT in c["prompt"])
    assert "products" not in select_prompt and "hr" in select_prompt
    assert step_text(body, "select") == "Chose: hr Offered: hr"
    assert "X200" not in body and "watt" not in body
    # The loop: a search naming another collection searches the user's one, with a note.
    llm = ScriptedLLM(
        ("search", {"query": "drill warranty", "collection": "products"}),
        ("search", {"query": "drill warranty"}),
        ("answer", {"text": "Nothing about drills."}),
    )
    with settings(llm, **scoped):
        body = post(staff, kind="loop", question="drill warranty")
    assert "the only collection you may search" in text_of(body, "tool-calls")
    assert "X200" not in body and "watt" not in body
    assert "products" not in json.dumps(llm.calls[0]["messages"][0])
    # A collection outside the scope is not even a choice.
    with settings(ScriptedLLM(default="x"), **scoped):
        body = post(staff, kind="loop", collection="products")
    assert "Select a valid choice" in body


def test_a_user_with_no_collection_gets_a_message(staff, corpus):
    llm = ScriptedLLM(default="should not be called")
    with settings(llm, DASHBOARD={"COLLECTIONS": "tests.test_dashboard_ask.nothing"}):
        for kind in ["ask", "pipeline", "loop"]:
            body = post(staff, kind=kind, steps=["gate"])
            assert "You may not see any collection" in body
        stream = staff.post(url("ask_stream"), {"question": "x", "mode": "fulltext", "limit": 3})
    assert stream.status_code == 400 and b"You may not see any collection" in stream.content
    assert llm.calls == []


# --- the telemetry capture -----------------------------------------------------------------------


def test_capture_spans_keeps_only_its_own_context():
    done = threading.Event()

    def other_request():
        with span("other.thread"):
            done.wait(5)

    thread = threading.Thread(target=other_request)
    with capture_spans() as spans:
        thread.start()
        with span("outer", n=1) as outer:
            with span("inner"):
                pass
            outer.set(result="ok")
        with pytest.raises(ValueError), span("broken"):
            raise ValueError("x")
        done.set()
        thread.join()
    with span("after"):
        pass
    assert [s["event"] for s in spans] == ["outer", "inner", "broken"]
    outer, inner, broken = spans
    assert inner["parent_id"] == outer["span_id"] and outer["metadata"]["result"] == "ok"
    assert broken["status"] == "failed" and broken["error"] == "ValueError"
    rows = timeline(spans)["rows"]
    assert [r["depth"] for r in rows] == [0, 1, 0]
    assert all(0 <= r["left"] <= 100 and 0 < r["width"] <= 100 for r in rows)
    assert timeline([]) == {"total": 0.0, "rows": []}


def submit_button(body: str) -> str:
    match = re.search(r'<button type="submit"[^>]*>Ask</button>', body)
    assert match, "no Ask button on the page"
    return match.group(0)


def test_ask_and_info_say_when_no_llm_is_configured(staff):
    with override_settings(DJANGO_RAG={"EMBEDDER": "hashing"}):
        ask_page = staff.get(url("ask")).content.decode()
        info_page = staff.get(url("info")).content.decode()
    notice = html.unescape(text_of(ask_page, "llm-status", end="div"))
    assert "No LLM is configured" in notice and "DJANGO_RAG['LLM']" in notice
    assert "openai/gpt-4o-mini" in notice  # what to set
    assert "disabled" in submit_button(ask_page)
    assert "not configured" in text_of(info_page, "llm-status", end="p")


def test_ask_and_info_say_when_the_llm_cannot_be_built(staff):
    with override_settings(DJANGO_RAG={"EMBEDDER": "hashing", "LLM": "no_such_pkg.llms.Chat"}):
        ask_page = staff.get(url("ask")).content.decode()
        info_page = staff.get(url("info")).content.decode()
    assert "cannot be built" in text_of(ask_page, "llm-status", end="div")
    assert "disabled" in submit_button(ask_page)
    assert "not configured" in text_of(info_page, "llm-status", end="p")


def test_info_names_the_configured_llm_with_its_secret_redacted(staff):
    secret = "sk-dashboard-secret-0123456789"
    llm = {"model": "openai/gpt-4o-mini", "api_key": secret}
    with override_settings(DJANGO_RAG={"EMBEDDER": "hashing", "LLM": llm}):
        ask_page = staff.get(url("ask")).content.decode()
        info_page = staff.get(url("info")).content.decode()
    assert 'id="llm-status"' not in ask_page
    assert "disabled" not in submit_button(ask_page)
    assert text_of(info_page, "llm-status", end="p") == "LLM: LiteLLM openai/gpt-4o-mini"
    assert secret not in info_page and secret not in ask_page
