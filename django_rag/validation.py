"""Validation of user input, shared by every entry point (API, commands, dashboard, tasks).

Each ``clean_*`` function returns the cleaned value or raises one of the library's typed errors
(:mod:`django_rag.exceptions`) with a message that says what to do. ``check_vectors`` checks what
an embedder returned before it is stored or searched with. The ``*_arg`` functions are argparse
``type=`` converters for the management commands (argparse turns their errors into a usage
message, never a traceback).
"""

from __future__ import annotations

import argparse
import json
import math
import re
from collections.abc import Callable, Sequence
from typing import Any, ParamSpec, TypeVar

import numpy as np

from .conf import get_setting
from .exceptions import (
    DimensionMismatch,
    DocumentTooLarge,
    EmbeddingFailed,
    EmptyDocument,
    InvalidOption,
    InvalidText,
    QueryTooLong,
)

P = ParamSpec("P")
R = TypeVar("R")

# Characters that render as nothing: zero-width space/non-joiner/joiner, word joiner, BOM (zero
# width no-break space), soft hyphen, Mongolian vowel separator. `str.strip()` keeps them, so a
# text made only of them (and whitespace) would pass as non-empty and produce empty chunks.
INVISIBLE = "\u200b\u200c\u200d\u2060\ufeff\u00ad\u180e"
_VISIBLE = re.compile(rf"[^\s{INVISIBLE}]")

# Deeper metadata is refused before json.dumps (which recurses, and a few thousand levels
# exhaust Python's stack); real metadata is a few levels deep.
MAX_METADATA_DEPTH = 100


# C0 controls (NUL, tab and the line breaks among them), DEL and the C1 controls: nothing a
# name, an id or a one-line query holds on purpose, and what terminals, logs and headers misread.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def control_character(value: str) -> int | None:
    """The position of the first control character in ``value`` (C0, DEL, C1), or None."""
    match = _CONTROL.search(value)
    return None if match is None else match.start()


def is_blank(text: str) -> bool:
    """True when ``text`` has nothing visible: only whitespace and zero-width characters."""
    return _VISIBLE.search(text) is None


def _check_unicode(value: str, what: str, error: type[InvalidOption | InvalidText]) -> None:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise error(
            f"{what} is not valid Unicode: unpaired surrogate at character {exc.start}. It was "
            "probably decoded with errors='surrogateescape'; decode it with the right encoding.",
            position=exc.start,
        ) from exc


def clean_string(value: Any, what: str, *, max_length: int) -> str:
    """A str that PostgreSQL can store in a text column: no NUL, valid Unicode, at most
    ``max_length`` characters (``what`` names it in the error)."""
    if not isinstance(value, str):
        raise InvalidOption(f"{what} must be a str, got {type(value).__name__}")
    if "\x00" in value:
        raise InvalidOption(
            f"{what} must not contain NUL characters ('\\x00'): PostgreSQL cannot store them. "
            "Remove them from the value."
        )
    _check_unicode(value, what, InvalidOption)
    if len(value) > max_length:
        raise InvalidOption(
            f"{what} must be at most {max_length} characters, got {len(value):,}; shorten it."
        )
    return value


def clean_name(value: Any, what: str, *, max_length: int) -> str:
    """A name or id from an untrusted caller (a collection name, a source id, a title):
    :func:`clean_string`'s rules, and no control character (tab and line breaks included)."""
    value = clean_string(value, what, max_length=max_length)
    position = control_character(value)
    if position is not None:
        raise InvalidOption(
            f"{what} must not contain control characters: {value[position]!r} at character "
            f"{position}. Use printable characters only."
        )
    return value


def clean_text(text: Any) -> str:
    """Validate document text; NUL characters are removed (PostgreSQL cannot store them)."""
    if not isinstance(text, str):
        raise InvalidText(
            f"text must be a str, got {type(text).__name__}; use ingest_bytes() for raw bytes "
            "or ingest_file() for a path."
        )
    if "\x00" in text:
        text = text.replace("\x00", "")
    _check_unicode(text, "text", InvalidText)
    if is_blank(text):
        raise EmptyDocument(
            "The document has no text (it is empty, or only whitespace and invisible "
            "characters such as zero-width spaces)."
        )
    limit = get_setting("MAX_DOCUMENT_CHARS")
    if len(text) > limit:
        raise DocumentTooLarge(
            f"The document has {len(text):,} characters, more than MAX_DOCUMENT_CHARS "
            f"({limit:,}). Split it into several documents, or raise "
            "DJANGO_RAG['MAX_DOCUMENT_CHARS'].",
            length=len(text),
            limit=limit,
        )
    return text


