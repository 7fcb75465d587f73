"""Reading scanned PDF pages: OCR of pages that have no text layer.

A page of a scan is an image: its text layer is empty, and without OCR it would add nothing to
the document, silently. The PDF parser hands every such page (no text, at least one image) to
:class:`ScannedPages`, which renders it and reads it with an OCR engine:

* ``"rapidocr"``: `RapidOCR <https://github.com/RapidAI/RapidOCR>`_ (the ``rapidocr-onnxruntime``
  package, extra ``django-rag[ocr]``). Its detection, direction and recognition models ship
  inside the wheel (about 15 MB) and run on onnxruntime on the CPU, so it installs from the
  package index alone and runs offline. Chosen over EasyOCR and docTR (both need torch and
  download their weights on first use) and PaddleOCR (a large framework of its own).
* ``"tesseract"``: the ``tesseract`` program (Debian: ``apt install tesseract-ocr``), run as a
  child process with a timeout; the fallback where the wheel cannot be installed.

``DJANGO_RAG["OCR"]`` picks one (``"auto"``, the default: RapidOCR when installed, else
Tesseract when on the ``PATH``, else none; ``"off"``: never). Without an engine (or past the
budgets) an image-only page is not read, and the document says so, page by page: its
``metadata["pages_without_text"]`` lists the page numbers and ``metadata["parse_warnings"]``
says why and what to do (the dashboard's document page shows them). A PDF none of whose pages
could be read still fails with :class:`~django_rag.exceptions.NoTextLayer`.

Image files (PNG, JPEG, TIFF) come through :meth:`ScannedPages.read_image` too, from
``parsers/image.py``: one page each, same engine and budgets.

Budgets: a page is rendered at ``OCR_DPI`` but at most :data:`MAX_PIXELS` pixels (a huge page
is rendered at a lower resolution: memory and time per page stay bounded), and for RapidOCR at
most :data:`RAPIDOCR_MAX_SIDE` pixels a side (it scales every image down to that itself, so
nothing larger is decoded or encoded for it); at most
``OCR_MAX_PAGES`` pages of a document are read; and OCR time counts towards the document's
``PARSE_TIMEOUT``: a page is read only while the time left is more than the slowest page so far
took (the others are listed as not read, the document is still ingested).

Memory: OCR runs in the bounded parse worker (``MAX_PARSE_MEMORY``) like the rest of a parse.
The engine (its models, onnxruntime's sessions) is loaded once per worker outside the budget
(it costs the same whatever the input: :func:`~django_rag.ingestion.budget.outside_budget`),
with one inference thread, so what a page adds is bounded by the pixel caps: about 650 MB of
address space for a 16-megapixel image. A page that still runs out of memory is reported as
such (an image file: :class:`~django_rag.exceptions.DocumentTooLarge` naming
``MAX_PARSE_MEMORY``), and an engine's failure is reported by its type and first line, without
tracebacks or file paths.
"""

from __future__ import annotations

import importlib.util
import math
import shutil
import subprocess
import time
from collections.abc import Callable
from typing import Any

from ..conf import get_setting
from ..exceptions import MissingDependency, NoTextLayer
from ..utils import load_once, scrub_paths
from .budget import out_of_memory, outside_budget

ENGINES = ("auto", "rapidocr", "tesseract", "off")
#: The most pixels a page is rendered to (about 4,000 x 4,000): 48 MB of RGB at most.
MAX_PIXELS = 16_000_000
#: The longest side RapidOCR reads (its ``max_side_len``: it scales larger images down to it).
RAPIDOCR_MAX_SIDE = 2000
#: An image of more pixels than this (at most RAPIDOCR_MAX_SIDE a side) is read by RapidOCR in
#: horizontal bands BAND_HEIGHT tall, overlapping by BAND_OVERLAP: its text detection takes about
#: 220 bytes of memory a pixel, so a whole 2,000 x 2,000 image (what a 16-megapixel one is
#: read at) took 900 MB, a band of 2,000 x 800 takes 350. A line is kept from the band whose
#: share of the overlap holds its middle, so a line up to BAND_OVERLAP tall is read once, whole.
BAND_PIXELS = 2_000_000
BAND_HEIGHT = 800
BAND_OVERLAP = 192
#: Why a page was not read when OCR ran out of the parse's memory.
OUT_OF_MEMORY = "OCR needed more memory than MAX_PARSE_MEMORY allows"


