"""Chunkers split a document's text into spans sized for the embedder.

Every chunk carries ``start``/``end`` character offsets such that
``text[chunk.start:chunk.end] == chunk.text``.
"""

from __future__ import annotations

import bisect
import inspect
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..conf import build_component, get_setting
from ..exceptions import InvalidOption

if TYPE_CHECKING:
    from ..embeddings.base import Embedder

FORMATS = ("text", "markdown")


@dataclass
class TextChunk:
    text: str
    start: int | None
    end: int | None
    token_count: int
    metadata: dict[str, Any] = field(default_factory=dict)


class Chunker:
    """Base class: implement :meth:`chunk`.

    ``embedder`` is the embedder the chunks are for; a chunker may use its tokenizer
    (:meth:`Embedder.token_offsets`) and window (:attr:`Embedder.max_tokens`) for sizing.
    """

    def chunk(
        self, text: str, *, format: str = "text", embedder: Embedder | None = None
    ) -> list[TextChunk]:
        raise NotImplementedError


# --- the default: token-aware recursive boundaries -------------------------------------------

# Fallback tokens when the embedder has no tokenizer: words cut into pieces of at most 8
# characters (close to sub-word tokenizers on English), and each punctuation mark on its own.
_FALLBACK_TOKEN = re.compile(r"\w{1,8}|[^\w\s]", re.UNICODE)
_HEADING = re.compile(r"#{1,6}\s")
_SENTENCE_END = frozenset(".!?;。！？")
_BLOCK_CHARS = 200_000

# Break strengths: the chunker ends a chunk at the strongest break it can find.
HEADING, PARAGRAPH, LINE, SENTENCE, WORD, PUNCT, NONE = 6, 5, 4, 3, 2, 1, 0


