"""One bounded parse for every entry point (docs/security.md, "One bounded parse"): hostile
HTML, office files and an email whose parts lie about their size, and a 30 MB one-line CSV,
through each way in, end with a typed error or a bounded success while the calling process
keeps its memory; the pool of parse workers is reused from file to file and replaced
after a failure."""

import importlib.util
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.db import connection
from django.test import override_settings

from django_rag.exceptions import CorruptFile, DocumentTooLarge, EmptyDocument, RagError
from django_rag.ingestion import isolation, ocr
from django_rag.ingestion.isolation import (
    html_to_markdown_isolated,
    parse_file_isolated,
    parse_isolated,
    worker_pids,
)
from django_rag.ingestion.parsers import ParsedDocument, Parser
from django_rag.ingestion.parsers import html as html_parser

ROOT = Path(__file__).resolve().parent.parent
needs_trafilatura = pytest.mark.skipif(
    importlib.util.find_spec("trafilatura") is None,
    reason="trafilatura (the html extra) is not installed",
)

# --- every entry point against hostile HTML, in a fresh process ------------------------------

TABLE = r"""
import io, json, os, sys, tempfile
import django
django.setup()
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings
import django_rag as rag
from django_rag import sync
from django_rag.ingestion import isolation
from django_rag.models import Document, Job
from tests.syncapp.models import Note

PROSE = "Refunds are paid within fourteen days of the request, by the card used to pay."
INPUTS = {
    # One element with 100,000 attributes: 307 s of CPU when lxml read it whole.
    "attributes": "<html><body><div " + " ".join(f"a{i}" for i in range(100_000))
    + f"><p>{PROSE}</p></div></body></html>",
    # 500,000 unclosed <a>: 33 s and 1.3 GB in trafilatura.
    "unclosed": "<html><body>" + "<a>" * 500_000 + f"<p>{PROSE}</p></body></html>",
}


def hwm():
    with open("/proc/self/status") as status:
        return next(int(l.split()[1]) for l in status if l.startswith("VmHWM")) / 1024


def outcome(value):
    if isinstance(value, Exception):
        setting = getattr(value, "details", {}).get("setting")
        return f"error:{type(value).__name__}:{setting}"
    text = value.content if isinstance(value, Document) else str(value)
    return "ok" if "fourteen days" in text else f"ok-without-text:{text[:80]!r}"


# Hostile files (issue 34): archives whose parts lie about their size, an email carrying one,
# a 30 MB CSV of one line. Built by tests/test_zip_budget.py's builders.
from tests.test_zip_budget import csv_one_line, eml_with_lying_docx, lying_docx, lying_pptx, lying_xlsx

FILES = {
    "lying-docx": (".docx", lying_docx()),
    "lying-xlsx": (".xlsx", lying_xlsx()),
    "lying-pptx": (".pptx", lying_pptx()),
    "lying-eml": (".eml", eml_with_lying_docx()),
    "csv-30mb": (".csv", csv_one_line()),
}


def data_of(name, markup):
    if name in FILES:
        return FILES[name]
    return ".html", markup.encode()


def file_for(name, markup):
    suffix, data = data_of(name, markup)
    folder = tempfile.mkdtemp(prefix="bounded-")
    path = os.path.join(folder, f"{name}{suffix}")
    with open(path, "wb") as out:
        out.write(data)
    return folder, path


def via_ingest_file(name, markup):
    return rag.ingest_file(file_for(name, markup)[1], collection="t-file")


def via_ingest_bytes(name, markup):
    suffix, data = data_of(name, markup)
    return rag.ingest_bytes(data, filename=f"{name}{suffix}", collection="t-bytes")


def via_ingest_files(name, markup):
    from django_rag.ingestion.service import ingest_files

    return ingest_files([file_for(name, markup)[1]], collection="t-files")[0]


def via_sync_folder(name, markup):
    folder, path = file_for(name, markup)
    report = rag.sync_folder(folder, collection=f"t-sync-{name}")
    if report.failed:
        return next(iter(report.failed.values()))
    return report.documents[os.path.basename(path)]


def via_rag_ingest(name, markup):
    out = io.StringIO()
    _, path = file_for(name, markup)
    try:
        call_command("rag_ingest", path, "--collection", f"t-cmd-{name}", stdout=out, stderr=out)
    except CommandError:
        pass
    text = out.getvalue()
    if "FAILED" in text:
        # The command prints each failure's message: DocumentTooLarge's say which limit.
        limits = ("more than", "inflates past", "longer than")
        return _typed(text) if any(phrase in text for phrase in limits) else RuntimeError(text)
    return Document.objects.filter(collection__name=f"t-cmd-{name}").get()


def _typed(text):
    from django_rag.exceptions import DocumentTooLarge
    return DocumentTooLarge(text)


def via_model_sync(name, markup):
    note = Note.objects.create(body=markup)  # BACKGROUND inline: synced on commit
    document = Document.objects.filter(source_id=f"syncapp.note:{note.pk}").first()
    if document is not None:
        return document
    job = Job.objects.filter(kind="sync-row").latest("pk")
    return RuntimeError(job.error) if "DocumentTooLarge" not in job.error else _typed(job.error)


def via_str(name, markup):
    return rag.ingest(markup, format="html", collection="t-str")


ENTRY_POINTS = [via_ingest_file, via_ingest_bytes, via_ingest_files, via_sync_folder,
                via_rag_ingest, via_model_sync, via_str]

config = {"EMBEDDER": "hashing", "BACKGROUND": "inline"}
if len(sys.argv) > 1:
    config.update(json.loads(sys.argv[1]))
sync.unregister(Note)
sync.indexed(text=["body"], collection="t-model", format="html")(Note)
results = {}
with override_settings(DJANGO_RAG=config):
    rag.ingest_bytes(f"<html><body><p>{PROSE}</p></body></html>".encode(), filename="warm.html", collection="warm")
    baseline = hwm()
    for entry in ENTRY_POINTS:
        files = FILES if entry not in (via_model_sync, via_str) else {}  # text-only ways in
        for name, markup in [*INPUTS.items(), *((name, None) for name in files)]:
            try:
                value = entry(name, markup)
            except Exception as exc:
                value = exc
            results[f"{entry.__name__[4:]} / {name}"] = outcome(value)
    pids = isolation.worker_pids()
print(json.dumps({"results": results, "baseline_mb": baseline, "peak_mb": hwm(),
                  "workers": pids, "pid": os.getpid()}))
"""


