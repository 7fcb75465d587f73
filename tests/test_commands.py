import json
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from django_rag.models import Document

from .test_parsers import make_pdf

pytestmark = pytest.mark.django_db


@pytest.fixture
def files(tmp_path):
    (tmp_path / "docs" / "nested").mkdir(parents=True)
    (tmp_path / "docs" / "intro.md").write_text("# Intro\n\nOur refund policy lasts 30 days.")
    (tmp_path / "docs" / "nested" / "shipping.txt").write_text("Shipping takes three to five days.")
    (tmp_path / "docs" / "nested" / "manual.pdf").write_bytes(make_pdf(["Press the red button."]))
    (tmp_path / "docs" / "ignored.xyz").write_text("not a supported type")
    return tmp_path


def run(*args):
    out, err = StringIO(), StringIO()
    call_command(*args, stdout=out, stderr=err)
    return out.getvalue()


def test_ingest_directory_then_search(files):
    output = run("rag_ingest", str(files / "docs"), "--collection", "kb")
    assert "3 file(s): 3 ingested" in output and "0 failed" in output
    assert Document.objects.filter(collection__name="kb").count() == 3
    assert set(Document.objects.values_list("original_filename", flat=True)) == {
        "intro.md",
        "shipping.txt",
        "manual.pdf",
    }

    again = run("rag_ingest", str(files / "docs"), "--collection", "kb")
    assert "3 unchanged" in again
    assert Document.objects.count() == 3

    data = json.loads(run("rag_search", "refund", "--collection", "kb", "--json", "--limit", "2"))
    assert len(data) == 2 and data[0]["filename"] == "intro.md"
    assert set(data[0]) >= {"chunk_id", "text", "score", "document_id", "page_start", "filename"}

    table = run("rag_search", "red button", "--collection", "kb", "--limit", "1")
    assert "manual.pdf p.1" in table and "Press the red button." in table


def test_search_output_says_what_the_scores_mean(files):
    import re

    run("rag_ingest", str(files / "docs"), "--collection", "kb")
    for mode, fusion, legend in [
        ("semantic", None, "cosine similarity"),
        ("fulltext", None, "BM25"),
        ("hybrid", None, "0.5 = as good as this query's average candidate"),
        ("hybrid", "weighted", "1 = best on both"),
        ("hybrid", "rrf", "1/(rrf_k + rank)"),
    ]:
        args = ["rag_search", "refund policy days", "--collection", "kb", "--mode", mode]
        output = run(*args, *(["--fusion", fusion] if fusion else []))
        assert output.splitlines()[-1].startswith("score: ") and legend in output, output
        if mode == "hybrid":
            scores = [float(s) for s in re.findall(r"^\s*\d+\. (-?[\d.]+) ", output, re.M)]
            assert len(scores) == 3 and all(0 <= score <= 1 for score in scores), output


def test_glob_and_replace(files):
    path = files / "docs" / "nested" / "shipping.txt"
    run("rag_ingest", str(files / "docs" / "**" / "*.txt"), "--collection", "g")
    path.write_text("Shipping now takes one day.")
    output = run("rag_ingest", str(path), "--collection", "g", "--replace")
    assert "1 ingested" in output
    (doc,) = Document.objects.filter(collection__name="g")
    assert doc.content == "Shipping now takes one day." and doc.source_id == str(path)


def test_failures_are_reported_with_exit_status_1(files):
    (files / "docs" / "empty.txt").write_text("   ")
    (files / "docs" / "latin.txt").write_bytes(b"caf\xe9")
    with pytest.raises(CommandError) as info:
        run("rag_ingest", str(files / "docs"), "--collection", "f")
    assert info.value.returncode == 1
    assert "2 file(s) failed" in str(info.value)
    assert "empty.txt" in str(info.value) and "latin.txt" in str(info.value)
    assert Document.objects.filter(collection__name="f").count() == 3


def test_ingest_argument_errors(files):
    with pytest.raises(CommandError, match="no file matches"):
        run("rag_ingest", str(files / "*.nothing"))
    with pytest.raises(CommandError, match="--source-id"):
        run("rag_ingest", str(files / "docs"), "--source-id", "x")


def test_search_errors_and_empty_results(files):
    with pytest.raises(CommandError, match="No collection named 'missing'"):
        run("rag_search", "x", "--collection", "missing")
    with pytest.raises(CommandError, match="Unknown search mode"):
        run("rag_search", "x", "--mode", "psychic")
    assert run("rag_search", "anything") == "No results.\n"