class TokenChunker(Chunker):
    """Splits text into chunks of at most ``chunk_size`` tokens with ``chunk_overlap`` overlap.

    Tokens come from the embedder's own tokenizer when it has one, so no chunk exceeds the model
    window (``chunk_size`` is lowered to the window when it is larger). Chunks end at the
    strongest boundary in the second half of the window: a Markdown heading, a blank line, a line
    break, a sentence end, a space, and only as a last resort inside a word.
    """

    def __init__(self, *, chunk_size: int = 200, chunk_overlap: int = 40):
        for name, value, minimum in (
            ("chunk_size", chunk_size, 1),
            ("chunk_overlap", chunk_overlap, 0),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
                raise InvalidOption(
                    f"{name} must be an integer >= {minimum}, got {value!r}", option=name
                )
        if chunk_overlap >= chunk_size:
            raise InvalidOption(
                f"chunk_overlap ({chunk_overlap}) must be smaller than chunk_size ({chunk_size}); "
                "both are counted in tokens. Lower the overlap or raise the size.",
                option="chunk_overlap",
            )
        self.chunk_size = chunk_size
        self.chunk_overlap = chunk_overlap

    def chunk(
        self, text: str, *, format: str = "text", embedder: Embedder | None = None
    ) -> list[TextChunk]:
        if format not in FORMATS:
            raise InvalidOption(
                f"format must be one of {', '.join(FORMATS)}, got {format!r}", option="format"
            )
        spans = _token_spans(text, embedder)
        if not spans:
            return []
        size = self.chunk_size
        window = embedder.max_tokens if embedder is not None else None
        if window and window < size:
            size = window
        overlap = min(self.chunk_overlap, size - 1)
        breaks = _break_strengths(text, spans, markdown=format == "markdown")
        tables = markdown_tables(text) if format == "markdown" else []
        starts = [table.start for table in tables]
        if tables:
            _keep_rows_whole(text, spans, breaks, tables)

        chunks: list[TextChunk] = []
        n = len(spans)
        i = 0
        while i < n:
            stop = min(n, i + size)
            if stop < n:
                # Choose the strongest break in the second half; among equals, the latest.
                lowest = i + max(1, size // 2)
                best = stop
                for k in range(stop, lowest - 1, -1):
                    if breaks[k] > breaks[best]:
                        best = k
                        if breaks[k] == HEADING:
                            break
                stop = best
            start_char, end_char = spans[i][0], spans[stop - 1][1]
            chunk = TextChunk(
                text=text[start_char:end_char],
                start=start_char,
                end=end_char,
                token_count=stop - i,
            )
            header = _header_above(text, tables, starts, start_char) if tables else None
            if header:
                chunk.metadata["table_header"] = header
            chunks.append(chunk)
            if stop >= n:
                break
            i = _overlap_start(breaks, i, stop, overlap)
            if tables and breaks[i] == NONE and i < stop:
                i = stop  # an overlap starting inside a table row: no overlap instead
        return chunks


# A GitHub-flavoured Markdown table's delimiter row: "|---|:--:|" (pipes, dashes, colons).
_TABLE_RULE = re.compile(r"\|(?:[ \t]*:?-+:?[ \t]*\|)+[ \t]*$")


@dataclass(frozen=True)
class MarkdownTable:
    start: int  # the header row's first character
    body: int  # the first data row's first character (== end when there is none)
    end: int  # just past the last row


def markdown_tables(text: str) -> list[MarkdownTable]:
    """The Markdown tables of ``text``: a line starting with ``|``, a delimiter row, and the
    ``|`` lines that follow. One pass over the lines."""
    tables: list[MarkdownTable] = []
    position, length = 0, len(text)
    previous: tuple[int, int] | None = None  # the last line, when it starts with "|"
    while position < length:
        line_end = text.find("\n", position)
        if line_end < 0:
            line_end = length
        if text.startswith("|", position):
            if previous is not None and _TABLE_RULE.match(text, position, line_end):
                end = line_end
                cursor = line_end + 1
                while cursor < length and text.startswith("|", cursor):
                    row_end = text.find("\n", cursor)
                    end = length if row_end < 0 else row_end
                    cursor = end + 1
                body = min(line_end + 1, end)
                tables.append(MarkdownTable(previous[0], body, end))
                previous = None
                position = cursor
                continue
            previous = (position, line_end)
        else:
            previous = None
        position = line_end + 1
    return tables


def _keep_rows_whole(
    text: str, spans: Sequence[tuple[int, int]], breaks: list[int], tables: list[MarkdownTable]
) -> None:
    """Inside a table a chunk may end only between rows, never inside one (unless the row is
    longer than half a chunk); it ends inside the header rows only where nothing else fits.
    Linear: each token looks back only across the gap since the previous token."""
    index, count = 0, len(spans)
    for table in tables:
        while index < count and spans[index][0] <= table.start:
            index += 1
        previous_end = table.start
        while index < count and spans[index][0] < table.end:
            start = spans[index][0]
            at_row_start = text.find("\n", previous_end, start) >= 0
            if not at_row_start:
                breaks[index] = NONE
            elif start <= table.body:
                breaks[index] = PUNCT  # the header's delimiter row, or the first data row
            previous_end = spans[index][1]
            index += 1


def _header_above(text: str, tables: list[MarkdownTable], starts: list[int], start: int):
    """The header rows (header and delimiter) of the table whose body ``start`` is in."""
    at = bisect.bisect_right(starts, start) - 1
    if at < 0:
        return None
    table = tables[at]
    if table.body <= start < table.end:
        return text[table.start : table.body].rstrip("\n")
    return None


def _overlap_start(breaks: list[int], start: int, stop: int, overlap: int) -> int:
    """First token of the chunk after [start, stop): ``overlap`` tokens back, on a word start.

    Looks back up to ``overlap`` more tokens, then forward, for a word boundary, so the overlap
    does not begin mid-word; the next chunk always starts after ``start``.
    """
    if not overlap:
        return stop
    target = max(start + 1, stop - overlap)
    for k in range(target, max(start, target - overlap), -1):
        if breaks[k] >= WORD:
            return k
    for k in range(target + 1, stop):
        if breaks[k] >= WORD:
            return k
    return target


def _token_spans(text: str, embedder: Embedder | None) -> list[tuple[int, int]]:
    if not text or text.isspace():
        return []
    tokenizer = getattr(embedder, "token_offsets", None)
    spans: list[tuple[int, int]] = []
    for block_start, block in _blocks(text):
        offsets = tokenizer(block) if tokenizer is not None else None
        if offsets is None:
            offsets = [m.span() for m in _FALLBACK_TOKEN.finditer(block)]
        spans.extend((block_start + s, block_start + e) for s, e in offsets if e > s)
    return spans


def _blocks(text: str):
    """Yield (offset, block) pieces of at most about _BLOCK_CHARS, cut at whitespace."""
    position = 0
    length = len(text)
    while position < length:
        end = min(length, position + _BLOCK_CHARS)
        if end < length:
            cut = max(text.rfind(" ", position, end), text.rfind("\n", position, end))
            if cut > position:
                end = cut
        yield position, text[position:end]
        position = end


def _break_strengths(text: str, spans: Sequence[tuple[int, int]], *, markdown: bool) -> list[int]:
    """breaks[k] = how good it is to end a chunk just before token k (breaks[n] = end of text)."""
    n = len(spans)
    breaks = [NONE] * (n + 1)
    breaks[n] = HEADING
    for k in range(1, n):
        prev_end, start = spans[k - 1][1], spans[k][0]
        gap = text[prev_end:start]
        if "\n" in gap:
            if markdown and _HEADING.match(text, start):
                breaks[k] = HEADING
            elif gap.count("\n") > 1:
                breaks[k] = PARAGRAPH
            else:
                breaks[k] = LINE
        elif gap and gap.isspace():
            breaks[k] = SENTENCE if text[prev_end - 1] in _SENTENCE_END else WORD
        elif not text[start].isalnum() or not text[prev_end - 1].isalnum():
            breaks[k] = PUNCT
    return breaks


# --- custom chunkers --------------------------------------------------------------------------


class CallableChunker(Chunker):
    """Wraps ``func(text, format=...) -> list[str | dict | TextChunk]``.

    Strings are located in the source text so they get offsets when they appear verbatim.
    """

    def __init__(self, func: Callable[..., Sequence[Any]], **options: Any):
        self.func = func
        # Options (``chunk_size``, ``chunk_overlap``, per call or in OPTIONS) reach the function
        # as keyword arguments when it declares them; otherwise they would be silently lost
        # (or fail as a bare TypeError), so refuse them here, saying what to do.
        refused = [name for name in options if not _takes_keyword(func, name)]
        if refused:
            name = getattr(func, "__qualname__", None) or type(func).__name__
            raise InvalidOption(
                f"the chunker function {name!r} does not take {', '.join(map(repr, refused))}: "
                f"add {'those keyword parameters' if len(refused) > 1 else 'a keyword parameter'}"
                " (or **options) to it, drop the option, or use a Chunker class that takes it",
                option=refused[0],
            )
        self.options = options

    def chunk(
        self, text: str, *, format: str = "text", embedder: Embedder | None = None
    ) -> list[TextChunk]:
        chunks: list[TextChunk] = []
        cursor = 0
        for item in self.func(text, format=format, **self.options):
            if isinstance(item, TextChunk):
                chunks.append(item)
                continue
            metadata: dict[str, Any] = {}
            if isinstance(item, dict):
                metadata = dict(item.get("metadata") or {})
                item = item["text"]
            if not isinstance(item, str):
                raise InvalidOption(
                    f"custom chunker returned {type(item).__name__}; return strings, dicts with "
                    "'text', or TextChunk objects",
                    option="chunker",
                )
            if not item.strip():
                continue
            found = text.find(item, cursor)
            if found < 0:
                found = text.find(item)
            start, end = (found, found + len(item)) if found >= 0 else (None, None)
            if found >= 0:
                cursor = found + 1
            tokens = embedder.count_tokens(item) if embedder is not None else None
            chunks.append(
                TextChunk(
                    text=item,
                    start=start,
                    end=end,
                    token_count=tokens
                    if tokens is not None
                    else len(_FALLBACK_TOKEN.findall(item)),
                    metadata=metadata,
                )
            )
        return chunks


def _takes_keyword(func: Callable[..., Any], name: str) -> bool:
    try:
        parameters = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):  # no signature (some builtins): assume it takes nothing
        return False
    return any(
        p.kind is p.VAR_KEYWORD
        or (p.name == name and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD))
        for p in parameters
    )


