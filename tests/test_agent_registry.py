"""The agent's steps are one registry: a step registered anywhere (here, in a test, with its
own prompt and a scripted LLM) becomes an ``Agent`` chain method, an Ask page checkbox and a
row of the pipeline's trace, with no change to the agent or dashboard code."""

import inspect
import re

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from django_rag.agent import Agent, steps
from django_rag.agent.context import Context
from django_rag.agent.step_base import step, step_llm
from django_rag.dashboard import forms
from django_rag.dashboard.views import asking
from django_rag.evaluation.runs import resolve_retriever
from django_rag.exceptions import InvalidOption
from django_rag.llm import get_llm
from django_rag.testing import ScriptedLLM
from tests.helpers import ANSWER, ingest_agent_corpus, url

pytestmark = pytest.mark.django_db

SUMMARISE = "List the facts these sources state"


def summarise_prompt(question: str, texts: list[str], max_facts: int) -> str:
    """The test step's own prompt."""
    sources = "\n".join(f"- {text}" for text in texts)
    return f"{SUMMARISE}, at most {max_facts}, one per line.\nQuestion: {question}\n{sources}"


@pytest.fixture
def summarise():
    """The step a CONTRIBUTING.md recipe adds: 'summarise' lists the facts in the chunks found
    (``ctx.facts``), after the search; removed from the registry when the test ends."""

    @step("summarise", phase="results", label="Summarise", produces={"facts": "Facts"})
    def run(ctx: Context, *, max_facts: int = 3, llm=None) -> None:
        """List the facts the retrieved chunks state (``facts``), at most ``max_facts``."""
        if ctx.skip_retrieval:
            return
        model = get_llm(step_llm(ctx, llm), feature="The summarise step")
        reply = model.complete(
            summarise_prompt(ctx.question, [c.text for c in ctx.chunks], max_facts)
        )
        facts = [line.strip("- ").strip() for line in reply.text.splitlines() if line.strip()]
        ctx.facts = facts[:max_facts]

    yield run
    steps.STEPS.remove("summarise")


@pytest.fixture
def corpus():
    ingest_agent_corpus()


def scripted():
    return ScriptedLLM(
        rules={
            SUMMARISE: "- The X200 has a 1200 watt motor.\n- <b>Two</b> year warranty.\n- Extra",
            ANSWER: "Two years [1].",
        }
    )


def test_a_registered_step_is_an_agent_method(summarise, corpus):
    assert "summarise" in steps.STEPS and Agent.summarise.__doc__.startswith("List the facts")
    parameters = inspect.signature(Agent.summarise).parameters
    assert list(parameters) == ["self", "max_facts", "llm"]
    assert parameters["max_facts"].default == 3
    llm = scripted()
    agent = Agent("What warranty does the X200 have?", llm=llm, collection="products")
    assert agent.search().summarise(max_facts=2).answer() is agent
    assert agent.context.error is None and agent.context.answer == "Two years [1]."
    assert agent.facts == ["The X200 has a 1200 watt motor.", "<b>Two</b> year warranty."]
    assert agent.usage.calls == 2  # the step's LLM call is counted like any step's
    assert "X200" in next(c["prompt"] for c in llm.calls if SUMMARISE in c["prompt"])
    # An evaluation's agent configuration takes it too.
    assert resolve_retriever(["search", "summarise", "answer"])[0] == "agent"


def test_a_registered_step_is_on_the_ask_page_and_in_its_trace(summarise, corpus, staff):
    with override_settings(DJANGO_RAG={"EMBEDDER": "hashing", "LLM": scripted()}):
        page = staff.get(url("ask")).content.decode()
        group = re.search(r"<strong>After the search</strong>(.*?)</div>", page, re.S).group(1)
        assert re.findall(r'value="(\w+)"', group) == ["reason", "rerank", "summarise"]
        assert 'title="List the facts the retrieved chunks state' in group
        body = staff.post(
            url("ask"),
            {"question": "What warranty does the X200 have?", "kind": "pipeline",
             "steps": ["summarise"], "mode": "fulltext", "limit": 3},
        ).content.decode()  # fmt: skip
    assert "Steps: search → summarise → answer" in body
    row = re.search(r'id="step-summarise">(.*?)</dd>', body, re.S).group(1)
    text = " ".join(re.sub(r"<[^>]+>", " ", row).split())
    assert (
        text == "Facts: The X200 has a 1200 watt motor. &lt;b&gt;Two&lt;/b&gt; year warranty. Extra"
    )
    assert "<b>Two</b>" not in body  # the LLM's text is escaped


