"""Images (PNG, JPEG, TIFF): one page read by OCR, through the engine and budgets of ``ocr.py``.

An image file has no text but what OCR reads, so this parser is the scanned-PDF page path
(:class:`~django_rag.ingestion.ocr.ScannedPages`) with a different way in: Pillow (installed
with the ``ocr`` extra) decodes the file, and the same engine, ``OCR`` setting, time budget and
pixel cap apply. The registry holds the image extensions only while an engine is available
(``registry.py``): without one an image is an unsupported type whose error names the ``ocr``
extra, and this parser, registered by hand, refuses it with
:class:`~django_rag.exceptions.NoTextLayer` (an image has no other text to keep, so there is
no partial document to store with a warning, as there is for a PDF's scanned pages).

Hostile files: the declared size is read from the header and checked before any pixel is
decoded (a decompression bomb declares gigapixels in a few kilobytes); only PNG, JPEG and TIFF
decoders are allowed (Pillow would otherwise try every format it knows, some through external
programs); a truncated or damaged file is :class:`~django_rag.exceptions.CorruptFile`; a
multi-frame file (TIFF pages, animated PNG) is read from its first frame only.
"""

from __future__ import annotations

import io
import mimetypes
import time
import warnings
from typing import Any

from ...exceptions import CorruptFile, DocumentTooLarge, EmptyDocument, NoTextLayer
from ..ocr import MAX_PIXELS, RAPIDOCR_MAX_SIDE, ScannedPages, no_engine_advice
from .base import Page, ParsedDocument, Parser, budget_setting, check_input_size, too_many_chars
from .common import require

FORMATS = ("PNG", "JPEG", "TIFF")
#: The largest image file read: an uncompressed TIFF of MAX_PIXELS pixels with alpha, plus
#: room for its headers. A bigger file cannot be within the pixel cap and is refused unread.
MAX_IMAGE_BYTES = 4 * MAX_PIXELS + (1 << 20)


def _too_many_pixels(filename: str, width: int | None, height: int | None) -> DocumentTooLarge:
    size = f"is {width:,} x {height:,} pixels" if width and height else "declares a gigantic size"
    return DocumentTooLarge(
        f"{filename} {size}: more than the {MAX_PIXELS:,} pixels an image may have to be read "
        "by OCR (about 4,000 x 4,000). Scale it down (a page scanned at 300 dpi is about "
        "2,500 x 3,500) and ingest it again.",
        filename=filename,
        setting=None,
        limit=MAX_PIXELS,
    )


