"""Validation of user input, shared by every entry point (API, commands, dashboard, tasks).

Each ``clean_*`` function returns the cleaned value or raises one of the library's typed errors
(:mod:`django_rag.exceptions`) with a message that says what to do.
"""

from __future__ import annotations

import json
from typing import Any

from .conf import get_setting
from .exceptions import DocumentTooLarge, EmptyDocument, InvalidOption, InvalidText


def clean_text(text: Any) -> str:
    """Validate document text; NUL characters are removed (PostgreSQL cannot store them)."""
    if not isinstance(text, str):
        raise InvalidText(
            f"text must be a str, got {type(text).__name__}; use ingest_bytes() for raw bytes "
            "or ingest_file() for a path."
        )
    if "\x00" in text:
        text = text.replace("\x00", "")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidText(
            f"text is not valid Unicode: unpaired surrogate at character {exc.start}. It was "
            "probably decoded with errors='surrogateescape'; decode it with the right encoding.",
            position=exc.start,
        ) from exc
    if not text.strip():
        raise EmptyDocument("The document has no text (it is empty or whitespace only).")
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


def clean_metadata(metadata: Any) -> dict:
    if metadata is None:
        return {}
    if not isinstance(metadata, dict):
        raise InvalidOption(f"metadata must be a dict, got {type(metadata).__name__}")
    try:
        encoded = json.dumps(metadata)
    except (TypeError, ValueError) as exc:
        raise InvalidOption(f"metadata must be JSON-serialisable: {exc}") from exc
    if "\\u0000" in encoded:
        raise InvalidOption("metadata must not contain NUL characters (PostgreSQL rejects them)")
    return metadata


def clean_collection_name(collection: Any) -> str:
    name = get_setting("DEFAULT_COLLECTION") if collection is None else collection
    if hasattr(name, "name") and not isinstance(name, str):  # a Collection instance
        name = name.name
    if not isinstance(name, str) or not name.strip() or len(name) > 255:
        raise InvalidOption(
            f"collection must be a non-empty name of at most 255 characters, got {collection!r}"
        )
    return name


def clean_source_id(source_id: Any) -> str:
    source_id = source_id or ""
    if not isinstance(source_id, str) or len(source_id) > 512:
        raise InvalidOption("source_id must be a string of at most 512 characters")
    return source_id


def clean_title(title: Any) -> str:
    return title or ""
