"""Image files (PNG, JPEG, TIFF) read by OCR as one page; refused, with the reason and the fix,
when no engine reads them or the file is hostile (tests/test_formats_hostile.py measures the
bombs in a subprocess)."""

import io
import os

import pytest
from django.test import override_settings

import django_rag as rag
from django_rag.exceptions import (
    CorruptFile,
    DocumentTooLarge,
    EmptyDocument,
    NoTextLayer,
    UnsupportedFileType,
)
from django_rag.ingestion import ocr
from django_rag.ingestion.isolation import parse_isolated
from django_rag.ingestion.parsers import get_parser, image, parse_bytes, parse_file, parser_registry
from django_rag.models import Chunk

PIL = pytest.importorskip("PIL", reason="Pillow comes with the ocr extra")
from PIL import Image, ImageDraw, ImageFont  # noqa: E402

pytestmark = pytest.mark.django_db

LINES = ["Quarterly invoice reconciliation", "Warehouse inventory audit"]
WORDS = ("quarterly", "invoice", "reconciliation", "warehouse", "inventory", "audit")
needs_rapidocr = pytest.mark.skipif(
    not ocr.has_rapidocr(), reason="rapidocr-onnxruntime (the ocr extra) is not installed"
)
RAPID = {"EMBEDDER": "hashing", "OCR": "rapidocr"}


def picture(lines=LINES, *, mode="RGB", size=(1300, 360), background="white") -> Image.Image:
    """An image of ``lines`` drawn large, black on ``background``."""
    canvas = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(canvas)
    font = ImageFont.load_default(size=56)
    for n, line in enumerate(lines):
        draw.text((40, 50 + 130 * n), line, fill="black", font=font)
    if mode == "RGBA":  # the text on a transparent background
        grey = canvas.convert("L")
        result = Image.new("RGBA", size, (0, 0, 0, 0))
        result.putalpha(grey.point(lambda v: 255 - v))
        return result
    return canvas.convert(mode)


def encoded(img: Image.Image, fmt: str, **options) -> bytes:
    out = io.BytesIO()
    img.save(out, fmt, **options)
    return out.getvalue()


def assert_read(text: str) -> None:
    folded = text.casefold()
    for word in WORDS:
        assert word in folded, text


@needs_rapidocr
def test_images_are_in_the_registry_while_an_engine_reads_them(monkeypatch):
    for extension in (".png", ".jpg", ".jpeg", ".tif", ".tiff"):
        assert isinstance(get_parser(f"scan{extension}"), image.ImageParser)
    with override_settings(DJANGO_RAG={"OCR": "off"}):
        assert ".png" not in parser_registry()
    monkeypatch.setattr(ocr, "has_rapidocr", lambda: False)
    monkeypatch.setattr(ocr.shutil, "which", lambda name: None)
    assert not {".png", ".jpg", ".tif"} & set(parser_registry())
    # A project's own entry stands, engine or not.
    with override_settings(DJANGO_RAG={"PARSERS": {".png": image.ImageParser}}):
        assert ".png" in parser_registry()


@needs_rapidocr
def test_a_png_is_read_by_ocr_and_searchable(tmp_path):
    path = tmp_path / "receipt.png"
    path.write_bytes(encoded(picture(), "PNG"))
    with override_settings(DJANGO_RAG=RAPID):
        document = rag.ingest_file(path, collection="images")
    assert_read(document.content)
    assert document.metadata["ocr_pages"] == [1]
    assert document.metadata["ocr_engine"] == "rapidocr"
    assert document.metadata["image_size"] == [1300, 360]
    assert document.content_type == "image/png"
    [hit] = rag.search("warehouse inventory", mode="fulltext", collection="images", limit=1)
    chunk = Chunk.objects.get(pk=hit.chunk_id)
    assert (chunk.document_id, chunk.page_start, chunk.page_end) == (document.pk, 1, 1)


@needs_rapidocr
@pytest.mark.parametrize(
    "filename, data",
    [
        ("photo.jpg", lambda: encoded(picture(), "JPEG", quality=85)),
        ("fax.tiff", lambda: encoded(picture(mode="L"), "TIFF", compression="tiff_lzw")),
        ("overlay.png", lambda: encoded(picture(mode="RGBA"), "PNG")),  # flattened onto white
        ("palette.png", lambda: encoded(picture(mode="P"), "PNG")),
    ],
    ids=["jpeg", "tiff", "transparent-png", "palette-png"],
)
def test_other_formats_and_modes_are_read(filename, data):
    with override_settings(DJANGO_RAG=RAPID):
        parsed = parse_bytes(data(), filename=filename)
    assert_read(parsed.text)
    assert [(p.number, p.start, p.end) for p in parsed.pages] == [(1, 0, len(parsed.text))]


