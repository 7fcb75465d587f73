"""The DJANGO_RAG settings schema (django_rag.settings_schema): unknown keys at any level are
refused with the closest known one, values of a wrong type are refused naming the setting,
the defaults come from the schema, and docs/configuration.md lists exactly its keys."""

import ast
import re
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

import django_rag as rag
from django_rag import conf, settings_schema
from django_rag.checks import check_settings
from django_rag.exceptions import ConfigurationError, UnknownSetting

pytestmark = pytest.mark.django_db

DOCS = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"


def test_a_misspelled_nested_key_is_refused_with_the_closest_known_keys(settings):
    settings.DJANGO_RAG = {"EMBEDDER": "hashing", "SEARCH": {"HYRBID_WEIGHTS": (0.5, 0.5)}}
    with pytest.raises(UnknownSetting) as caught:
        rag.search("refunds")
    error = caught.value
    assert isinstance(error, ConfigurationError) and error.code == "unknown_setting"
    assert error.setting == "SEARCH.HYRBID_WEIGHTS"
    assert error.suggestions == ["SEMANTIC_WEIGHT", "FULLTEXT_WEIGHT"]
    assert "did you mean 'SEMANTIC_WEIGHT' or 'FULLTEXT_WEIGHT'?" in str(error)

    settings.DJANGO_RAG = {"GRAPH": {"MIN_MATCH_SCOER": 0.5}}
    with pytest.raises(UnknownSetting, match="did you mean 'MIN_MATCH_SCORE'") as caught:
        conf.get_settings()
    assert caught.value.suggestion == "MIN_MATCH_SCORE"


@pytest.mark.parametrize(
    "section, key, suggestion",
    [
        ("SEARCH", "LIMT", "LIMIT"),
        ("GRAPH", "ENABLE", "ENABLED"),
        ("DASHBOARD", "PERMISSIONS", "PERMISSION"),
        ("JOBS", "THREAD", "THREADS"),
        ("TELEMETRY", "INCLUDE_TEXTS", "INCLUDE_TEXT"),
    ],
)
def test_a_misspelled_nested_key_is_a_system_check_error_with_a_hint(
    settings, section, key, suggestion
):
    settings.DJANGO_RAG = {section: {key: 1}}
    (error,) = check_settings()
    assert error.id == "django_rag.E005" and f"{section}.{key}" in error.msg
    assert error.hint.startswith(f"Did you mean {suggestion!r}")
    with pytest.raises(SystemCheckError, match="django_rag.E005"):
        call_command("check")


def test_an_unknown_top_level_key_names_the_closest_known_one(settings):
    settings.DJANGO_RAG = {"EMBEDER": "hashing"}
    with pytest.raises(UnknownSetting) as caught:
        conf.get_settings()
    assert caught.value.setting == "EMBEDER" and caught.value.suggestion == "EMBEDDER"
    (error,) = check_settings()
    assert error.id == "django_rag.E005" and "Did you mean 'EMBEDDER'" in error.hint
    # Nothing close: the hint lists what is known instead of guessing.
    settings.DJANGO_RAG = {"SEARCH": {"ZZZ": 1}}
    (error,) = check_settings()
    assert "knows MODE, LIMIT" in error.hint


def test_a_section_that_is_not_a_dict_is_refused(settings):
    settings.DJANGO_RAG = {"SEARCH": 10}
    with pytest.raises(ConfigurationError, match="'SEARCH'.*must be a dict"):
        conf.get_settings()


@pytest.mark.parametrize(
    "config, setting",
    [
        ({"SEARCH": {"LIMIT": "10"}}, "SEARCH.LIMIT"),
        ({"SEARCH": {"LIMIT": True}}, "SEARCH.LIMIT"),
        ({"SEARCH": {"FUSION": "mean"}}, "SEARCH.FUSION"),
        ({"SEARCH": {"MODE": "hybird"}}, "SEARCH.MODE"),
        ({"MAX_QUERY_CHARS": "10000"}, "MAX_QUERY_CHARS"),
        ({"SEARCH": {"DATABASE": 5}}, "SEARCH.DATABASE"),  # E005 only, not also E010
    ],
)
def test_a_value_of_the_wrong_type_is_refused_naming_the_setting(settings, config, setting):
    settings.DJANGO_RAG = {"EMBEDDER": "hashing", **config}
    with pytest.raises(ConfigurationError) as caught:
        rag.search("refunds")
    assert caught.value.setting == setting and not isinstance(caught.value, UnknownSetting)
    (error,) = check_settings()
    assert error.id == "django_rag.E005" and setting in error.msg


def test_a_database_alias_of_the_wrong_type_is_reported_once(settings):
    from django_rag.checks import check_search_database

    settings.DJANGO_RAG = {"SEARCH": {"DATABASE": 5}}
    assert [e.id for e in check_settings() + check_search_database()] == ["django_rag.E005"]


def test_every_type_error_is_reported_at_once(settings):
    settings.DJANGO_RAG = {
        "PRELOAD_MODELS": "yes",
        "TELEMETRY": {"PROMETHEUS": 1},
        "GRAPH": {"SUMMARY_LEVELS": 0},
    }
    errors = check_settings()
    assert [e.id for e in errors] == ["django_rag.E005"] * 3
    assert [e.msg.split("]")[0] for e in errors] == [
        "DJANGO_RAG['GRAPH.SUMMARY_LEVELS'",
        "DJANGO_RAG['PRELOAD_MODELS'",
        "DJANGO_RAG['TELEMETRY.PROMETHEUS'",
    ]