def has_rapidocr() -> bool:
    return importlib.util.find_spec("rapidocr_onnxruntime") is not None


def engine_name(setting: str | None = None) -> str | None:
    """The engine ``OCR`` selects here (None: no OCR). A named engine that is not installed
    raises :class:`~django_rag.exceptions.MissingDependency`."""
    choice = get_setting("OCR") if setting is None else setting
    if choice == "off":
        return None
    if choice == "rapidocr":
        if not has_rapidocr():
            raise MissingDependency("rapidocr-onnxruntime", "ocr", "OCR of scanned PDF pages")
        return "rapidocr"
    if choice == "tesseract":
        if shutil.which("tesseract") is None:
            raise MissingDependency(
                "tesseract (the program: apt install tesseract-ocr)",
                "ocr",
                "OCR of scanned PDF pages with OCR='tesseract'",
            )
        return "tesseract"
    if has_rapidocr():
        return "rapidocr"
    if shutil.which("tesseract") is not None:
        return "tesseract"
    return None


def _rapidocr():
    # Loaded outside the parse's budget: the models and sessions cost the same for any input.
    # One inference thread: each thread of onnxruntime's pool reserves address space of its
    # own, so their number (the machine's cores) would decide whether a page fits the budget.
    with outside_budget():
        from rapidocr_onnxruntime import RapidOCR

        return RapidOCR(
            max_side_len=RAPIDOCR_MAX_SIDE, intra_op_num_threads=1, inter_op_num_threads=1
        )


def _lines(boxes: list[tuple[float, float, float, str]]) -> str:
    """Words found at ``(top, bottom, left, text)`` as lines in reading order: boxes whose
    vertical middle falls inside the current line's span join it, left to right."""
    lines: list[list[tuple[float, str]]] = []
    span = (math.inf, -math.inf)
    for top, bottom, left, text in sorted(boxes, key=lambda box: (box[0], box[2])):
        middle = (top + bottom) / 2
        if lines and span[0] <= middle <= span[1]:
            lines[-1].append((left, text))
            span = (min(span[0], top), max(span[1], bottom))
        else:
            lines.append([(left, text)])
            span = (top, bottom)
    return "\n".join(" ".join(text for _, text in sorted(line)) for line in lines)


def _bands(height: int, width: int) -> list[tuple[int, int, float, float]]:
    """(top, bottom, keep_from, keep_to) of each band an image is read in: a line found in a
    band is kept when its middle lies in [keep_from, keep_to), the band's share of the image."""
    if width * height <= BAND_PIXELS or height <= BAND_HEIGHT:
        return [(0, height, -math.inf, math.inf)]
    step = BAND_HEIGHT - BAND_OVERLAP
    tops = list(range(0, height - BAND_HEIGHT, step)) + [height - BAND_HEIGHT]
    cuts = [-math.inf]
    cuts += [(tops[i] + BAND_HEIGHT + tops[i + 1]) / 2 for i in range(len(tops) - 1)]
    cuts.append(math.inf)
    return [(top, top + BAND_HEIGHT, cuts[i], cuts[i + 1]) for i, top in enumerate(tops)]


