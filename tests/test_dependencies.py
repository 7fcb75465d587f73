"""An optional dependency that is missing and one that is installed but cannot be imported get
different errors: the second names the module whose import failed and the real ImportError
(an old pip, skipping jusText's ``lxml[html_clean]``, left trafilatura importing nothing)."""

import json
import os
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest

from django_rag.exceptions import BrokenDependency, MissingDependency
from django_rag.ingestion.parsers.common import require

ROOT = Path(__file__).resolve().parent.parent


def test_a_package_that_is_not_installed_is_named_with_its_extra():
    with pytest.raises(MissingDependency) as caught:
        require("rag_no_such_module", "docx", "Reading Word (.docx) files", distribution="rag-nope")
    error = caught.value
    assert not isinstance(error, BrokenDependency)
    assert error.code == "missing_dependency"
    assert str(error) == (
        "Reading Word (.docx) files needs the 'rag-nope' package, which is not installed. "
        "Install it with: pip install 'django-rag[docx]'"
    )


@pytest.fixture
def broken_package(tmp_path, monkeypatch):
    """An installed distribution (with its metadata) whose import fails one module down, on a
    module nothing provides: what a package looks like when pip skipped one of its needs."""
    package = tmp_path / "ragbroken_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("from . import inner\n")
    (package / "inner.py").write_text("import rag_never_installed_module\n")
    info = tmp_path / "ragbroken_pkg-1.2.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ragbroken-pkg\nVersion: 1.2.3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "ragbroken_pkg"
    for name in [n for n in sys.modules if n.startswith("ragbroken_pkg")]:
        del sys.modules[name]


def test_an_installed_package_that_fails_to_import_names_the_failing_module(broken_package):
    with pytest.raises(BrokenDependency) as caught:
        require(broken_package, "html", "Reading HTML", distribution="ragbroken-pkg")
    error = caught.value
    assert isinstance(error, MissingDependency)  # existing `except MissingDependency` still hold
    assert error.code == "broken_dependency"
    assert error.module == "ragbroken_pkg.inner"
    assert error.error == "ModuleNotFoundError: No module named 'rag_never_installed_module'"
    message = str(error)
    assert "which is installed (1.2.3) but cannot be imported" in message
    assert "importing ragbroken_pkg.inner failed with ModuleNotFoundError: No module named " in (
        message
    )
    assert "pip install 'django-rag[html]'" in message
    assert "not installed" not in message


@pytest.mark.skipif(find_spec("trafilatura") is None, reason="the html extra is not installed")
def test_trafilatura_without_lxml_html_clean_is_reported_as_broken_not_missing():
    """The real case, in a fresh interpreter: lxml_html_clean absent, as the pip a Python 3.11
    venv ships leaves it."""
    script = (
        "import json, sys\n"
        "sys.modules['lxml_html_clean'] = None\n"
        "from django_rag.ingestion.parsers.common import require\n"
        "try:\n"
        "    require('trafilatura', 'html', 'Reading HTML')\n"
        "except Exception as exc:\n"
        "    print(json.dumps({'class': type(exc).__name__, 'message': str(exc),\n"
        "                      'module': getattr(exc, 'module', None)}))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["class"] == "BrokenDependency"
    assert found["module"] == "lxml.html.clean"
    assert "'trafilatura' package, which is installed" in found["message"]
    assert "lxml_html_clean" in found["message"]  # lxml's own advice, quoted
    assert "pip install 'django-rag[html]'" in found["message"]


def test_every_extra_names_the_packages_its_parsers_import():
    """The extras a parser names in require() list the packages its imports need directly."""
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]

    def names(extra):
        return {r.split(">")[0].split("<")[0].split("[")[0].strip().lower() for r in extras[extra]}

    assert {"trafilatura", "lxml_html_clean"} <= names("html")
    assert "python-docx" in names("docx")
    assert "python-pptx" in names("pptx")
    assert "openpyxl" in names("xlsx")
    assert "pymupdf" in names("pdf")
    assert "pillow" in names("ocr")
    assert "psutil" in names("embedded")
