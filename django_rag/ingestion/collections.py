"""The ``collection=`` option of ingest: a name or ``{"name": ..., "description": ...}``
(Arcana's map form), and strict ingest (``strict_collections=True`` or
``DJANGO_RAG["STRICT_COLLECTIONS"]``: a collection is never created implicitly)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..conf import get_setting
from ..exceptions import InvalidOption, UnknownCollection
from ..store.documents import collection_exists, describe_collection
from ..validation import clean_collection_name, clean_string

#: The keys the mapping form of ``collection=`` takes.
COLLECTION_KEYS = ("name", "description")
MAX_DESCRIPTION_CHARS = 10_000


def split_collection(collection: Any) -> tuple[str, str | None]:
    """``(name, description)`` of a ``collection=`` option: a name (description None), a
    :class:`~django_rag.models.Collection`, None (``DEFAULT_COLLECTION``) or a mapping with
    ``name`` and optionally ``description``. Raises
    :class:`~django_rag.exceptions.InvalidOption` for anything else."""
    if not isinstance(collection, Mapping):
        return clean_collection_name(collection), None
    unknown = sorted(str(key) for key in collection if key not in COLLECTION_KEYS)
    if unknown:
        raise InvalidOption(
            f"collection={{...}} takes the keys {', '.join(COLLECTION_KEYS)}, got "
            f"{', '.join(repr(key) for key in unknown)}"
        )
    if collection.get("name") is None:
        raise InvalidOption('collection={...} needs a "name" (and optionally a "description")')
    name = clean_collection_name(collection["name"])
    description = collection.get("description")
    if description is not None:
        if not isinstance(description, str):
            raise InvalidOption(
                f"collection description must be a string, got {type(description).__name__}"
            )
        description = clean_string(
            description.strip(), "collection description", max_length=MAX_DESCRIPTION_CHARS
        )
    return name, description or None


def strict_setting(strict_collections: bool | None) -> bool:
    """The per-call ``strict_collections`` (a bool), else ``STRICT_COLLECTIONS``."""
    strict = get_setting("STRICT_COLLECTIONS") if strict_collections is None else strict_collections
    if not isinstance(strict, bool):
        raise InvalidOption(f"strict_collections must be True or False, got {strict!r}")
    return strict


def resolve_ingest_collection(collection: Any, strict: bool) -> tuple[str, str | None]:
    """``(name, description)`` of the collection an ingest writes to (called once per call,
    by :func:`~django_rag.ingestion.request.build_ingest_request`). Under strict ingest
    (``strict``: :func:`strict_setting`'s answer) the collection must exist:
    :class:`~django_rag.exceptions.UnknownCollection` otherwise,
    before anything is parsed, embedded or written. Nothing is written here: the caller
    stores the description with :func:`apply_description` once the document is valid."""
    name, description = split_collection(collection)
    if strict and not collection_exists(name):
        raise UnknownCollection(
            name,
            hint="Strict ingest (strict_collections) never creates a collection: create it "
            "first, with",
        )
    return name, description


def apply_description(name: str, description: str | None) -> None:
    """Store ``description`` on collection ``name`` (created with it when missing; an
    existing collection's empty description is filled, a non-empty one kept)."""
    if description is not None:
        describe_collection(name, description)