def test_commands_via_subprocess_exit_codes(files, tmp_path):
    """The real command line: exit status 1 when a file fails."""
    import os
    import subprocess
    import sys

    (files / "docs" / "bad.pdf").write_bytes(b"garbage")
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONPATH": os.getcwd()}
    proc = subprocess.run(
        [sys.executable, "-m", "django", "rag_ingest", str(files / "docs" / "bad.pdf"), "--quiet"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert proc.returncode == 1
    assert "not a PDF" in proc.stderr


@pytest.fixture
def policies():
    import django_rag as rag

    rag.ingest("Refunds are paid within 14 days.", collection="policies", source_id="refunds")
    rag.ingest("Shipping is free over 50 euros.", collection="policies", source_id="shipping")


def scripted_settings(llm):
    from django.test import override_settings

    return override_settings(DJANGO_RAG={"EMBEDDER": "hashing", "LLM": llm})


def test_rag_ask_prints_the_answer_and_its_sources(policies):
    from django_rag.testing import ScriptedLLM

    with scripted_settings(ScriptedLLM("Refunds take 14 days [1].")):
        output = run(
            "rag_ask", "How long do refunds take?", "--collection", "policies", "--mode", "fulltext"
        )
    assert output.startswith("Refunds take 14 days [1].")
    assert "Sources:\n  [1] refunds" in output


def test_rag_ask_streams_and_prints_json(policies):
    from django_rag.testing import ScriptedLLM

    with scripted_settings(ScriptedLLM("Streamed answer [1].", "As JSON [2].")):
        streamed = run("rag_ask", "refunds", "--stream", "--limit", "1")
        data = json.loads(run("rag_ask", "refunds shipping", "--json", "--limit", "2"))
    assert streamed.startswith("Streamed answer [1].\n")
    assert data["text"] == "As JSON [2]." and data["citations"][0]["number"] == 2
    assert len(data["chunks"]) == 2 and "usage" in data


def test_rag_ask_runs_the_pipeline_from_flags(policies):
    from django_rag.testing import ScriptedLLM

    llm = ScriptedLLM(
        rules={
            "requires looking things up": '{"needs_retrieval": true}',
            "clean search query": "refund duration",
            "Rate how well each passage": '{"1": 9, "2": 1}',
            "Review an answer against": '{"grounded": true}',
            "You answer the user's question": "Refunds: 14 days [1].",
        }
    )
    with scripted_settings(llm):
        output = run(
            "rag_ask",
            "Hello! How long for refunds?",
            "--gate",
            "--rewrite",
            "--rerank",
            "--self-correct",
            "--collection",
            "policies",
        )
    assert output.startswith("Refunds: 14 days [1].") and "[1] refunds" in output
    steps = ["looking things up", "clean search query", "Rate how well", "Review an answer"]
    prompts = [call["prompt"] for call in llm.calls]
    assert [
        next(s for s in steps if s in p) for p in prompts if any(s in p for s in steps)
    ] == steps


def test_rag_ask_errors_are_command_errors(policies):
    from django_rag.testing import ScriptedLLM

    with pytest.raises(CommandError, match=r"DJANGO_RAG\['LLM'\]"):
        run("rag_ask", "refunds")
    with scripted_settings(ScriptedLLM(RuntimeError("provider down"))):
        with pytest.raises(CommandError, match="answer step failed"):
            run("rag_ask", "refunds", "--rewrite")
        with pytest.raises(CommandError, match="not with pipeline flags"):
            run("rag_ask", "refunds", "--rewrite", "--stream")


def test_rag_ask_checks_collection_and_mode_before_any_llm_call(policies):
    from django_rag.testing import ScriptedLLM

    llm = ScriptedLLM("never used")
    with scripted_settings(llm):
        with pytest.raises(CommandError, match="No collection named 'missing'"):
            run("rag_ask", "refunds", "--gate", "--rewrite", "--collection", "missing")
        with pytest.raises(CommandError, match="No collection named 'missing'"):
            run("rag_ask", "refunds", "--collection", "policies", "--collection", "missing")
        with pytest.raises(CommandError, match="Unknown search mode 'bogus'"):
            run("rag_ask", "refunds", "--rewrite", "--mode", "bogus")
        with pytest.raises(CommandError, match="expected an integer >= 1"):
            run("rag_ask", "refunds", "--limit", "0")
    assert llm.calls == []


class FakeTTY(StringIO):
    def isatty(self):
        return True


def test_ingest_options_title_metadata_and_chunk_size(files):
    path = files / "docs" / "nested" / "shipping.txt"
    path.write_text(" ".join(f"word{i}" for i in range(120)))
    run(
        "rag_ingest",
        str(path),
        "--collection",
        "opts",
        "--title",
        "Shipping guide",
        "--metadata",
        '{"team": "logistics", "tier": 2}',
        "--chunk-size",
        "40",
        "--chunk-overlap",
        "5",
    )
    (doc,) = Document.objects.filter(collection__name="opts")
    assert doc.title == "Shipping guide"
    assert doc.metadata["team"] == "logistics" and doc.metadata["tier"] == 2
    assert doc.chunk_count >= 3  # 120 words in chunks of at most 40 tokens
    assert all(chunk.token_count <= 40 for chunk in doc.chunks.all())


@pytest.mark.parametrize(
    "args, message",
    [
        (["--metadata", "{team: 1}"], "--metadata is not valid JSON"),
        (["--metadata", "[1, 2]"], "--metadata must be a JSON object, got list"),
        (["--metadata", '{"x": NaN}'], "--metadata"),
        (["--chunk-size", "10", "--chunk-overlap", "10"], "chunk_overlap"),
        (["--chunk-size", "0"], "chunk_size"),
        (["--title", "One title"], "--title names one document but 3 files"),
    ],
)
def test_ingest_option_errors_are_clear_and_store_nothing(files, args, message):
    with pytest.raises(CommandError, match=message):
        run("rag_ingest", str(files / "docs"), "--collection", "bad", *args)
    assert not Document.objects.filter(collection__name="bad").exists()


def test_ingest_progress_on_a_tty_only(files):
    out, err = StringIO(), FakeTTY()
    call_command("rag_ingest", str(files / "docs"), "--collection", "tty", stdout=out, stderr=err)
    drawn = err.getvalue()
    chunks = sum(
        Document.objects.filter(collection__name="tty").values_list("chunk_count", flat=True)
    )
    assert "chunks embedded" in drawn and f"{chunks}/{chunks}" in drawn and "[#" in drawn
    # Not a terminal: no bar, and the per-file lines and summary are the same.
    out2, err2 = StringIO(), StringIO()
    call_command("rag_ingest", str(files / "docs"), "--collection", "tty", stdout=out2, stderr=err2)
    assert err2.getvalue() == ""
    assert "3 unchanged" in out2.getvalue()


def test_ingest_summarises_skipped_files_by_reason(files):
    (files / "docs" / "photo.gif").write_bytes(b"\x89PNG")
    output = run("rag_ingest", str(files / "docs"), "--collection", "skip")
    assert (
        "2 other file(s) in the directories skipped (no parser for their type: 1 .gif, 1 .xyz"
        in output
    )
    assert sum(line.startswith("ingested ") for line in output.splitlines()) == 3


def test_ingest_of_a_directory_uses_the_batched_path(files, monkeypatch):
    from django_rag.ingestion import batch  # write_documents is called there

    calls = []
    original = batch.write_documents

    def recording(writes, **kwargs):
        calls.append(len(writes))
        return original(writes, **kwargs)

    monkeypatch.setattr(batch, "write_documents", recording)
    run("rag_ingest", str(files / "docs"), "--collection", "batched")
    assert calls == [3]  # the three files written together, not one ingest per file


def test_every_option_with_choices_shows_them_in_help():
    from django.core.management import get_commands, load_command_class

    for name, app in get_commands().items():
        if not name.startswith("rag_"):
            continue
        parser = load_command_class(app, name).create_parser("manage.py", name)
        help_text = parser.format_help()
        for action in parser._actions:
            if action.choices and not isinstance(action.choices, dict):
                assert "{" + ",".join(map(str, action.choices)) + "}" in help_text, (
                    name,
                    action.dest,
                )


def test_first_day_output_reads_right():
    """One chunk is "1 chunk"; pgvector prints as a version; --limit and --threshold say what
    they do; progress on stderr is not styled as an error."""
    import re

    from django.core.management import load_command_class
    from django.core.management.base import OutputWrapper

    import django_rag as rag
    from django_rag.management.progress import ProgressBar, note

    rag.ingest("A single short paragraph.", collection="one")
    out = StringIO()
    call_command("rag_info", stdout=out)
    text = out.getvalue()
    assert "  one: 1 document, 1 chunk\n" in text
    assert re.search(r"^pgvector: \d+\.\d+\.\d+$", text, re.M), text[:500]

    for command in ("rag_search", "rag_ask"):
        parser = load_command_class("django_rag", command).create_parser("manage.py", command)
        helps = {a.dest: a.help for a in parser._actions}
        assert helps["limit"] and "most" in helps["limit"]
        assert "cosine" in helps["threshold"] and "BM25" in helps["threshold"]

    class Terminal(StringIO):
        def isatty(self):
            return True

    stderr = OutputWrapper(Terminal())
    stderr.style_func = lambda text: f"\x1b[31;1m{text}\x1b[0m"  # Django's ERROR on stderr
    bar = ProgressBar(2, stderr)
    bar.advance("first")
    bar.close()
    note(stderr, "loading model x ...")
    assert "[###############---------------] 1/2 first" in stderr._out.getvalue()
    assert "\x1b[" not in stderr._out.getvalue()
