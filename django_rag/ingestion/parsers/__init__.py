"""Parsers turn file bytes into text (and page spans), chosen by file extension.

The registry maps extensions to parser classes. A host extends or disables entries with
``DJANGO_RAG["PARSERS"] = {".html": "myapp.parsers.HtmlParser", ".pdf": None}``; an entry may
be a ``(parser, {options})`` pair, and ``DJANGO_RAG["FALLBACK_PARSER"]`` reads any extension no
entry claims.

One module per format; the names below are the package's public surface (and every name
``django_rag.ingestion.parsers`` offered when it was one module). Format modules whose library
is an optional extra are imported only when their parser is first asked for.
"""

from ..pdftext import MAX_LAYOUT_CHARS
from .base import (
    Page,
    ParsedDocument,
    Parser,
    check_input_size,
    check_parsed,
    decode_text,
)
from .pdf import PdfParser
from .pdfcost import MAX_CHARS_PER_CODE, longest_cmap_string
from .registry import (
    BUILTIN_PARSERS,
    available,
    get_parser,
    parse_bytes,
    parse_file,
    parser_formats,
    parser_registry,
    supported_formats,
)
from .text import MarkdownParser, TextParser, markdown_title

__all__ = [
    "BUILTIN_PARSERS",
    "MAX_CHARS_PER_CODE",
    "MAX_LAYOUT_CHARS",
    "MarkdownParser",
    "Page",
    "ParsedDocument",
    "Parser",
    "PdfParser",
    "TextParser",
    "available",
    "check_input_size",
    "check_parsed",
    "decode_text",
    "get_parser",
    "longest_cmap_string",
    "markdown_title",
    "parse_bytes",
    "parse_file",
    "parser_formats",
    "parser_registry",
    "supported_formats",
]