ALIASES = {
    "token": "django_rag.ingestion.chunkers.TokenChunker",
    "default": "django_rag.ingestion.chunkers.TokenChunker",
}


def chunk_options(chunk_size: int | None, chunk_overlap: int | None) -> dict[str, int]:
    """The per-call chunker options given (None: the chunker's own default)."""
    sizes = (("chunk_size", chunk_size), ("chunk_overlap", chunk_overlap))
    return {key: value for key, value in sizes if value is not None}


def get_chunker(spec: Any = None, **options: Any) -> Chunker:
    """Return the chunker for ``spec`` (or the configured one), with per-call ``options``.

    ``options`` (``chunk_size``, ``chunk_overlap``) are merged over the configured options of
    the default chunker.
    """
    if spec is None:
        spec = get_setting("CHUNKER")
        if options:
            if isinstance(spec, dict):
                spec = {
                    "BACKEND": spec["BACKEND"],
                    "OPTIONS": {**spec.get("OPTIONS", {}), **options},
                }
            else:
                spec = {"BACKEND": spec, "OPTIONS": options}
    elif options:
        spec = {"BACKEND": spec, "OPTIONS": options}
    return build_component(
        spec, setting="CHUNKER", base=Chunker, aliases=ALIASES, wrap_callable=CallableChunker
    )
