"""The API's inputs, each declared once with its type and range.

Every query, path, body and form parameter of :mod:`django_rag.api.views` takes one of these
types (or a bounded ``int``/``Literal``), so it is checked before a view runs, by the same
helpers of :mod:`django_rag.validation` the Python API uses, and is answered with
``400 invalid_input`` when out of range: never a database error, never a 500. Names and ids
from a caller are checked strictly: no NUL, no unpaired surrogate, no control character.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field

from ..exceptions import InvalidOption
from ..modes import NAMES as MODE_NAMES
from ..validation import (
    MAX_PK,
    clean_collection_name,
    clean_collection_names,
    clean_name,
    clean_source_id,
)

__all__ = [
    "MAX_OFFSET",
    "MAX_PK",
    "MAX_SCOPE_NAMES",
    "CollectionName",
    "CollectionScope",
    "ModeName",
    "OptionalCollection",
    "SourceId",
    "Text",
    "Title",
]

# Listings page with offset and limit; a user's conversations or one collection's documents
# never come near this, and PostgreSQL's OFFSET (a bigint) is far above it.
MAX_OFFSET = 1_000_000_000
# Collections one search, answer or conversation may name (the MCP tools allow 20).
MAX_SCOPE_NAMES = 100
# Collection names and source ids: their columns' lengths (validation checks them too).
MAX_NAME_CHARS = 255
MAX_SOURCE_ID_CHARS = 512
# Conversation titles: the column's length.
MAX_TITLE_CHARS = 200
# Questions, queries and messages: the schema's bound; MAX_QUERY_CHARS (a setting) is checked
# again by the service, which removes NUL characters.
MAX_TEXT_CHARS = 10_000


def _collection(value: str) -> str:
    return clean_collection_name(value, strict=True)


def _optional_collection(value: str | None) -> str | None:
    return None if not value else _collection(value)  # "?collection=": no filter


def _scope(value: Any) -> Any:
    names = clean_collection_names(value, strict=True, max_names=MAX_SCOPE_NAMES)
    if names is not None and not names:
        raise InvalidOption("collection must not be an empty list.")
    return value


def _source_id(value: str) -> str:
    return clean_source_id(value, strict=True)


def _title(value: str) -> str:
    return clean_name(value, "title", max_length=MAX_TITLE_CHARS)


# The Field bounds are what OpenAPI shows; the validators check everything (bounds included).
CollectionName = Annotated[str, Field(max_length=MAX_NAME_CHARS), AfterValidator(_collection)]
OptionalCollection = Annotated[
    str | None, Field(max_length=MAX_NAME_CHARS), AfterValidator(_optional_collection)
]
CollectionScope = Annotated[
    str | list[str] | None,
    AfterValidator(_scope),
    Field(description=f"A collection name or a list of at most {MAX_SCOPE_NAMES} names."),
]
SourceId = Annotated[str, Field(max_length=MAX_SOURCE_ID_CHARS), AfterValidator(_source_id)]
Title = Annotated[str, Field(max_length=MAX_TITLE_CHARS), AfterValidator(_title)]
Text = Annotated[str, Field(min_length=1, max_length=MAX_TEXT_CHARS)]
# A search mode or an alias, from the one registry (django_rag.modes): the schema offers
# exactly what search() accepts, and the service resolves the alias.
ModeName = Literal[MODE_NAMES]  # type: ignore[valid-type]
