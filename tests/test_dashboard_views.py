"""The dashboard's views package: one module per page, every view importable from
``django_rag.dashboard.views``, and the helpers the pages share."""

from dataclasses import dataclass, field
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import get_resolver, reverse

import django_rag.dashboard.views as views
from django_rag.dashboard import urls
from django_rag.ingestion.parsers import ParsedDocument, Parser
from django_rag.models import Document
from tests.test_parsers import make_pdf

pytestmark = pytest.mark.django_db

VIEWS_DIR = Path(views.__file__).parent


def url(name, *args):
    return reverse(f"django_rag_dashboard:{name}", args=args)


def test_every_url_resolves_to_a_view_named_on_the_views_package():
    for pattern in urls.urlpatterns:
        assert getattr(views, pattern.callback.__name__) is pattern.callback, pattern.name
    assert get_resolver().resolve(url("ask")).func is views.ask_page


def test_no_views_module_is_long():
    sizes = {p.name: len(p.read_text().splitlines()) for p in VIEWS_DIR.glob("*.py")}
    assert len(sizes) >= 9 and max(sizes.values()) <= 400, sizes


# --- one helper cuts an answer by its grounded spans (Ask page and evaluation runs) -------------


@dataclass
class Span:
    start: int
    end: int
    verdict: str
    chunk_ids: list = field(default_factory=list)
    score: float | None = None


@dataclass
class Grounding:
    spans: list


TEXT = "Two years. Made on Mars. Blue."
SPANS = [
    Span(11, 24, "contradicted", [3], 0.1),
    Span(0, 10, "supported", [1, 2], 0.9),
    Span(5, 10, "supported"),  # inside an earlier span: left out
    Span(20, 26, "supported"),  # overlaps the span before: clipped to what is left
    Span(25, 99, "made-up verdict"),  # past the end: clipped; the verdict shows as unsupported
]
EXPECTED = [
    ("Two years.", "supported"),
    (" ", None),
    ("Made on Mars.", "contradicted"),
    (" B", "supported"),
    ("lue.", "unsupported"),
]


def stored(span: Span) -> dict:
    """A span as a run's results store it (JSON)."""
    return {"start": span.start, "end": span.end, "text": TEXT[span.start : span.end],
            "verdict": span.verdict, "chunk_ids": span.chunk_ids, "score": span.score}  # fmt: skip


def test_objects_and_stored_dicts_are_cut_the_same_way():
    live = views.grounded_segments(TEXT, Grounding(SPANS))
    saved = views.grounded_segments(TEXT, {"spans": [stored(s) for s in SPANS]})
    assert saved == live
    assert [(s["text"], s["verdict"]) for s in saved] == EXPECTED
    assert saved[0]["chunk_ids"] == [1, 2] and saved[0]["score"] == 0.9
    for nothing in (None, {}, {"spans": "junk"}, {"spans": [{"start": "x"}, 7]}):
        assert views.grounded_segments(TEXT, nothing) == [{"text": TEXT, "verdict": None}]


def test_an_evaluation_run_highlights_its_answers_like_the_ask_page(staff):
    from django_rag.models import Run

    result = {"question": "How long?", "expected": [1], "retrieved": [1], "first_relevant_rank": 1,
              "answer": TEXT, "grounding": {"score": 0.5, "spans": [stored(s) for s in SPANS]}}  # fmt: skip
    run = Run.objects.create(mode="hybrid", status="completed", results=[result])
    body = staff.get(url("evaluation_run", run.pk)).content.decode()
    highlighted = body.split('<p class="grounded-answer">', 1)[1].split("</p>", 1)[0]
    assert highlighted.count("<mark") == 4
    assert (
        '<mark class="grounding-supported" title="supported: chunks 1, 2">Two years.</mark>'
        in highlighted
    )
    assert '<mark class="grounding-supported" title="supported"> B</mark>' in highlighted
    assert '<mark class="grounding-unsupported" title="unsupported">lue.</mark>' in highlighted
    assert "made-up" not in body


# --- the search modes come from the library ------------------------------------------------------


def test_the_forms_and_pages_offer_the_librarys_search_modes(staff, monkeypatch):
    from django_rag import modes as service  # the registry search() reads its modes from
    from django_rag.dashboard import forms

    for form in (forms.SearchForm(), forms.AskForm()):
        assert [mode for mode, _ in form.fields["mode"].choices] == list(service.MODES)
    assert dict(forms.SearchForm().fields["mode"].choices)["fulltext"] == "Full-text"
    page = staff.get(url("evaluation")).content.decode()
    assert all(f"<option >{mode}</option>" in page or f"<option selected>{mode}</option>"
               in page for mode in service.MODES)  # fmt: skip
    # One source: a mode the library adds is offered by both forms.
    monkeypatch.setattr(service, "MODES", (*service.MODES, "graph_only"))
    assert "graph_only" in dict(forms.SearchForm().fields["mode"].choices)
    assert "graph_only" in dict(forms.AskForm().fields["mode"].choices)


# --- the upload form accepts what the parser registry parses -------------------------------------


class HtmlParser(Parser):
    """A parser a project adds through DJANGO_RAG["PARSERS"] (the tags dropped, crudely)."""

    def parse(self, data: bytes, *, filename: str) -> ParsedDocument:
        text = data.decode().replace("<p>", "").replace("</p>", "\n")
        return ParsedDocument(text=text, content_type="text/html")


def upload(client, name: str, data: bytes) -> str:
    file = SimpleUploadedFile(name, data)
    return client.post(
        url("upload"), {"collection": "web", "file": file}, follow=True
    ).content.decode()


def test_a_parser_added_in_settings_is_accepted_by_the_upload_form(staff, settings):
    settings.DJANGO_RAG = {"EMBEDDER": "hashing", "OCR": "off",  # off: no image types listed
                           "PARSERS": {".HTML": "tests.test_dashboard_views.HtmlParser"}}  # fmt: skip
    page = upload(staff, "page.html", b"<p>Refunds take 14 days.</p>")
    assert "Upload a" not in page
    doc = Document.objects.get(original_filename="page.html")
    assert doc.status == "completed" and "Refunds take 14 days." in doc.content
    # The replaced .html parser is listed once; .htm keeps the built-in one, so it is named.
    assert (
        "A .txt, .md, .pdf, .html, .htm, .docx, .pptx, .xlsx, .eml or .csv file of at most"
        in staff.get(url("documents")).content.decode()
    )


def test_a_parser_disabled_in_settings_is_refused_by_the_upload_form(staff, settings):
    settings.DJANGO_RAG = {"EMBEDDER": "hashing", "PARSERS": {".pdf": None}, "OCR": "off"}
    page = upload(staff, "manual.PDF", make_pdf(["Press the red button."]))
    assert "Upload a .txt, .md, .html, .docx, .pptx, .xlsx, .eml or .csv file." in page
    assert not Document.objects.exists()
    assert "Upload a" not in upload(staff, "notes.markdown", b"# Notes\n\nBlue.")
    assert Document.objects.get().original_filename == "notes.markdown"