def read_rapidocr(png: bytes) -> str:
    import io

    from PIL import Image

    engine = load_once(("django_rag.ocr", "rapidocr"), _rapidocr)
    image = Image.open(io.BytesIO(png), formats=("PNG", "JPEG"))
    image.load()
    if max(image.size) > RAPIDOCR_MAX_SIDE:  # RapidOCR would scale it down to this itself
        ratio = RAPIDOCR_MAX_SIDE / max(image.size)
        size = (max(1, round(image.width * ratio)), max(1, round(image.height * ratio)))
        image = image.resize(size, Image.Resampling.LANCZOS)
    boxes = []
    for top, bottom, keep_from, keep_to in _bands(image.height, image.width):
        band = (
            image
            if (top, bottom) == (0, image.height)
            else image.crop((0, top, image.width, bottom))
        )
        found, _ = engine(band)
        for points, text, _score in found or ():
            if not isinstance(text, str) or not text.strip():
                continue
            ys = [float(point[1]) + top for point in points]
            xs = [float(point[0]) for point in points]
            if keep_from <= (min(ys) + max(ys)) / 2 < keep_to:
                boxes.append((min(ys), max(ys), min(xs), text.strip()))
    return _lines(boxes)


def read_tesseract(png: bytes, timeout: float | None) -> str:
    done = subprocess.run(
        ["tesseract", "stdin", "stdout"],
        input=png,
        capture_output=True,
        timeout=timeout,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(done.stderr.decode("utf-8", "replace")[:200] or "tesseract failed")
    return done.stdout.decode("utf-8", "replace")


class ScannedPages:
    """Reads the image-only pages of one PDF and records what it did (see the module).

    The parser calls :meth:`read` for a page without text and :meth:`metadata` at the end; it
    raises :meth:`no_text_error` when no page had text."""

    def __init__(self, filename: str, *, started: float, timeout: float | None):
        self.filename = filename
        self.started = started
        self.timeout = timeout
        self.engine = engine_name()
        self.dpi = int(get_setting("OCR_DPI"))
        self.max_pages = get_setting("OCR_MAX_PAGES")
        self.read_pages: list[int] = []
        self.unread: dict[int, str] = {}  # page number: why it was not read
        self.slowest = 0.0
        self.out_of_memory = False  # a page failed for MAX_PARSE_MEMORY

    def read(self, page: Any, number: int) -> str:
        """The OCR text of ``page`` (a pymupdf page whose text layer is empty), or "" when it
        is not read (blank pages, no engine, a budget spent, a failure: recorded)."""
        try:
            if not page.get_images(full=False):
                return ""  # a blank page (or vector drawings only): nothing to read
        except Exception:
            return ""
        return self.read_image(lambda: self._render(page), number)

    def read_image(self, render: Callable[[], bytes], number: int) -> str:
        """The OCR text of the image ``render()`` returns (PNG or JPEG bytes, already within
        :data:`MAX_PIXELS`), as page ``number``; "" when it is not read (recorded). Scanned
        PDF pages and image files (``parsers/image.py``) both come through here."""
        reason = self._refusal()
        if reason:
            self.unread[number] = reason
            return ""
        begun = time.monotonic()
        try:
            png = render()
            if self.engine == "rapidocr":
                text = read_rapidocr(png)
            else:
                text = read_tesseract(png, self._time_left())
        except Exception as exc:  # a damaged image or an engine failure: that page only
            if out_of_memory(exc):
                self.out_of_memory = True
                self.unread[number] = OUT_OF_MEMORY
            else:
                self.unread[number] = f"OCR failed ({failure(exc)})"
            return ""
        finally:
            self.slowest = max(self.slowest, time.monotonic() - begun)
        text = text.replace("\x00", "").strip()
        if text:
            self.read_pages.append(number)
        return text

    def _time_left(self) -> float | None:
        if self.timeout is None:
            return None
        return self.timeout - (time.monotonic() - self.started)

    def _refusal(self) -> str:
        if self.engine is None:
            return "no OCR engine"
        if self.max_pages is not None and len(self.read_pages) >= self.max_pages:
            return f"OCR_MAX_PAGES ({self.max_pages}) pages already read"
        left = self._time_left()
        if left is not None and left <= self.slowest:
            return "PARSE_TIMEOUT nearly spent"
        return ""

    def _render(self, page: Any) -> bytes:
        rect = page.rect
        scale = self.dpi / 72
        pixels = rect.width * scale * rect.height * scale
        if pixels > MAX_PIXELS:
            scale *= math.sqrt(MAX_PIXELS / pixels)
        side = max(rect.width, rect.height) * scale
        if self.engine == "rapidocr" and side > RAPIDOCR_MAX_SIDE:
            scale *= RAPIDOCR_MAX_SIDE / side
        import pymupdf

        pixmap = page.get_pixmap(matrix=pymupdf.Matrix(scale, scale), alpha=False)
        return pixmap.tobytes("png")

    def metadata(self) -> dict[str, Any]:
        """What goes into the document's metadata: the pages read by OCR, the pages not read
        and why (an empty dict when no page needed OCR)."""
        found: dict[str, Any] = {}
        if self.read_pages:
            found["ocr_pages"] = list(self.read_pages)
            found["ocr_engine"] = self.engine
        if self.unread:
            found["pages_without_text"] = sorted(self.unread)
            found["parse_warnings"] = [self._warning(reason) for reason in self._grouped()]
        return found

    def _grouped(self) -> list[tuple[str, list[int]]]:
        groups: dict[str, list[int]] = {}
        for number, reason in sorted(self.unread.items()):
            groups.setdefault(reason, []).append(number)
        return list(groups.items())

    def _warning(self, group: tuple[str, list[int]]) -> str:
        reason, numbers = group
        pages = _page_list(numbers)
        if reason == "no OCR engine":
            advice = no_engine_advice()
            return f"{pages}: scanned image without a text layer, not read ({advice})."
        if reason.startswith("PARSE_TIMEOUT"):
            return (
                f"{pages}: scanned image not read, the time budget was spent "
                "(raise DJANGO_RAG['PARSE_TIMEOUT'] and ingest the file again)."
            )
        if reason == OUT_OF_MEMORY:
            return (
                f"{pages}: scanned image not read, {reason} "
                "(raise DJANGO_RAG['MAX_PARSE_MEMORY'] or lower OCR_DPI and ingest the file "
                "again)."
            )
        if reason.startswith("OCR_MAX_PAGES"):
            return (
                f"{pages}: scanned image not read, {reason} "
                "(raise DJANGO_RAG['OCR_MAX_PAGES'] and ingest the file again)."
            )
        return f"{pages}: scanned image not read: {reason}."

    def no_text_error(self) -> NoTextLayer:
        """The error for a PDF none of whose pages gave text."""
        if self.unread:
            (reason, _), *_ = self._grouped()
            why = self._warning((reason, sorted(self.unread)))
            return NoTextLayer(
                f"{self.filename} has no text layer (it looks scanned or image-only). {why}",
                filename=self.filename,
                pages_without_text=sorted(self.unread),
            )
        return NoTextLayer(
            f"{self.filename} has no text layer and no images to read. Check the file, or run "
            "OCR first, for example: ocrmypdf in.pdf out.pdf",
            filename=self.filename,
        )


def failure(exc: BaseException) -> str:
    """An engine's failure as a reader can use it: its type and the first line of its message,
    file paths removed (onnxruntime and OpenCV quote their sources' paths, and a traceback
    in a message says nothing to whoever ingested the file)."""
    lines = str(exc).strip().splitlines()
    first = scrub_paths(lines[0].strip() if lines else "")[:120]
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def no_engine_advice() -> str:
    """What to do when no OCR engine reads images: install one, or turn OCR back on."""
    if get_setting("OCR") == "off":
        return "DJANGO_RAG['OCR'] is 'off'"
    return (
        "install the OCR extra (pip install 'django-rag[ocr]') or Tesseract, then ingest the "
        "file again"
    )


def _page_list(numbers: list[int]) -> str:
    """ "page 3", "pages 1-4, 7" (runs of consecutive pages shortened)."""
    runs: list[list[int]] = []
    for number in numbers:
        if runs and number == runs[-1][-1] + 1:
            runs[-1].append(number)
        else:
            runs.append([number])
    parts = [f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]) for run in runs]
    return ("page " if len(numbers) == 1 else "pages ") + ", ".join(parts)
