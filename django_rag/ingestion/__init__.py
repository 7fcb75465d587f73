from .chunkers import CallableChunker, Chunker, TextChunk, TokenChunker, get_chunker
from .parsers import MarkdownParser, ParsedDocument, Parser, PdfParser, TextParser, get_parser

__all__ = [
    "CallableChunker",
    "Chunker",
    "MarkdownParser",
    "ParsedDocument",
    "Parser",
    "PdfParser",
    "TextChunk",
    "TextParser",
    "TokenChunker",
    "get_chunker",
    "get_parser",
]
