"""docs/getting-started.md runs as written: its shell code against the test database (with the
hashing embedder of tests/settings.py), its settings blocks in a fresh startproject settings
module. tests/test_dashboard_browser.py goes further: a brand-new project configured from these
blocks, served and browsed through the login."""

import contextlib
import io
import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parent.parent / "docs" / "getting-started.md"
LOCAL_MODEL = "# shell, with a local model server running"


def python_blocks() -> list[str]:
    """Every ```python block of the page, dedented (some sit in a numbered list)."""
    import textwrap

    return [
        textwrap.dedent(block)
        for block in re.findall(r"^[ \t]*```python\n(.*?)^[ \t]*```", DOC.read_text(), re.M | re.S)
    ]


def blocks_for(target: str) -> list[str]:
    """The blocks for ``settings.py`` or ``urls.py`` (their first line names the file), or the
    shell's (no such line). A block whose first line names another file, or a fragment of one
    (``# mysite/asgi.py, at the end``, ``# settings.py: in TEMPLATES[0] ...``), is neither:
    the browser test applies those to its project."""
    out = []
    for block in python_blocks():
        first = block.splitlines()[0].strip()
        if first == LOCAL_MODEL:
            continue  # needs a model server: test_answers_from_a_local_server_as_written
        names_a_file = re.match(r"# [\w./]+\.py\b", first) is not None
        if (target == "shell" and not names_a_file) or first == f"# {target}":
            out.append(block)
    return out


def test_the_page_has_settings_urls_and_shell_blocks():
    assert len(blocks_for("settings.py")) >= 4
    assert len(blocks_for("urls.py")) >= 1
    assert blocks_for("shell")


@pytest.mark.django_db
def test_the_shell_blocks_run_as_pasted(tmp_path, monkeypatch):
    from django_rag.models import Document

    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for block in blocks_for("shell"):
            exec(compile(block, str(DOC), "exec"), namespace)
    printed = out.getvalue()
    assert "refund-policy" in printed or "Refunds go back" in printed  # the search's hits
    assert Document.objects.filter(source_id="refund-policy", collection__name="handbook").exists()
    assert Document.objects.filter(original_filename="shipping.md").exists()
    assert namespace["note"].original_filename == "returns.txt"
    assert not Document.objects.filter(original_filename="returns.txt").exists()  # deleted


def test_the_settings_blocks_apply_to_a_new_project(tmp_path, monkeypatch):
    """The blocks appended to startproject's settings.py give the settings the app needs (the
    database call is replaced: the browser test starts a real embedded server)."""
    from django.core.management import call_command

    call_command("startproject", "mysite", str(tmp_path))
    settings_py = tmp_path / "mysite" / "settings.py"
    namespace: dict = {"__file__": str(settings_py)}
    exec(compile(settings_py.read_text(), str(settings_py), "exec"), namespace)
    import django_rag.embedded

    monkeypatch.setattr(
        django_rag.embedded, "database_settings", lambda path: {"EMBEDDED": str(path)}
    )
    for block in blocks_for("settings.py"):
        exec(compile(block, str(DOC), "exec"), namespace)
    apps = namespace["INSTALLED_APPS"]
    for app in ("django.contrib.postgres", "django_rag", "django_htmx", "django.contrib.admin"):
        assert app in apps
    assert "django_htmx.middleware.HtmxMiddleware" in namespace["MIDDLEWARE"]
    assert namespace["DATABASES"]["default"] == {"EMBEDDED": str(tmp_path / ".pgdata")}
    assert namespace["LOGIN_URL"] == "admin:login"
    assert namespace["DJANGO_RAG"]["LLM"]
    urls_py = tmp_path / "mysite" / "urls.py"
    source = urls_py.read_text() + "\n" + "\n".join(blocks_for("urls.py"))
    compile(source, str(urls_py), "exec")  # valid Python; the browser test serves it
    assert 'include("django_rag.dashboard.urls")' in source


def test_the_install_line_covers_the_next_steps():
    text = DOC.read_text()
    line = re.search(r'pip install "[^"\[]*django[-_]rag\[([^\]]+)\]"', text)
    extras = set(line.group(1).split(","))
    assert {"embedded", "dashboard", "local"} <= extras
    assert ".pgdata/" in text and "python -m django_rag.embedded stop .pgdata" in text


@pytest.mark.django_db
def test_answers_from_a_local_server_as_written(stub_llm_server):
    """ "Answers without an API key": the block as written, its api_base pointed at the tests'
    OpenAI-compatible server on 127.0.0.1 (what llama.cpp, Ollama or LM Studio would be)."""
    import django_rag as rag

    (block,) = [b for b in python_blocks() if b.splitlines()[0].strip() == LOCAL_MODEL]
    assert '"api_base": "http://127.0.0.1:8080/v1"' in block
    block = block.replace("http://127.0.0.1:8080/v1", stub_llm_server.base_url)
    rag.ingest(
        "Refunds go back to the original payment method within five business days.",
        collection="handbook",
        source_id="refund-policy",
    )
    stub_llm_server.chat = ["Within five business days [1]."]
    namespace: dict = {}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(block, str(DOC), "exec"), namespace)
    printed = out.getvalue().splitlines()
    assert printed[0] == "Within five business days [1]."
    assert printed[1].startswith("1 ") and "refund-policy" in printed[1]
    assert printed[2].startswith("1 call,")
    assert namespace["answer"].usage.cost is None  # no price for a local model
    (request,) = stub_llm_server.chat_requests
    assert request["body"]["model"] == "local"  # litellm strips "openai/"
    assert request["authorization"] == "Bearer local"