def test_a_registered_step_is_a_rag_ask_flag(summarise, corpus):
    from io import StringIO

    from django.core.management import call_command

    llm = scripted()
    out = StringIO()
    with override_settings(DJANGO_RAG={"EMBEDDER": "hashing", "LLM": llm}):
        call_command(
            "rag_ask", "What warranty does the X200 have?", "--summarise", "--mode", "fulltext",
            "--collection", "products", stdout=out,
        )  # fmt: skip
    assert out.getvalue().startswith("Two years [1].")
    # summarise ran, before the answer
    assert SUMMARISE in llm.calls[0]["prompt"] and ANSWER in llm.calls[1]["system"]


def test_an_unregistered_step_is_gone_everywhere(summarise):
    steps.STEPS.remove("summarise")
    assert not hasattr(Agent, "summarise")
    assert "summarise" not in [name for _, c in forms.pipeline_choices() for name, *_ in c]
    from django_rag.management.commands.rag_ask import pipeline_flags

    assert "--summarise" not in [flag for _, flag, _ in pipeline_flags()]
    with pytest.raises(InvalidOption, match="unknown agent step 'summarise'"):
        resolve_retriever(["search", "summarise"])


def test_a_step_may_not_hide_an_agent_attribute_or_take_a_name_twice():
    with pytest.raises(ImproperlyConfigured, match="would hide Agent.result"):
        step("result", phase="answer")(lambda ctx: None)
    assert "result" not in steps.STEPS and isinstance(Agent.__dict__["result"], property)
    with pytest.raises(ImproperlyConfigured, match="already registered"):
        step("rerank", phase="results")(lambda ctx: None)
    assert steps.STEPS["rerank"].run is steps.rerank
    with pytest.raises(ImproperlyConfigured, match="phase must be one of"):
        step("later", phase="afterwards")
    with pytest.raises(ImproperlyConfigured, match="public identifier"):
        step("_hidden", phase="query")


def test_one_registry_of_steps():
    """The step names live in the registry only: the Agent's methods are made from it and
    the dashboard's lists of steps are gone."""
    names = [spec.name for spec in steps.STEPS.in_order()]
    assert names == [
        "gate", "rewrite", "select", "expand", "decompose", "search", "reason", "rerank",
        "answer", "ground", "global_answer",
    ]  # fmt: skip
    for name in names:
        assert getattr(Agent, name).agent_step == name
        assert getattr(Agent, name).__doc__ == steps.STEPS[name].doc != ""
    assert forms.STEPS is asking.STEPS is steps.STEPS  # the registry itself, not a copy
    assert not hasattr(forms, "STEP_GROUPS") and not hasattr(asking, "STEP_ORDER")
    assert "hasattr(Agent" not in inspect.getsource(asking) + inspect.getsource(forms)


# --- the Loop: one class holding its run's state -----------------------------------------------


def test_agent_modules_share_no_private_names_and_no_type_checking_imports():
    import ast
    from pathlib import Path

    import django_rag.agent

    for path in Path(django_rag.agent.__file__).parent.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                private = [a.name for a in node.names if a.name.startswith("_")]
                assert not private, f"{path.name} imports {private} from {node.module}"
            if isinstance(node, ast.Name):
                assert node.id != "TYPE_CHECKING", f"{path.name} imports under TYPE_CHECKING"


def test_a_loop_run_twice_starts_afresh(corpus):
    from django_rag.agent import Loop

    llm = ScriptedLLM(
        ("search", {"query": "X200 warranty"}),
        ("answer", {"text": "Two years [1]."}),
        ("search", {"query": "X100 motor"}),
        ("answer", {"text": "750 watt [1]."}),
    )
    loop = Loop("Which drill?", llm=llm, collection="products", limit=1)
    first = loop.run()
    second = loop.run()
    assert loop.result is second and first is not second
    assert [c.source_id for c in first.chunks] == ["x200"] and first.text == "Two years [1]."
    # The second run's sources, calls and conversation are its own: source [1] is the X100.
    assert [c.source_id for c in second.chunks] == ["x100"]
    assert [s.arguments for s in second.tool_calls] == [
        {"query": "X100 motor"},
        {"text": "750 watt [1]."},
    ]
    assert second.citations[0].chunk.source_id == "x100"
    assert "X200 warranty" not in str(second.messages)


def test_an_unknown_step_option_raises_invalid_option_naming_it():
    from django_rag.exceptions import InvalidOption

    agent = Agent("What is X?", llm=ScriptedLLM(default="{}"))
    with pytest.raises(
        InvalidOption, match="rerank step got an unknown option 'treshold'.*'threshold'"
    ):
        agent.rerank(treshold=5)
    assert agent.context.error is None  # nothing recorded: the call was refused
