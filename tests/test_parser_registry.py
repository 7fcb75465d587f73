"""The parser registry's extras (docs/ingestion.md, "Parsers"): a configurable fallback for
unclaimed extensions, ``available()`` and ``supported_formats()``, ``(parser, options)`` specs
whose options merge with per-call ones, and ParserUnavailable raised before a parser whose
extra is missing runs, whatever the way in (in process, the parse pool, an ingest)."""

import os

import pytest

import django_rag as rag
from django_rag.exceptions import (
    ConfigurationError,
    InvalidOption,
    MissingDependency,
    ParserUnavailable,
    UnsupportedFileType,
)
from django_rag.ingestion.isolation import parse_file_isolated, parse_isolated
from django_rag.ingestion.parsers import (
    ParsedDocument,
    Parser,
    available,
    get_parser,
    parse_bytes,
    parse_file,
    supported_formats,
)
from django_rag.models import Document

HERE = __name__


class EchoParser(Parser):
    """Reads bytes as text, with options that show in the result, and the pid it ran in."""

    def __init__(self, *, prefix: str = "", upper: bool = False):
        self.prefix = prefix
        self.upper = upper

    def parse(self, data, *, filename):
        text = self.prefix + data.decode()
        return ParsedDocument(
            text=text.upper() if self.upper else text, metadata={"pid": os.getpid()}
        )


class NeedsExtra(Parser):
    """A parser whose extra is not installed; ``calls`` records any parse that ran anyway."""

    requires = (("django_rag_no_such_module", "fancy", "fancy-dist"),)
    calls: list[str] = []

    def parse(self, data, *, filename):
        NeedsExtra.calls.append(filename)
        return ParsedDocument(text=data.decode())


@pytest.fixture(autouse=True)
def _reset_calls():
    NeedsExtra.calls.clear()


def test_unclaimed_extension_is_unsupported_without_a_fallback():
    with pytest.raises(UnsupportedFileType, match="FALLBACK_PARSER"):
        parse_bytes(b"hello", filename="notes.log")


def test_fallback_parser_reads_unclaimed_extensions(settings):
    settings.DJANGO_RAG = {"FALLBACK_PARSER": f"{HERE}.EchoParser"}
    assert parse_bytes(b"hello", filename="notes.log").text == "hello"
    # A claimed extension keeps its own parser.
    assert type(get_parser("a.md")).__name__ == "MarkdownParser"


def test_fallback_parser_spec_takes_options(settings):
    settings.DJANGO_RAG = {"FALLBACK_PARSER": (f"{HERE}.EchoParser", {"upper": True})}
    assert parse_bytes(b"hello", filename="notes.log").text == "HELLO"


def test_disabled_extension_is_not_read_by_the_fallback(settings):
    settings.DJANGO_RAG = {"FALLBACK_PARSER": EchoParser, "PARSERS": {".csv": None}}
    with pytest.raises(UnsupportedFileType, match="disables"):
        parse_bytes(b"a,b", filename="table.csv")
    assert not available(".csv")


def test_supported_formats_lists_registered_extensions_less_disabled(settings):
    settings.DJANGO_RAG = {
        "PARSERS": {"shout": EchoParser, ".pdf": None},
        "FALLBACK_PARSER": EchoParser,
    }
    formats = supported_formats()
    assert formats == sorted(formats)
    assert {".txt", ".md", ".shout"} <= set(formats)
    assert ".pdf" not in formats
    assert ".log" not in formats  # the fallback claims no extension of its own


def test_available_says_whether_a_parser_claims_the_file_and_can_run(settings):
    assert available(".txt") and available("txt") and available("report.md")
    assert not available(".log")
    assert not available("")
    settings.DJANGO_RAG = {"PARSERS": {".fancy": NeedsExtra}}
    assert not available(".fancy")  # claimed, but its extra is missing
    settings.DJANGO_RAG = {"FALLBACK_PARSER": EchoParser}
    assert available(".log")


def test_parser_spec_options_merge_with_per_call_options(settings):
    settings.DJANGO_RAG = {
        "PARSERS": {".echo": (f"{HERE}.EchoParser", {"prefix": "set:", "upper": True})}
    }
    assert parse_bytes(b"x", filename="a.echo").text == "SET:X"
    # Per-call options win key by key; the setting's others stay.
    assert parse_bytes(b"x", filename="a.echo", options={"prefix": "call:"}).text == "CALL:X"


def test_per_call_options_reach_the_parser_in_the_parse_pool(settings, tmp_path):
    settings.DJANGO_RAG = {"PARSERS": {".echo": (EchoParser, {"prefix": "set:"})}}
    parsed = parse_isolated(b"x", filename="a.echo", options={"upper": True})
    assert parsed.text == "SET:X"
    assert parsed.metadata["pid"] != os.getpid()  # parsed in a worker, not here
    path = tmp_path / "b.echo"
    path.write_bytes(b"y")
    assert parse_file_isolated(path, options={"prefix": "file:"}).text == "file:y"