@needs_rapidocr
def test_a_large_jpeg_is_decoded_at_a_reduced_scale(monkeypatch):
    monkeypatch.setattr(image, "MAX_PIXELS", 600_000)  # the picture is 2600 x 720: 1.9 MP
    data = encoded(picture(size=(2600, 720)).resize((2600, 720)), "JPEG", quality=90)
    with override_settings(DJANGO_RAG=RAPID):
        parsed = parse_bytes(data, filename="big.jpg")
    assert parsed.metadata["image_size"] == [1300, 360]  # decoded at 1/2, not refused
    assert "quarterly" in parsed.text.casefold()
    # A PNG cannot be decoded smaller: the same size is refused before decoding.
    with pytest.raises(DocumentTooLarge, match="2,600 x 720 pixels"):
        with override_settings(DJANGO_RAG=RAPID):
            parse_bytes(encoded(picture(size=(2600, 720)), "PNG"), filename="big.png")


@needs_rapidocr
def test_images_are_read_in_the_memory_limited_parse_child():
    with override_settings(DJANGO_RAG=RAPID):
        parsed = parse_isolated(encoded(picture(), "PNG"), filename="scan.png")
    assert_read(parsed.text)
    assert parsed.metadata["ocr_pages"] == [1]


@needs_rapidocr
def test_a_blank_image_is_an_empty_document():
    with override_settings(DJANGO_RAG=RAPID), pytest.raises(EmptyDocument, match="no text"):
        parse_bytes(encoded(Image.new("L", (400, 300), 255), "PNG"), filename="blank.png")


def test_without_an_engine_an_image_is_refused_naming_the_extra(monkeypatch, tmp_path):
    monkeypatch.setattr(ocr, "has_rapidocr", lambda: False)
    monkeypatch.setattr(ocr.shutil, "which", lambda name: None)
    data = encoded(picture(), "PNG")
    with pytest.raises(UnsupportedFileType, match=r"OCR.*pip install 'django-rag\[ocr\]'") as e:
        parse_bytes(data, filename="scan.png")
    assert e.value.code == "unsupported_file_type"
    with override_settings(DJANGO_RAG={"OCR": "off"}):
        with pytest.raises(UnsupportedFileType, match=r"DJANGO_RAG\['OCR'\] is 'off'"):
            parse_bytes(data, filename="scan.png")
    # A folder's photos are skipped as an unsupported type, not failures.
    (tmp_path / "notes.txt").write_text("Typed notes about the warehouse.")
    (tmp_path / "photo.jpg").write_bytes(encoded(picture(), "JPEG"))
    with override_settings(DJANGO_RAG={"EMBEDDER": "hashing"}):
        report = rag.sync_folder(tmp_path, collection="folder")
    assert (report.added, report.failed) == (["notes.txt"], {})
    assert [entry.path.name for entry in report.skipped] == ["photo.jpg"]
    # The parser itself, registered by hand, refuses with NoTextLayer, naming the fix too.
    with pytest.raises(NoTextLayer, match=r"no OCR engine.*django-rag\[ocr\]") as e:
        image.ImageParser().parse(data, filename="scan.png")
    assert e.value.details["pages_without_text"] == [1]


@needs_rapidocr
def test_an_engine_failure_is_reported_not_swallowed(monkeypatch):
    def broken(png):
        raise RuntimeError("model file missing")

    monkeypatch.setattr(ocr, "read_rapidocr", broken)
    with override_settings(DJANGO_RAG=RAPID):
        with pytest.raises(NoTextLayer, match="OCR failed.*model file missing"):
            parse_bytes(encoded(picture(), "PNG"), filename="scan.png")


@needs_rapidocr
def test_damaged_and_disguised_files_are_corrupt():
    with override_settings(DJANGO_RAG=RAPID):
        with pytest.raises(CorruptFile, match="truncated"):
            data = encoded(picture(), "PNG", compress_level=0)
            parse_bytes(data[: len(data) // 2], filename="cut.png")
        with pytest.raises(CorruptFile, match="not a PNG, JPEG or TIFF"):
            parse_bytes(b"%PDF-1.7 not an image at all", filename="fake.png")
        # Formats outside the three are not tried, whatever the extension says.
        with pytest.raises(CorruptFile, match="not a PNG, JPEG or TIFF"):
            parse_bytes(encoded(picture(), "GIF"), filename="anim.png")


@needs_rapidocr
def test_a_file_bigger_than_any_image_within_the_cap_is_refused_unread(tmp_path):
    path = tmp_path / "huge.tif"
    with open(path, "wb") as file:
        file.truncate(image.MAX_IMAGE_BYTES + 1)  # sparse: nothing is written or read
    with override_settings(DJANGO_RAG=RAPID):
        with pytest.raises(DocumentTooLarge, match="refused unread") as caught:
            parse_file(path)
    assert caught.value.details["size"] == os.path.getsize(path)
