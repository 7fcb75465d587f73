"""Document titles from a PDF: its metadata title when it names the document, else the first
heading of its first page.

PDF producers fill the metadata title with whatever they had at hand: the source file's name
("10811.exe", "report_v2.docx", "C:\\work\\draft.tex"), the application's window caption
("Microsoft Word - minutes.doc"), a placeholder ("untitled", "Document1") or a number. Such a
title tells a reader nothing the file name does not, so the text's own heading wins then.
"""

from __future__ import annotations

import re
from statistics import median

from .pdftext import Block

# Extensions of documents, programs and images that tools write into the title field.
_FILE_EXTENSIONS = (
    "ai|bin|bmp|cdr|chm|csv|dat|djvu|doc|docm|docx|dot|dotx|dvi|eps|exe|fm|gif|htm|html|indd|"
    "jpeg|jpg|key|md|mdi|numbers|odg|odp|ods|odt|pages|pdf|png|pps|ppt|pptx|ps|psd|pub|qxd|qxp|"
    "rtf|svg|tex|tif|tiff|tmp|txt|vsd|vsdx|wpd|wps|xls|xlsm|xlsx|xml|xps|zip"
)
_ENDS_IN_FILE_NAME = re.compile(rf"\.(?:{_FILE_EXTENSIONS})\s*$", re.IGNORECASE)
# One word (no space) ending in ".ext": a file name whatever the extension ("scan_0042.q7").
_FILE_NAME = re.compile(r"\S*[\w\-]\.[A-Za-z][A-Za-z0-9]{0,4}")
# A path: "C:\work\draft", "/home/me/draft", "~/draft".
_PATH = re.compile(r"(?:[A-Za-z]:\\|\\\\|/|~/)\S")
# An application's window caption: "Microsoft Word - minutes", "PowerPoint - deck".
_CAPTION = re.compile(
    r"(?:microsoft\s+\w+|word|powerpoint|excel|libreoffice\s*\w*|openoffice\s*\w*)\s+-\s",
    re.IGNORECASE,
)
# A placeholder: "untitled", "Untitled-3", "Document1", "Presentation 2", "(anonymous)".
_PLACEHOLDER = re.compile(
    r"(?:untitled|document|presentation|book|workbook|slide|new\s+document|"
    r"powerpoint\s+presentation)[\s\-_]*\d*|no\s+title|title|none|null|unknown|\(?anonymous\)?",
    re.IGNORECASE,
)
_HEADING_MAX_CHARS = 200


def usable_title(title: str) -> bool:
    """Whether a metadata ``title`` names the document, rather than being a file name, a
    path, an application's caption, a placeholder, or text with no letters at all."""
    title = title.strip()
    if not title or not any(character.isalpha() for character in title):
        return False
    if _ENDS_IN_FILE_NAME.search(title) or _FILE_NAME.fullmatch(title) or _PATH.match(title):
        return False
    return not (_CAPTION.match(title) or _PLACEHOLDER.fullmatch(title))


def _body_size(blocks: list[Block]) -> float:
    """The body text's font size: the median size over the page's characters (0: unknown)."""
    sizes = [line.size for block in blocks for line in block.lines for _ in line.text[:200]]
    return median(sizes) if sizes and min(sizes) > 0 else 0.0


def first_heading(blocks: list[Block]) -> str:
    """The first heading of a page given as blocks in reading order: the first run of lines
    set in the page's largest font, when that font is larger than the body text's; "" when
    no line stands out."""
    body = _body_size(blocks)
    if not body:
        return ""
    largest = max(line.size for block in blocks for line in block.lines)
    if largest < body * 1.15:
        return ""
    for block in blocks:
        run: list[str] = []
        for line in block.lines:
            if abs(line.size - largest) < 0.5:
                run.append(line.text)
            elif run:
                break
        if run:
            return " ".join(run)[:_HEADING_MAX_CHARS].strip()
    return ""


def first_body_line(blocks: list[Block]) -> str:
    """The first line of a page (blocks in reading order) with a word in it, set no smaller
    than the body text: a running header or a line number in a smaller font is skipped."""
    body = _body_size(blocks)
    for block in blocks:
        for line in block.lines:
            if line.size >= body * 0.95 and re.search(r"[^\W\d_]{3}", line.text):
                return line.text[:_HEADING_MAX_CHARS].strip()
    return ""


def first_line(text: str) -> str:
    """The first line of ``text`` with a letter in it, cut to a title's length."""
    for line in text.splitlines():
        if any(character.isalpha() for character in line):
            return line.strip()[:_HEADING_MAX_CHARS]
    return ""


def pdf_title(metadata_title: str, first_page: list[Block] | None, text: str) -> str:
    """The title of a PDF: ``metadata_title`` when :func:`usable_title`; "" when there is none
    (the file name stands for the document then); otherwise the first heading of the first
    page (``first_page``: its blocks in reading order), or its first line in the body's font,
    or the text's first line."""
    metadata_title = metadata_title.strip()
    if not metadata_title or usable_title(metadata_title):
        return metadata_title[:500]
    blocks = first_page or []
    return first_heading(blocks) or first_body_line(blocks) or first_line(text)