def test_unknown_per_call_option_is_an_invalid_option(settings):
    settings.DJANGO_RAG = {"PARSERS": {".echo": EchoParser}}
    with pytest.raises(InvalidOption, match="colour"):
        parse_bytes(b"x", filename="a.echo", options={"colour": "red"})
    with pytest.raises(InvalidOption, match="JSON"):
        parse_isolated(b"x", filename="a.echo", options={"prefix": object()})
    with pytest.raises(InvalidOption, match="dict"):
        parse_bytes(b"x", filename="a.echo", options=["prefix"])


def test_bad_options_in_settings_name_the_setting(settings):
    settings.DJANGO_RAG = {"PARSERS": {".echo": (EchoParser, {"colour": "red"})}}
    with pytest.raises(ConfigurationError, match="PARSERS"):
        get_parser("a.echo")
    settings.DJANGO_RAG = {"PARSERS": {".echo": (EchoParser(), {"upper": True})}}
    with pytest.raises(ConfigurationError, match="instance"):
        get_parser("a.echo")
    settings.DJANGO_RAG = {"FALLBACK_PARSER": (EchoParser, "upper")}
    with pytest.raises(ConfigurationError, match="FALLBACK_PARSER"):
        get_parser("a.log")


def test_missing_extra_raises_parser_unavailable_before_the_parser_runs(settings, tmp_path):
    settings.DJANGO_RAG = {"PARSERS": {".fancy": NeedsExtra}}
    for parse in (
        lambda: parse_bytes(b"x", filename="a.fancy"),
        lambda: parse_isolated(b"x", filename="a.fancy"),
    ):
        with pytest.raises(ParserUnavailable) as caught:
            parse()
        assert caught.value.extra == "fancy"
        assert caught.value.code == "parser_unavailable"
        assert "pip install 'django-rag[fancy]'" in str(caught.value)
        assert "a.fancy" in str(caught.value)
        assert isinstance(caught.value, MissingDependency)
    path = tmp_path / "b.fancy"
    path.write_bytes(b"y")
    with pytest.raises(ParserUnavailable):
        parse_file(path)
    with pytest.raises(ParserUnavailable):
        parse_file_isolated(path)
    assert NeedsExtra.calls == []


@pytest.mark.django_db
def test_ingest_of_a_file_whose_parser_is_unavailable_stores_nothing(settings):
    settings.DJANGO_RAG = {"EMBEDDER": "hashing", "PARSERS": {".fancy": NeedsExtra}}
    with pytest.raises(ParserUnavailable):
        rag.ingest_bytes(b"some words", filename="a.fancy", collection="docs")
    with pytest.raises(ParserUnavailable):
        rag.ingest_bytes(b"some words", filename="a.fancy", collection="docs", background=True)
    assert not Document.objects.exists()
    assert NeedsExtra.calls == []


@pytest.mark.django_db
def test_fallback_parser_ingests_an_unclaimed_file(settings):
    settings.DJANGO_RAG = {"EMBEDDER": "hashing", "FALLBACK_PARSER": EchoParser}
    document = rag.ingest_bytes(b"plain words in a log", filename="app.log", collection="docs")
    assert document.chunks.count() == 1
    assert document.content == "plain words in a log"


def test_builtin_parsers_with_extras_declare_them():
    from django_rag.ingestion.parsers.docx import DocxParser
    from django_rag.ingestion.parsers.html import HtmlParser
    from django_rag.ingestion.parsers.pdf import PdfParser
    from django_rag.ingestion.parsers.pptx import PptxParser
    from django_rag.ingestion.parsers.spreadsheet import XlsxParser

    extras = {
        cls.__name__: cls.requires[0][1]
        for cls in (DocxParser, HtmlParser, PdfParser, PptxParser, XlsxParser)
    }
    assert extras == {
        "DocxParser": "docx",
        "HtmlParser": "html",
        "PdfParser": "pdf",
        "PptxParser": "pptx",
        "XlsxParser": "xlsx",
    }
    # Each extra's install is what pyproject.toml names.
    from pathlib import Path

    pyproject = (Path(__file__).resolve().parent.parent / "pyproject.toml").read_text()
    for extra in extras.values():
        assert f"\n{extra} = [" in pyproject


def test_a_bad_fallback_parser_fails_the_system_check_naming_it(settings):
    from django_rag.checks import check_settings

    settings.DJANGO_RAG = {"EMBEDDER": "hashing", "FALLBACK_PARSER": "myproject.nope.Parser"}
    errors = [e for e in check_settings() if e.id == "django_rag.E002"]
    assert errors and "FALLBACK_PARSER" in errors[0].msg
    settings.DJANGO_RAG = {"EMBEDDER": "hashing", "FALLBACK_PARSER": EchoParser}
    assert not [e for e in check_settings() if e.id == "django_rag.E002"]


def test_parser_formats_include_the_fallback_content_type(settings):
    from django_rag.ingestion.parsers import parser_formats

    class LogParser(EchoParser):
        content_type = "text/x-log"
        format = "markdown"

    assert "text/x-log" not in parser_formats()
    settings.DJANGO_RAG = {"FALLBACK_PARSER": LogParser}
    assert parser_formats()["text/x-log"] == "markdown"
