"""A type checker catches a misspelled search option before run time: mypy (the test extra)
on the README's calls (tests/typecheck/calls.py, as scripts/test.sh runs it) and on a call
with a misspelled option, which must be reported by name."""

from pathlib import Path

import pytest

api = pytest.importorskip("mypy.api", reason="mypy is in the test extra")

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ["--config-file", str(ROOT / "pyproject.toml"), "--cache-dir", str(ROOT / ".mypy_cache")]


def mypy(*args: str) -> tuple[str, int]:
    stdout, stderr, status = api.run([*CONFIG, *args])
    return stdout + stderr, status


def test_the_readme_calls_type_check():
    output, status = mypy(str(ROOT / "tests" / "typecheck" / "calls.py"))
    assert status == 0, output


def test_a_misspelled_option_is_a_type_error_naming_it(tmp_path):
    calls = tmp_path / "misspelled.py"
    calls.write_text(
        "import django_rag as rag\n"
        "rag.search('refunds', mode='hybrid', limt=3)\n"
        "rag.ask('Refunds?', keyword_score_flor=0.1)\n"
        "rag.search('refunds', limit='3')\n"
    )
    output, status = mypy(str(calls))
    assert status == 1, output
    assert 'Unexpected keyword argument "limt" for "search"; did you mean "limit"?' in output
    assert 'Unexpected keyword argument "keyword_score_flor" for "ask"' in output
    assert 'Argument "limit" to "search" has incompatible type "str"' in output