def test_valid_values_of_every_kind_pass(settings):
    settings.DJANGO_RAG = {
        "EMBEDDER": {"BACKEND": "hashing", "OPTIONS": {"dimensions": 384}},
        "LLM": lambda prompt: "ok",
        "PARSE_TIMEOUT": 2.5,
        "MAX_PDF_PAGES": None,
        "LLM_DEADLINE": 30,
        "BACKGROUND": "sync",
        "SEARCH": {"DATABASE": "default", "STATEMENT_TIMEOUT": 5, "SYNTAX": "websearch"},
        "GRAPH": {"EXTRACTOR": None, "SUMMARY_LEVELS": (0, 1), "SEED": None},
        "JOBS": {"HEARTBEAT_SECONDS": 0.5},
        "TELEMETRY": {"LOG_LEVEL": 20},
        "DASHBOARD": {"COLLECTIONS": "tests.test_dashboard.only_a"},
    }
    assert check_settings() == []


def test_defaults_come_from_the_schema():
    # The suite's conftest makes "inline" the BACKGROUND default (through conf.DEFAULTS).
    assert {**conf.DEFAULTS, "BACKGROUND": "auto"} == settings_schema.defaults()
    with override_settings(DJANGO_RAG={}):
        merged = conf.get_settings()
    for setting in settings_schema.SCHEMA:
        if setting.is_section:
            assert merged[setting.name] == {k.name: k.default for k in setting.keys}
        elif setting.name != "BACKGROUND":  # the suite's conftest makes "inline" the default
            assert merged[setting.name] == setting.default
        setting.check(setting.default_value(), setting.name)  # every default is valid
    for setting in [*settings_schema.SCHEMA, *(k for s in settings_schema.SCHEMA for k in s.keys)]:
        assert setting.doc.endswith(".") and "\n" not in setting.doc, setting.name


def test_the_schema_choices_are_the_values_the_library_accepts():
    from django_rag.models.fulltext import SYNTAXES
    from django_rag.modes import SearchMode
    from django_rag.retrieval.fusion import FUSIONS

    assert set(settings_schema.lookup("SEARCH.FUSION").choices) == set(FUSIONS)
    assert set(settings_schema.lookup("SEARCH.SYNTAX").choices) == set(SYNTAXES)
    for mode in settings_schema.lookup("SEARCH.MODE").choices:
        SearchMode.parse(mode)  # each accepted value is a mode search() accepts
    assert {SearchMode.parse(m) for m in settings_schema.lookup("SEARCH.MODE").choices} == set(
        SearchMode
    )
    assert conf.FULLTEXT_BACKENDS == ("auto", "sql", "pg_textsearch")
    assert set(settings_schema.lookup("BACKGROUND").choices) == {*conf.BACKGROUND_MODES, "sync"}


# --- docs/configuration.md ---------------------------------------------------------------------

_SECTION_INTRO = re.compile(r"^`([A-Z_]+)` keys\b")


def _literal(text: str):
    """A documented default: a Python literal, with * and + allowed (``16 * 1024 * 1024``)."""
    tree = ast.parse(text, mode="eval")
    allowed = (ast.Expression, ast.Constant, ast.List, ast.Tuple, ast.Dict, ast.BinOp, ast.Load)
    allowed += (ast.Mult, ast.Add, ast.UnaryOp, ast.USub)
    for node in ast.walk(tree):
        assert isinstance(node, allowed), f"{text!r} is not a plain value"
    return eval(compile(tree, "<docs>", "eval"), {"__builtins__": {}})


def documented_tables() -> dict[str, dict[str, object]]:
    """{"": top-level keys, "SEARCH": its keys, ...} -> {key: documented default}; a section
    row's default (``see below``) is the string itself."""
    tables: dict[str, dict[str, object]] = {}
    current = ""  # the first table of the page is the top-level one
    in_table = False
    for line in DOCS.read_text().split("\n## ")[0].splitlines():
        intro = _SECTION_INTRO.match(line)
        if intro:
            current = intro.group(1)
            continue
        if not line.startswith("|"):
            in_table = False
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] in ("key", "---") or set(cells[0]) <= {"-"}:
            in_table = True
            continue
        assert in_table
        names = re.findall(r"`([A-Z0-9_]+)`", cells[0])
        assert names, line
        default = cells[1].replace("`", "")
        if default.startswith("see "):
            values = [default] * len(names)
        else:
            values = list(_literal(f"({default},)"))
        assert len(values) == len(names), line
        table = tables.setdefault(current, {})
        for name, value in zip(names, values, strict=True):
            assert name not in table, f"{name} documented twice"
            table[name] = value
    return tables


def test_docs_configuration_lists_exactly_the_schema_keys_and_defaults():
    tables = documented_tables()
    expected = {"": [s.name for s in settings_schema.SCHEMA]}
    expected.update(
        {s.name: [k.name for k in s.keys] for s in settings_schema.SCHEMA if s.is_section}
    )
    assert {t: sorted(keys) for t, keys in tables.items()} == {
        t: sorted(keys) for t, keys in expected.items()
    }
    for table, keys in tables.items():
        for name, documented in keys.items():
            path = f"{table}.{name}" if table else name
            setting = settings_schema.lookup(path)
            if setting.is_section:
                assert documented == "see below", path
            else:
                assert documented == setting.default, f"{path}: docs say {documented!r}"