def run_table(config: dict | None = None) -> dict:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DJANGO_RAG_TEST_DATABASE": connection.settings_dict["NAME"],
        "PYTHONPATH": str(ROOT),
    }
    proc = subprocess.run(
        [sys.executable, "-c", TABLE, json.dumps(config or {})],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@needs_trafilatura
@pytest.mark.django_db(transaction=True)
def test_every_entry_point_bounds_hostile_html_and_the_caller_keeps_its_memory():
    result = run_table()
    expected = {}
    for entry in (
        "ingest_file",
        "ingest_bytes",
        "ingest_files",
        "sync_folder",
        "rag_ingest",
        "model_sync",
        "str",
    ):
        # The attributes past the 100th are dropped before lxml reads the tag: the text stays.
        expected[f"{entry} / attributes"] = "ok"
        # More than MAX_HTML_ELEMENTS elements: refused once parsed, before trafilatura runs.
        expected[f"{entry} / unclosed"] = "error:DocumentTooLarge:None"
        if entry not in ("model_sync", "str"):
            # A part inflating past its declared size, and a CSV row past MAX_CSV_ROW_CHARS,
            # are refused before their bytes are held.
            for name in ("lying-docx", "lying-xlsx", "lying-pptx", "lying-eml", "csv-30mb"):
                expected[f"{entry} / {name}"] = result["results"].get(f"{entry} / {name}")
                assert expected[f"{entry} / {name}"].startswith("error:DocumentTooLarge"), (
                    entry,
                    name,
                    expected[f"{entry} / {name}"],
                )
    assert result["results"] == expected
    assert result["workers"] and result["pid"] not in result["workers"]
    grown = result["peak_mb"] - result["baseline_mb"]
    print(f"caller: baseline {result['baseline_mb']:.0f} MB, peak {result['peak_mb']:.0f} MB")
    assert grown < 60  # parsing these in the caller's process took up to 2.1 GB


# --- the pool ------------------------------------------------------------------------------------


class PidParser(Parser):
    def parse(self, data: bytes, *, filename: str) -> ParsedDocument:
        return ParsedDocument(text=f"parsed by {os.getpid()}: {data.decode()}")


class Crasher(Parser):
    def parse(self, data: bytes, *, filename: str) -> ParsedDocument:
        os.kill(os.getpid(), signal.SIGKILL)  # dies inside the parse, as a native crash would
        raise AssertionError("not reached")


class Refuser(Parser):
    def parse(self, data: bytes, *, filename: str) -> ParsedDocument:
        raise EmptyDocument(f"{filename} is refused", filename=filename)


class Hog(Parser):
    def parse(self, data: bytes, *, filename: str) -> ParsedDocument:
        hoard = [bytearray(16 << 20) for _ in range(64)]  # 1 GiB, past the test's budget
        return ParsedDocument(text=str(len(hoard)))


PARSERS = {
    ".txt": "tests.test_bounded_parse.PidParser",
    ".crash": "tests.test_bounded_parse.Crasher",
    ".refused": "tests.test_bounded_parse.Refuser",
    ".hog": "tests.test_bounded_parse.Hog",
}


def pid_of(parsed: ParsedDocument) -> int:
    return int(parsed.text.split("parsed by ")[1].split(":")[0])


@pytest.fixture
def pool_settings(settings):
    settings.DJANGO_RAG = {"PARSERS": PARSERS, "MAX_PARSE_MEMORY": 256 << 20}
    yield settings
    isolation.reset_pool()


def test_consecutive_files_are_parsed_by_the_same_worker(pool_settings, tmp_path):
    paths = []
    for n in range(5):
        paths.append(tmp_path / f"f{n}.txt")
        paths[-1].write_text(f"file {n}")
    pids = {pid_of(parse_file_isolated(path)) for path in paths}
    pids.add(pid_of(parse_isolated(b"bytes", filename="b.txt")))
    (pid,) = pids  # one worker served them all, reused
    assert pid != os.getpid() and worker_pids() == [pid]


def test_a_killed_worker_is_replaced_and_the_next_file_parses(pool_settings):
    first = pid_of(parse_isolated(b"one", filename="a.txt"))
    os.kill(first, signal.SIGKILL)  # a worker of this test's own pool
    time.sleep(0.05)
    second = parse_isolated(b"two", filename="b.txt")
    assert second.text.endswith("two") and pid_of(second) != first
    assert first not in worker_pids()


def test_a_worker_that_dies_in_a_parse_is_a_typed_error_and_is_replaced(pool_settings):
    first = pid_of(parse_isolated(b"one", filename="a.txt"))
    with pytest.raises(CorruptFile, match="stopped without a result.*signal 9"):
        parse_isolated(b"x", filename="a.crash")
    after = pid_of(parse_isolated(b"two", filename="b.txt"))
    assert after != first and worker_pids() == [after]


def test_a_parse_past_the_memory_budget_is_refused_and_its_worker_replaced(pool_settings):
    first = pid_of(parse_isolated(b"one", filename="a.txt"))
    with pytest.raises(DocumentTooLarge, match="MAX_PARSE_MEMORY") as info:
        parse_isolated(b"x", filename="big.hog")
    assert info.value.details["setting"] == "MAX_PARSE_MEMORY"
    assert pid_of(parse_isolated(b"two", filename="b.txt")) != first


def test_a_typed_error_keeps_the_worker(pool_settings):
    first = pid_of(parse_isolated(b"one", filename="a.txt"))
    with pytest.raises(EmptyDocument, match="x.refused is refused"):
        parse_isolated(b"x", filename="x.refused")
    assert pid_of(parse_isolated(b"two", filename="b.txt")) == first


def test_workers_are_replaced_after_max_tasks_and_when_settings_change(pool_settings, monkeypatch):
    monkeypatch.setattr(isolation, "WORKER_MAX_TASKS", 2)
    pids = [pid_of(parse_isolated(b"x", filename="a.txt")) for _ in range(4)]
    assert pids[0] == pids[1] != pids[2] == pids[3]
    pool_settings.DJANGO_RAG = {**pool_settings.DJANGO_RAG, "MAX_DOCUMENT_CHARS": 1000}
    assert pid_of(parse_isolated(b"x", filename="a.txt")) != pids[3]  # forked with the change


def test_a_relative_path_is_read_from_the_callers_directory(pool_settings, tmp_path, monkeypatch):
    parse_isolated(b"warm", filename="a.txt")  # the worker exists before the chdir
    (tmp_path / "here.txt").write_text("found here")
    monkeypatch.chdir(tmp_path)
    assert parse_file_isolated("here.txt").text.endswith("found here")
    with pytest.raises(RagError, match="No such file: missing.txt"):
        parse_file_isolated("missing.txt")


def test_without_a_budget_parses_run_in_the_caller(pool_settings):
    pool_settings.DJANGO_RAG = {**pool_settings.DJANGO_RAG, "MAX_PARSE_MEMORY": None}
    assert pid_of(parse_isolated(b"x", filename="a.txt")) == os.getpid()


def test_a_process_forked_from_the_caller_does_not_inherit_its_workers(pool_settings):
    parse_isolated(b"x", filename="a.txt")
    assert worker_pids()
    pid = os.fork()
    if pid == 0:  # the child: the workers are its parent's
        os._exit(0 if worker_pids() == [] else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


# --- HTML: attributes, elements, passes ----------------------------------------------------------


def test_tags_are_cut_to_their_first_attributes_as_the_html5_tokenizer_reads_them():
    limit = html_parser.limit_attributes
    many = " ".join(f"a{i}" for i in range(10))
    assert limit(f"<div {many}>text</div>", limit=3) == "<div a0 a1 a2>text</div>"
    # A quoted value may hold ">"; a value needs no space after its quote.
    tag = "<p " + "".join(f'x{i}=">"' for i in range(6)) + ">t</p>"
    assert limit(tag, limit=2) == '<p x0=">"x1=">">t</p>'
    # Inside a comment, a script or a title, nothing is a tag; after them, tags are cut again.
    for before in (
        "<!-- <i a b c d e f> -->",
        "<script>'<i a b c d e f>'</script>",
        "<title><i a b c d e f></title>",
        "<script><!--<script></script>--></script>",
    ):
        assert limit(before + f"<b {many}>", limit=3) == before + "<b a0 a1 a2>"
    page = "<html><body><p>" + "word " * 100 + "</p></body></html>"
    assert limit(page) is page  # nothing to cut: the same string


@needs_trafilatura
def test_what_the_scan_leaves_lxml_never_reads_as_more_attributes():
    """Random markup built of the tokens where tokenizers disagree: after the scan, lxml
    (libxml2's HTML5 tokenizer) sees no element with more attributes than the limit."""
    hypothesis = pytest.importorskip("hypothesis")
    from hypothesis import strategies as st
    from trafilatura.utils import load_html

    tokens = [
        "<",
        ">",
        "/",
        '"',
        "'",
        "=",
        " ",
        "a",
        "b",
        "c",
        "\n",
        "\t",
        "-",
        "--",
        "<!--",
        "-->",
        "--!>",
        "<!-->",
        "<!",
        "<?",
        "</",
        "<i",
        "<i ",
        "</i",
        "<p",
        "x",
        "<script>",
        "</script>",
        "<script",
        "<SCRIPT>",
        "</SCRIPT >",
        "<style>",
        "</style>",
        "<title>",
        "</title>",
        "<textarea>",
        "</textarea>",
        "<xmp>",
        "<plaintext>",
        "<svg>",
        "<![CDATA[",
    ]

    @hypothesis.settings(max_examples=300, deadline=None, database=None)
    @hypothesis.given(st.lists(st.sampled_from(tokens), min_size=5, max_size=60))
    def check(parts):
        page = "<html><body>" + "".join(parts) + "</body></html>"
        tree = load_html(html_parser.limit_attributes(page, limit=3))
        if tree is not None:
            assert max(len(e.attrib) for e in tree.iter() if isinstance(e.tag, str)) <= 3

    check()


@needs_trafilatura
def test_a_page_of_too_many_elements_is_refused_and_a_large_one_read_in_one_pass(monkeypatch):
    from django_rag.ingestion.parsers import parse_bytes

    monkeypatch.setattr(html_parser, "MAX_HTML_ELEMENTS", 2_000)
    monkeypatch.setattr(html_parser, "ONE_PASS_ELEMENTS", 500)
    prose = "<p>Refunds are paid within fourteen days of the request.</p>"
    with pytest.raises(DocumentTooLarge, match="more than 2,000 HTML elements") as info:
        parse_bytes(("<html><body>" + "<a>" * 3_000 + prose).encode(), filename="a.html")
    assert info.value.details["limit"] == 2_000
    passes = []
    real = html_parser._extract
    monkeypatch.setattr(html_parser, "_extract", lambda *a, **k: passes.append(k) or real(*a, **k))
    page = "<html><head><title>T</title></head><body>" + "<span>x</span>" * 1_000 + prose
    parsed = parse_bytes(page.encode(), filename="b.html")
    assert "fourteen days" in parsed.text and parsed.title == "T"
    assert passes == [{"favor_recall": True, "fast": True}]


@needs_trafilatura
def test_parse_timeout_is_checked_between_the_passes(settings):
    from django_rag.ingestion.parsers import parse_bytes

    settings.DJANGO_RAG = {"PARSE_TIMEOUT": 1e-9}
    with pytest.raises(DocumentTooLarge, match="PARSE_TIMEOUT") as info:
        parse_bytes(b"<html><body><p>Some text to read.</p></body></html>", filename="a.html")
    assert info.value.details["setting"] == "PARSE_TIMEOUT"
    with pytest.raises(DocumentTooLarge, match="PARSE_TIMEOUT"):
        html_to_markdown_isolated("<p>Some text to read.</p>")


# --- OCR within the budget -----------------------------------------------------------------------

needs_rapidocr = pytest.mark.skipif(
    not ocr.has_rapidocr(), reason="rapidocr-onnxruntime (the ocr extra) is not installed"
)


def page_of_text(size):
    from PIL import Image, ImageDraw, ImageFont

    canvas = Image.new("L", size, 255)
    draw = ImageDraw.Draw(canvas)
    font = ImageFont.load_default(size=90)
    for top in range(80, size[1] - 200, 600):
        draw.text((60, top), "Quarterly invoice reconciliation", fill=0, font=font)
    out = io.BytesIO()
    canvas.save(out, "PNG")
    return out.getvalue()


@needs_rapidocr
@pytest.mark.slow
def test_an_image_at_the_pixel_cap_is_read_within_the_default_budget():
    """16 megapixels, the documented cap: the worker of 1 GiB (the default) reads it; it ran
    out of memory before (RapidOCR needed about 1 GB on top of the image)."""
    with override_settings(DJANGO_RAG={"OCR": "rapidocr"}):
        parsed = parse_isolated(page_of_text((4000, 4000)), filename="cap.png")
    assert "invoice reconciliation" in parsed.text.lower()
    assert parsed.metadata["image_size"] == [4000, 4000]


OCR_PAST_THE_BUDGET = r"""
import json, sys
import django
django.setup()
from django.test import override_settings
from django_rag.exceptions import RagError
from django_rag.ingestion.isolation import parse_isolated
from tests.test_bounded_parse import page_of_text
with override_settings(DJANGO_RAG={"OCR": "rapidocr", "MAX_PARSE_MEMORY": 300 << 20}):
    try:
        parse_isolated(page_of_text((4000, 4000)), filename="cap.png")
        print(json.dumps({"error": None}))
    except RagError as exc:
        print(json.dumps({"error": type(exc).__name__, "message": str(exc),
                          "setting": exc.details.get("setting")}))
"""


@needs_rapidocr
@pytest.mark.slow
def test_an_image_past_the_budget_names_the_limit_without_a_traceback():
    """In a fresh process (one that ran OCR already lends its workers the memory it freed):
    300 MB is too little for the 16-megapixel image."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", OCR_PAST_THE_BUDGET],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["error"] == "DocumentTooLarge" and result["setting"] == "MAX_PARSE_MEMORY"
    assert "OCR needed more memory than MAX_PARSE_MEMORY" in result["message"]
    assert "Traceback" not in result["message"] and "site-packages" not in result["message"]


@needs_rapidocr
def test_ocr_out_of_memory_is_reported_as_the_budget_not_as_the_engines_traceback(monkeypatch):
    def failing(png):
        raise RuntimeError(
            'Traceback (most recent call last):\n  File "/venv/lib/python3.11/site-packages/'
            'onnxruntime/capi/session.py", line 406, in run\n[ONNXRuntimeError] : 6 : '
            "RUNTIME_EXCEPTION : Non-zero status code returned while running Clip node. "
            "Status Message: std::bad_alloc"
        )

    monkeypatch.setattr(ocr, "read_rapidocr", failing)  # before the worker is forked
    with override_settings(DJANGO_RAG={"OCR": "rapidocr"}):
        with pytest.raises(DocumentTooLarge) as info:
            parse_isolated(page_of_text((900, 700)), filename="scan.png")
    message = str(info.value)
    assert message.startswith("scan.png (900 x 700 pixels): OCR needed more memory than")
    assert info.value.details["setting"] == "MAX_PARSE_MEMORY"
    assert "Traceback" not in message and "site-packages" not in message
    isolation.reset_pool()


def test_an_engine_failure_is_reported_by_its_first_line_without_paths():
    error = RuntimeError(
        'Traceback (most recent call last):\n  File "/usr/lib/python3/site-packages/x.py"\n'
    )
    assert ocr.failure(error) == "RuntimeError: Traceback (most recent call last):"
    error = RuntimeError("/opt/venv/lib/site-packages/onnxruntime/core.cc:12 Conv failed")
    assert ocr.failure(error) == "RuntimeError: <path>:12 Conv failed"


def test_large_images_are_read_in_bands_that_share_the_image_between_them():
    for height, width in ((700, 2000), (2000, 900), (2000, 2000), (1801, 1500), (5000, 2000)):
        bands = ocr._bands(height, width)
        assert bands[0][0] == 0 and bands[-1][1] == height
        if width * height <= ocr.BAND_PIXELS:
            assert len(bands) == 1
            continue
        for (top, bottom, keep_from, keep_to), following in zip(
            bands, bands[1:] + [None], strict=True
        ):
            assert bottom - top == ocr.BAND_HEIGHT
            # A line up to BAND_OVERLAP tall whose middle is in the band's share is whole in it.
            assert keep_from == -float("inf") or keep_from - top >= ocr.BAND_OVERLAP / 2
            assert keep_to == float("inf") or bottom - keep_to >= ocr.BAND_OVERLAP / 2
            if following is not None:
                assert following[2] == keep_to  # the shares meet: every line is kept once