def _check_depth(value: Any, limit: int) -> None:
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        if depth > limit:
            raise InvalidOption(
                f"metadata is nested more than {limit} levels deep; flatten it (metadata is "
                "for filtering and display, a few levels are plenty)."
            )
        stack.extend((child, depth + 1) for child in children)


def clean_metadata(metadata: Any) -> dict:
    """A JSON object PostgreSQL's ``jsonb`` accepts: no NaN/Infinity, no NUL, valid Unicode,
    at most ``MAX_METADATA_DEPTH`` levels deep."""
    if metadata is None:
        return {}
    if not isinstance(metadata, dict):
        raise InvalidOption(f"metadata must be a dict, got {type(metadata).__name__}")
    _check_depth(metadata, MAX_METADATA_DEPTH)
    try:
        encoded = json.dumps(metadata, allow_nan=False, ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise InvalidOption(
            f"metadata must be JSON-serialisable, without NaN or Infinity (JSON has no such "
            f"numbers): {exc}"
        ) from exc
    if "\\u0000" in encoded:
        raise InvalidOption("metadata must not contain NUL characters (PostgreSQL rejects them)")
    _check_unicode(encoded, "metadata", InvalidOption)
    return metadata


# Primary keys are bigint: a larger number can name no row (and PostgreSQL refuses to compare).
MAX_PK = 2**63 - 1


def clean_pk(value: Any, not_found: type[Exception], what: str) -> int:
    """``value`` as a primary key (an int or a string of digits). Anything that cannot name a
    row (``"abc"``, None, -1, a bool, past bigint) raises ``not_found`` (a not-found error
    taking ``(message, id=value)``) rather than a ValueError: no such row exists."""
    pk = value
    if isinstance(pk, str) and pk.isascii() and pk.strip().isdigit():
        pk = int(pk)
    if isinstance(pk, bool) or not isinstance(pk, int) or not 0 < pk <= MAX_PK:
        raise not_found(f"No {what} with id {value!r}: {what} ids are positive integers.", id=value)
    return pk


def clean_collection_name(collection: Any, *, strict: bool = False) -> str:
    """A collection name (None: ``DEFAULT_COLLECTION``): not blank, at most 255 characters, no
    NUL, valid Unicode; with ``strict`` (names from untrusted callers: the HTTP API) no control
    character either (:func:`clean_name`)."""
    name = get_setting("DEFAULT_COLLECTION") if collection is None else collection
    if hasattr(name, "name") and not isinstance(name, str):  # a Collection instance
        name = name.name
    if not isinstance(name, str) or is_blank(name) or len(name) > 255:
        raise InvalidOption(
            f"collection must be a non-empty name of at most 255 characters, got {collection!r}"
        )
    if strict:
        return clean_name(name, "collection", max_length=255)
    return clean_string(name, "collection", max_length=255)


def clean_collection_names(
    collection: Any, *, strict: bool = False, max_names: int | None = None
) -> list[str] | None:
    """``collection`` as a list of names (None: no collection named), each checked as
    :func:`clean_collection_name` checks one (``strict`` passed on); a bytes, dict or
    non-iterable value is refused, and so are more than ``max_names`` names."""
    if collection is None:
        return None
    if isinstance(collection, str):
        names = [collection]
    elif isinstance(collection, bytes | bytearray | dict) or not hasattr(collection, "__iter__"):
        raise InvalidOption(
            f"collection must be a name or a list of names, got {type(collection).__name__}"
        )
    else:
        names = list(collection)
    if max_names is not None and len(names) > max_names:
        raise InvalidOption(
            f"collection may name at most {max_names} collections, got {len(names)}"
        )
    for name in names:
        if not isinstance(name, str) or not name:
            raise InvalidOption(f"collection names must be non-empty strings, got {name!r}")
        clean_collection_name(name, strict=strict)
    return names


def clean_source_id(source_id: Any, *, strict: bool = False) -> str:
    """A source id (None: ``""``): at most 512 characters, no NUL, valid Unicode; with
    ``strict`` (untrusted callers) no control character either."""
    if source_id is None:
        return ""
    if strict:
        return clean_name(source_id, "source_id", max_length=512)
    return clean_string(source_id, "source_id", max_length=512)


def upload_source_id(source_id: Any, filename: str, *, strict: bool = False) -> str:
    """The source id of an uploaded file: the one given, else the file's name (its last path
    part). Every upload then has an identity: uploading it again with *replace* supersedes it,
    and a folder synced into the same collection finds it by that name. The dashboard and the
    API both call this. Raises :class:`InvalidOption` (``details["field"]``: ``source_id``)
    when the given id, or the file's name standing in for it, cannot be stored."""
    if source_id:
        return clean_source_id(source_id, strict=strict)
    name = str(filename or "").replace("\\", "/").rsplit("/", 1)[-1]
    try:
        cleaned = clean_source_id(name, strict=strict)
    except InvalidOption:
        cleaned = ""
    if not cleaned:
        raise InvalidOption(
            "The file's name cannot serve as its source id (it is empty, longer than 512 "
            "characters, or has a character that cannot be stored): give a source id.",
            field="source_id",
        )
    return cleaned


def clean_title(title: Any) -> str:
    if title is None:
        return ""
    # Longer titles are cut to the column's 500 characters where the document is built.
    return clean_string(title, "title", max_length=10_000)


def clean_filename(filename: Any) -> str:
    """A file name as given to ``ingest_bytes`` (or the name part of an ``ingest_file`` path)."""
    if not isinstance(filename, str) or not filename:
        raise InvalidOption("a filename is needed: the parser is chosen by its extension")
    return clean_string(filename, "filename", max_length=4096)


def clean_query(query: Any) -> str:
    """A search query or question: a str of at most ``MAX_QUERY_CHARS`` characters, valid
    Unicode; NUL characters are removed. A query with nothing visible comes back as ``""``
    (search answers it with no results)."""
    if not isinstance(query, str):
        raise InvalidOption(f"query must be a string, got {type(query).__name__}")
    limit = get_setting("MAX_QUERY_CHARS")
    if len(query) > limit:
        raise QueryTooLong(
            f"The query has {len(query):,} characters, more than MAX_QUERY_CHARS ({limit:,}). "
            "Shorten it (search with its key sentences or terms), or raise "
            "DJANGO_RAG['MAX_QUERY_CHARS'].",
            length=len(query),
            limit=limit,
        )
    query = query.replace("\x00", "")
    _check_unicode(query, "query", InvalidText)
    return "" if is_blank(query) else query


def clean_int(name: str, value: Any, *, minimum: int = 1, maximum: int | None = None) -> int:
    """An int >= ``minimum`` (and <= ``maximum``); bools and strings are refused."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < minimum
        or (maximum is not None and value > maximum)
    ):
        bound = f" from {minimum} to {maximum}" if maximum is not None else f" >= {minimum}"
        raise InvalidOption(f"{name} must be an integer{bound}, got {value!r}")
    return value


def clean_positive_int(name: str, value: Any, *, maximum: int | None = None) -> int:
    """An int >= 1 (and <= ``maximum``); bools and strings are refused."""
    return clean_int(name, value, maximum=maximum)


def clean_number(
    name: str,
    value: Any,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    strict_minimum: bool = False,
):
    """A finite int or float within the bounds (bools, NaN and infinities are refused)."""
    ok = not isinstance(value, bool) and isinstance(value, int | float)
    if ok:
        try:
            number = float(value)
        except OverflowError:  # an int too large for a float
            ok = False
        else:
            ok = math.isfinite(number)
    if ok and minimum is not None:
        ok = number > minimum if strict_minimum else number >= minimum
    if ok and maximum is not None:
        ok = number <= maximum
    if not ok:
        bounds = []
        if minimum is not None:
            bounds.append(f"{'>' if strict_minimum else '>='} {minimum:g}")
        if maximum is not None:
            bounds.append(f"<= {maximum:g}")
        raise InvalidOption(
            f"{name} must be a finite number{' ' + ' and '.join(bounds) if bounds else ''}, "
            f"got {value!r}"
        )
    return value


# --- vectors -----------------------------------------------------------------------------------


def _vector_problem(vector: Any, dimensions: int | None) -> tuple[str, int | None]:
    """("", None) when ``vector`` is usable, else (what is wrong, its size if wrong-sized)."""
    try:
        with np.errstate(over="ignore", invalid="ignore"):
            array = np.asarray(vector, dtype=np.float32)
    except (TypeError, ValueError, OverflowError) as exc:
        return f"is not a list of numbers ({exc})", None
    if array.ndim != 1:
        return f"is not a flat list of numbers (shape {array.shape})", None
    if dimensions is not None and array.shape[0] != dimensions:
        return "", array.shape[0]
    if not np.all(np.isfinite(array)):
        # float32, as stored: a finite float64 above 3.4e38 overflows the column too.
        return "contains NaN or infinite values", None
    if not array.any():
        return "is all zeros (it has no direction, so its cosine similarity is undefined)", None
    return "", None


def _mismatch(what: str, actual: int, dimensions: int) -> DimensionMismatch:
    return DimensionMismatch(
        f"The embedder returned {actual}-dimensional vectors for the {what} but the embedding "
        f"column holds {dimensions}. Use the embedder the chunks were stored with, or set "
        "DJANGO_RAG['EMBEDDING_DIMENSIONS'] to match the embedder and migrate the column (see "
        "docs/configuration.md, 'Changing the embedding model').",
        expected=dimensions,
        actual=actual,
    )


def check_vectors(vectors: Sequence[Any], *, dimensions: int | None, what: str) -> None:
    """Check an embedder's output before it is stored: every vector has ``dimensions`` numbers
    (when given; else the size of the first), all finite, not all zero.

    Raises :class:`DimensionMismatch` for a wrong size and :class:`EmbeddingFailed` (with the
    vector's ``chunk_index``) for anything else. ``what`` names the vectors in messages
    (``"chunk"``: "chunk 3 ...").
    """
    for index, vector in enumerate(vectors):
        problem, size = _vector_problem(vector, dimensions)
        if size is not None:
            raise _mismatch(f"{what} {index}", size, dimensions)
        if problem:
            raise EmbeddingFailed(
                f"The embedding of {what} {index} {problem}. Nothing was written; fix the "
                "embedder (or the text) and try again.",
                chunk_index=index,
            )
        if dimensions is None:
            dimensions = len(vector)


def check_query_vector(vector: Any, *, dimensions: int | None) -> None:
    """Check the query embedding before it reaches the database (same rules as
    :func:`check_vectors`; :class:`EmbeddingFailed` has no ``chunk_index`` here)."""
    problem, size = _vector_problem(vector, dimensions)
    if size is not None:
        raise _mismatch("query", size, dimensions)
    if problem:
        raise EmbeddingFailed(
            f"The embedding of the query {problem}; the search cannot rank by it. Check the "
            "embedder, or search in fulltext mode."
        )


# --- argparse types (management commands) -------------------------------------------------------


def positive_int_arg(text: str) -> int:
    """argparse ``type=``: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


def finite_float_arg(text: str) -> float:
    """argparse ``type=``: a finite number (no nan, inf)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def positive_float_arg(text: str) -> float:
    """argparse ``type=``: a finite number > 0."""
    value = finite_float_arg(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def rejects_unknown_options(owner: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Decorate a public function so that a keyword option it does not take raises
    :class:`~django_rag.exceptions.InvalidOption` naming it (with the closest name and the
    accepted ones), not Python's ``TypeError``. The signature is read once, when decorated;
    a function with ``**kwargs`` checks its own options and is returned as it is."""
    import difflib
    import functools
    import inspect

    def decorate(function: Callable[P, R]) -> Callable[P, R]:
        parameters = inspect.signature(function).parameters.values()
        if any(p.kind is p.VAR_KEYWORD for p in parameters):
            return function
        names = sorted(
            p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        )

        @functools.wraps(function)
        def wrapped(*args: P.args, **kwargs: P.kwargs) -> R:
            for name in kwargs:
                if name not in names:
                    close = difflib.get_close_matches(name, names, n=1)
                    hint = f"; did you mean {close[0]!r}?" if close else ""
                    raise InvalidOption(
                        f"{owner} got an unknown option {name!r}{hint} (options: "
                        f"{', '.join(names)})"
                    )
            return function(*args, **kwargs)

        return wrapped

    return decorate