def _open(data: bytes, filename: str) -> Any:
    """The image, decoded within the pixel cap and flattened onto white (grey or RGB)."""
    require("PIL.Image", "ocr", "Reading images", distribution="pillow")
    from PIL import Image, ImageOps, UnidentifiedImageError

    try:
        with warnings.catch_warnings():
            # Pillow warns of a possible bomb from 89 MP on; ours is refused well before that.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data), formats=FORMATS)
        width, height = image.size
        if image.format == "JPEG" and width * height > MAX_PIXELS:
            # JPEG decodes at 1/2, 1/4 or 1/8 scale for free: a 48 MP photo costs 12 MP.
            factor = 1
            while (width // factor) * (height // factor) > MAX_PIXELS and factor < 8:
                factor *= 2
            image.draft("RGB", (width // factor, height // factor))
            width, height = image.size
        if width * height > MAX_PIXELS or width < 1 or height < 1:
            raise _too_many_pixels(filename, width, height)
        image.load()
        image = ImageOps.exif_transpose(image)
        if image.mode in ("RGBA", "LA", "PA") or "transparency" in image.info:
            rgba = image.convert("RGBA")
            image = Image.new("RGB", rgba.size, "white")
            image.paste(rgba, mask=rgba.getchannel("A"))
        elif image.mode not in ("L", "RGB"):
            image = image.convert("RGB")  # palette, 1-bit, 16-bit grey, CMYK, YCbCr...
        return image
    except DocumentTooLarge:
        raise
    except Image.DecompressionBombError as exc:
        raise _too_many_pixels(filename, None, None) from exc  # past Pillow's own cap
    except UnidentifiedImageError as exc:
        raise CorruptFile(
            f"{filename} is not a PNG, JPEG or TIFF image Pillow can read. Check the file, or "
            "convert it to PNG.",
            filename=filename,
        ) from exc
    except (OSError, SyntaxError, ValueError, EOFError, MemoryError) as exc:
        raise CorruptFile(
            f"{filename} is damaged or truncated ({type(exc).__name__}: {str(exc)[:120]}). "
            "Export it again and ingest the new file.",
            filename=filename,
        ) from exc


def _png(image: Any, max_side: int | None = None) -> bytes:
    if max_side is not None and max(image.size) > max_side:
        # The engine would scale it down to this itself: do it before encoding, so neither
        # the PNG nor the engine's decoded copy holds the full image.
        from PIL import Image

        ratio = max_side / max(image.size)
        size = (max(1, round(image.width * ratio)), max(1, round(image.height * ratio)))
        image = image.resize(size, Image.Resampling.LANCZOS)
    out = io.BytesIO()
    image.save(out, "PNG", compress_level=1)  # read once by the engine: speed over size
    return out.getvalue()


class ImageParser(Parser):
    """A PNG, JPEG or TIFF image: its text read by OCR (``DJANGO_RAG["OCR"]``) as one page.

    The document's metadata gets ``ocr_pages`` (``[1]``), ``ocr_engine`` and ``image_size``
    (``[width, height]`` as read). No engine: :class:`~django_rag.exceptions.NoTextLayer`;
    more than :data:`~django_rag.ingestion.ocr.MAX_PIXELS` pixels:
    :class:`~django_rag.exceptions.DocumentTooLarge`; a damaged file:
    :class:`~django_rag.exceptions.CorruptFile`; OCR finds nothing:
    :class:`~django_rag.exceptions.EmptyDocument`."""

    requires = (("PIL", "ocr", "pillow"),)

    content_type = "image/png"

    def max_input_bytes(self) -> int | None:
        return MAX_IMAGE_BYTES

    def input_too_large(self, size: int, limit: int, *, filename: str) -> DocumentTooLarge:
        return DocumentTooLarge(
            f"{filename} has {size:,} bytes: an image within the {MAX_PIXELS:,}-pixel OCR cap "
            f"takes at most {limit:,}, so it was refused unread. Scale it down or compress it "
            "(PNG, JPEG) and ingest it again.",
            filename=filename,
            setting=None,
            size=size,
            limit=limit,
        )

    def parse(self, data: bytes, *, filename: str) -> ParsedDocument:
        started = time.monotonic()
        timeout = budget_setting("PARSE_TIMEOUT", integer=False)
        max_chars = budget_setting("MAX_DOCUMENT_CHARS")
        scans = ScannedPages(filename, started=started, timeout=timeout)
        if scans.engine is None:
            raise NoTextLayer(
                f"{filename} is an image: only OCR can read its text, and no OCR engine is "
                f"available ({no_engine_advice()}).",
                filename=filename,
                pages_without_text=[1],
            )
        check_input_size(self, len(data), filename=filename)  # parse_file checks it unread
        image = _open(data, filename)
        size = list(image.size)
        max_side = RAPIDOCR_MAX_SIDE if scans.engine == "rapidocr" else None
        text = scans.read_image(lambda: _png(image, max_side), 1)
        if not text:
            if scans.out_of_memory:
                raise DocumentTooLarge(
                    f"{filename} ({size[0]:,} x {size[1]:,} pixels): OCR needed more memory "
                    f"than MAX_PARSE_MEMORY allows. Scale the image down, or raise "
                    "DJANGO_RAG['MAX_PARSE_MEMORY'], and ingest it again.",
                    filename=filename,
                    setting="MAX_PARSE_MEMORY",
                    limit=budget_setting("MAX_PARSE_MEMORY"),
                )
            if scans.unread:
                raise NoTextLayer(
                    f"{filename} is an image and OCR did not read it: {scans.unread[1]}.",
                    filename=filename,
                    pages_without_text=[1],
                )
            raise EmptyDocument(
                f"OCR found no text in {filename}. If the image holds text, scan it at a "
                "higher resolution or with more contrast and ingest it again.",
                filename=filename,
            )
        if max_chars is not None and len(text) > max_chars:
            raise too_many_chars(filename, len(text), max_chars)
        metadata = {**scans.metadata(), "image_size": size}
        return ParsedDocument(
            text=text,
            format="text",
            content_type=mimetypes.guess_type(filename)[0] or self.content_type,
            pages=[Page(1, 0, len(text))],
            metadata=metadata,
        )
