"""The public API of ``django_rag``: lazy at run time, typed for type checkers, and the answer
layer's old import paths still working."""

import ast
import importlib
import inspect
import subprocess
import sys
import warnings

import pytest

import django_rag as rag
from django_rag import agent, answers
from django_rag.agent import prompts as agent_prompts
from django_rag.answers import grounding, service
from django_rag.answers import prompts as answer_prompts


def type_checking_imports() -> dict[str, str]:
    """``name -> module`` of the imports under ``if TYPE_CHECKING:`` in django_rag/__init__.py,
    read from its source (what a type checker reads), each checked to be a re-export
    (``import X as X``)."""
    tree = ast.parse(inspect.getsource(rag))
    blocks = [
        node
        for node in tree.body
        if isinstance(node, ast.If)
        and isinstance(node.test, ast.Name)
        and node.test.id == "TYPE_CHECKING"
    ]
    assert len(blocks) == 1, "django_rag/__init__.py needs one `if TYPE_CHECKING:` block"
    names: dict[str, str] = {}
    for node in blocks[0].body:
        assert isinstance(node, ast.ImportFrom), ast.dump(node)
        for alias in node.names:
            # "import X as X" is what marks a re-export for mypy and pyright.
            assert alias.asname == alias.name, f"write `import {alias.name} as {alias.name}`"
            assert alias.name not in names, f"{alias.name} imported twice"
            names[alias.name] = node.module
    return names


def test_type_checking_imports_name_every_export_from_its_lazy_module():
    assert type_checking_imports() == rag._EXPORTS
    assert rag.__all__ == sorted(rag._EXPORTS)


@pytest.mark.parametrize("name", rag.__all__)
def test_every_public_name_resolves_to_the_object_the_type_checking_block_names(name):
    module = type_checking_imports()[name]
    assert getattr(rag, name) is getattr(importlib.import_module(module), name)


def test_public_names_are_imported_lazily():
    # A fresh interpreter without Django set up: importing django_rag imports none of them.
    code = (
        "import sys, django_rag\n"
        "eager = sorted(n for n in django_rag.__all__ if n in vars(django_rag))\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('django_rag.'))\n"
        "print(eager, loaded)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == "[] []"


def test_an_unknown_name_raises_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'serch'"):
        rag.serch  # noqa: B018


# --- the answer layer ---------------------------------------------------------------------------


def test_ask_and_grounding_live_in_the_answer_layer():
    assert rag.ask is answers.ask is service.ask
    assert rag.Grounder is answers.Grounder is grounding.Grounder
    assert inspect.getmodule(service.ask) is service
    assert inspect.getmodule(grounding.ground_answer) is grounding
    assert inspect.getmodule(answer_prompts.answer_messages) is answer_prompts


def test_the_agent_still_exports_what_it_exported():
    for name in [
        "Answer",
        "AnswerStream",
        "Citation",
        "ask",
        "parse_citations",
        "Grounder",
        "LLMGrounder",
        "CrossEncoderGrounder",
        "EmbeddingGrounder",
        "get_grounder",
        "ground_answer",
    ]:
        assert getattr(agent, name) is getattr(answers, name), name
        assert name in agent.__all__


@pytest.mark.parametrize(
    "old, new", [("django_rag.agent.answer", service), ("django_rag.agent.grounding", grounding)]
)
def test_deprecated_module_paths_are_the_moved_modules(old, new, monkeypatch):
    # Imported afresh, the old path warns once and gives the moved module itself, so private
    # names and monkeypatches through the old path keep working.
    monkeypatch.delitem(sys.modules, old, raising=False)
    monkeypatch.delattr(agent, old.rsplit(".", 1)[1], raising=False)
    with pytest.warns(DeprecationWarning, match=f"{old} is deprecated"):
        module = importlib.import_module(old)
    assert module is new
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert importlib.import_module(old) is new  # cached: no second warning
    monkeypatch.setattr(f"{old}.get_grounder", "patched")
    assert new.get_grounder == "patched"


def test_agent_prompts_reexport_the_answer_prompts():
    for name in [
        "ANSWER_SYSTEM",
        "DATA_NOTICE",
        "GENERAL_SYSTEM",
        "NO_RESULTS_SYSTEM",
        "answer_messages",
        "correction_messages",
        "graph_block",
        "groundedness_prompt",
        "sources_block",
    ]:
        assert getattr(agent_prompts, name) is getattr(answer_prompts, name), name


def test_grounder_aliases_name_the_answer_layer():
    assert isinstance(grounding.get_grounder("llm", llm=lambda prompt: ""), grounding.LLMGrounder)
    for path in grounding.ALIASES.values():
        assert path.startswith("django_rag.answers.grounding."), path


def test_no_component_alias_points_up_the_layers():
    """Each alias table names classes of its own layer (the fakes live beside the components
    they fake, re-exported by django_rag.testing); the retrieval layer registers its memory
    store (the one with ingest) over the store layer's alias at app start."""
    from django_rag import embeddings, llm, testing
    from django_rag.embeddings.hashing import HashingEmbedder
    from django_rag.llm.scripted import ScriptedLLM
    from django_rag.retrieval.stores import MemoryVectorStore
    from django_rag.store import vector_stores

    for table, home in (
        (embeddings.ALIASES, "django_rag.embeddings."),
        (llm.ALIASES, "django_rag.llm."),
    ):
        assert all(path.startswith(home) for path in table.values()), table
    assert vector_stores.ALIASES["pgvector"].startswith("django_rag.store.")
    assert testing.HashingEmbedder is HashingEmbedder and testing.ScriptedLLM is ScriptedLLM
    assert isinstance(embeddings.build_embedder("hashing"), HashingEmbedder)
    assert isinstance(llm.get_llm("scripted"), ScriptedLLM)
    assert type(vector_stores.get_vector_store("memory")) is MemoryVectorStore


def _public_calls():
    """Every public function, and the classes a user calls with options (Agent, Loop)."""
    for name in rag.__all__:
        obj = getattr(rag, name)
        if inspect.isclass(obj):
            if name in ("Agent", "Loop"):
                yield name, obj
        elif callable(obj):
            yield name, obj


@pytest.mark.django_db
@pytest.mark.parametrize(
    "name,call", list(_public_calls()), ids=lambda v: v if isinstance(v, str) else ""
)
def test_an_unknown_option_on_any_public_call_raises_invalid_option(name, call):
    """Arcana's rule, issue 37: a misspelled option is an InvalidOption naming it, never
    Python's TypeError, and it is refused before any work."""
    from django_rag.exceptions import InvalidOption
    from django_rag.models import Collection, Document

    parameters = inspect.signature(call).parameters.values()
    positional = [
        "x" for p in parameters if p.kind is p.POSITIONAL_OR_KEYWORD and p.default is p.empty
    ]
    required = {
        p.name: "x" for p in parameters if p.kind is p.KEYWORD_ONLY and p.default is p.empty
    }
    with pytest.raises(InvalidOption, match="bogus_option"):
        call(*positional, **required, bogus_option=1)
    assert not Document.objects.exists() and not Collection.objects.exists()
