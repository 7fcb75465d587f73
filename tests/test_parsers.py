import pymupdf
import pytest
from django.test import override_settings

from django_rag.exceptions import (
    CorruptFile,
    EncryptedPDF,
    FileNotFound,
    InvalidText,
    NoTextLayer,
    UnsupportedFileType,
)
from django_rag.ingestion.parsers import ParsedDocument, Parser, get_parser, parse_bytes, parse_file
from tests.helpers import make_pdf


def test_pdf_pages_map_to_character_ranges():
    data = make_pdf(
        ["Page one talks about apples.", "Page two is about bananas.", "Third: cherries."]
    )
    parsed = parse_bytes(data, filename="fruit.pdf")
    assert parsed.content_type == "application/pdf"
    assert parsed.title == "Generated Test PDF"
    assert [p.number for p in parsed.pages] == [1, 2, 3]
    for page, word in zip(parsed.pages, ["apples", "bananas", "cherries"], strict=True):
        assert word in parsed.text[page.start : page.end]
    two = parsed.text.index("bananas")
    assert parsed.page_range(two, two + 7) == (2, 2)
    assert parsed.page_range(parsed.text.index("apples"), parsed.text.index("cherries") + 3) == (
        1,
        3,
    )


def make_titled_pdf(title: str, *, heading_size: float = 20) -> bytes:
    """A two-page PDF: a small running header, a heading in a larger font, then body text."""
    document = pymupdf.open()
    page = document.new_page()
    page.insert_text((50, 40), "Case 19-1392, page 1", fontsize=8)
    page.insert_text((50, 90), "Oral Argument in the", fontsize=heading_size)
    page.insert_text((50, 115), "Supreme Court", fontsize=heading_size)
    body = "The court heard argument on the question presented. " * 6
    page.insert_textbox(pymupdf.Rect(50, 140, 550, 400), body, fontsize=11)
    document.new_page().insert_text((50, 90), "Second page text.", fontsize=11)
    document.set_metadata({"title": title})
    data = document.tobytes()
    document.close()
    return data


@pytest.mark.parametrize(
    "junk",
    [
        "10811.exe",
        "Microsoft Word - brief.doc",
        "untitled",
        "Untitled-3",
        "Document1",
        "12345",
        "--- 2021/07 ---",
        "final_v2.docx",
        "C:\\cases\\brief",
    ],
)
def test_a_file_name_or_placeholder_pdf_title_loses_to_the_first_heading(junk):
    parsed = parse_bytes(make_titled_pdf(junk), filename="brief.pdf")
    assert parsed.title == "Oral Argument in the Supreme Court"


def test_without_a_larger_font_the_first_line_in_the_body_font_is_the_title():
    # The running header in a smaller font is skipped.
    parsed = parse_bytes(make_titled_pdf("10811.exe", heading_size=11), filename="brief.pdf")
    assert parsed.title == "Oral Argument in the"


@pytest.mark.parametrize(
    "title", ["Geometrie und Topologie", "Introduction to Node.js", "Version 2.0 notes", ""]
)
def test_a_real_pdf_title_or_none_is_kept(title):
    assert parse_bytes(make_titled_pdf(title), filename="brief.pdf").title == title


def test_encrypted_pdf_is_refused():
    data = make_pdf(["secret"], encryption=pymupdf.PDF_ENCRYPT_AES_256, user_pw="u", owner_pw="o")
    with pytest.raises(EncryptedPDF, match="password"):
        parse_bytes(data, filename="secret.pdf")


def test_pdf_without_text_layer_is_refused():
    with pytest.raises(NoTextLayer, match="OCR"):
        parse_bytes(make_pdf(["", ""]), filename="scan.pdf")


@pytest.mark.parametrize("data", [b"not a pdf at all", b"%PDF-1.7\n garbage \x00\x01\x02", b""])
def test_corrupt_pdf_bytes(data):
    with pytest.raises(CorruptFile):
        parse_bytes(data, filename="broken.pdf")


def test_text_and_markdown():
    parsed = parse_bytes("héllo wörld".encode(), filename="a.txt")
    assert (parsed.text, parsed.format, parsed.content_type) == (
        "héllo wörld",
        "text",
        "text/plain",
    )
    parsed = parse_bytes(b"\xef\xbb\xbfIntro\n\n# The Title\n\nbody", filename="NOTES.MD")
    assert parsed.text.startswith("Intro") and parsed.format == "markdown"
    assert parsed.title == "The Title"


def test_utf16_with_bom_is_decoded():
    assert parse_bytes("grüße".encode("utf-16"), filename="u.txt").text == "grüße"


def test_invalid_utf8_names_the_byte():
    with pytest.raises(InvalidText, match=r"byte 3 is 0xe9") as info:
        parse_bytes(b"caf\xe9 latin-1", filename="latin.txt")
    assert info.value.code == "invalid_text"


def test_unknown_extension_lists_supported_types():
    with pytest.raises(UnsupportedFileType, match=r"\.md.*\.pdf"):
        get_parser("slides.key")


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFound):
        parse_file(tmp_path / "nope.txt")


def test_parse_file_reads_from_disk(tmp_path):
    path = tmp_path / "doc.pdf"
    path.write_bytes(make_pdf(["from disk"]))
    assert "from disk" in parse_file(path).text


class UpperParser(Parser):
    def parse(self, data, *, filename):
        return ParsedDocument(text=data.decode().upper(), content_type="text/x-shout")


def test_registry_can_be_extended_and_disabled(settings):
    settings.DJANGO_RAG = {"PARSERS": {".shout": UpperParser, "pdf": None}}
    assert parse_bytes(b"hey", filename="x.shout").text == "HEY"
    with pytest.raises(UnsupportedFileType):
        get_parser("x.pdf")


@pytest.mark.skipif(
    not __import__("pathlib").Path(__file__).parent.parent.joinpath("../shared/data/pdfs").exists(),
    reason="needs ../shared/data/pdfs",
)
def test_real_pdfs_from_shared_data():
    from pathlib import Path

    folder = Path(__file__).parent.parent / "../shared/data/pdfs"
    with pytest.raises(EncryptedPDF):
        parse_file(folder / "encrypted_password_openpassword.pdf")
    with (
        override_settings(DJANGO_RAG={"EMBEDDER": "hashing", "OCR": "off"}),
        pytest.raises(NoTextLayer),
    ):
        parse_file(folder / "scanned_image_only_no_text_layer.pdf")  # OCR: tests/test_ocr.py
    parsed = parse_file(folder / "paper_dpr_two_column_13p.pdf")
    assert len(parsed.pages) == 13 and "retrieval" in parsed.text.lower()
