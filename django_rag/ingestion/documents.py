"""Reading stored documents: :func:`list_documents`, :func:`count_documents` and
:func:`get_document` (Arcana's document read API; docs/ingestion.md, "Reading documents")."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db.models import QuerySet

from ..exceptions import DocumentNotFound, InvalidOption
from ..models import Document
from ..validation import (
    clean_collection_names,
    clean_int,
    clean_metadata,
    clean_pk,
    clean_source_id,
    rejects_unknown_options,
)

#: The largest page :func:`list_documents` returns.
MAX_PAGE = 1000
DEFAULT_PAGE = 50
STATUSES = tuple(Document.Status.values)


def _documents(
    collection: str | Sequence[str] | None,
    status: str | Sequence[str] | None,
    source_id: str | None,
    metadata: dict[str, Any] | None,
) -> QuerySet[Document]:
    documents = Document.objects.all()
    names = clean_collection_names(collection)
    if names is not None:
        # An unknown name matches nothing (as in Arcana): the list never widens to every
        # collection, and counting a collection not created yet is 0, not an error.
        documents = documents.filter(collection__name__in=names)
    if status is not None:
        statuses = [status] if isinstance(status, str) else list(status)
        for value in statuses:
            if value not in STATUSES:
                raise InvalidOption(
                    f"status must be one of {', '.join(STATUSES)} (or a list of them), "
                    f"got {value!r}"
                )
        documents = documents.filter(status__in=statuses)
    if source_id is not None:
        documents = documents.filter(source_id=clean_source_id(source_id))
    if metadata is not None:
        documents = documents.filter(metadata__contains=clean_metadata(metadata))
    return documents


@rejects_unknown_options("list_documents()")
def list_documents(
    *,
    collection: str | Sequence[str] | None = None,
    status: str | Sequence[str] | None = None,
    source_id: str | None = None,
    metadata: dict[str, Any] | None = None,
    limit: int = DEFAULT_PAGE,
    offset: int = 0,
) -> list[Document]:
    """Stored documents, newest first (then the highest id), their collection loaded.

    Filters: ``collection`` (a name or a list of names; an unknown name matches nothing),
    ``status`` (``"pending"``, ``"processing"``, ``"completed"``, ``"failed"`` or a list),
    ``source_id`` and ``metadata`` (documents whose metadata contains this dict). ``limit``
    (0 to 1000, default 50) and ``offset`` (>= 0) page through them; anything else raises
    :class:`~django_rag.exceptions.InvalidOption`. The documents' text is not read (a
    page of long documents stays small): ``document.content`` loads it on access."""
    limit = clean_int("limit", limit, minimum=0, maximum=MAX_PAGE)
    offset = clean_int("offset", offset, minimum=0)
    documents = _documents(collection, status, source_id, metadata)
    page = (
        documents.select_related("collection")
        .defer("content")
        .order_by("-created_at", "-id")[offset : offset + limit]
    )
    return list(page) if limit else []


@rejects_unknown_options("count_documents()")
def count_documents(
    *,
    collection: str | Sequence[str] | None = None,
    status: str | Sequence[str] | None = None,
    source_id: str | None = None,
    metadata: dict[str, Any] | None = None,
) -> int:
    """How many stored documents :func:`list_documents` would page through with the same
    filters."""
    return _documents(collection, status, source_id, metadata).count()


@rejects_unknown_options("get_document()")
def get_document(document_id: Any) -> Document:
    """The document with this id (an int or a string of digits), its collection loaded.
    Raises :class:`~django_rag.exceptions.DocumentNotFound` when there is none, and for an id
    that cannot be one (``"abc"``, ``None``, ``-1``) rather than a ``ValueError``."""
    pk = clean_pk(document_id, DocumentNotFound, "document")
    try:
        return Document.objects.select_related("collection").get(pk=pk)
    except Document.DoesNotExist:
        raise DocumentNotFound(
            f"No document with id {pk}. list_documents() shows the stored ones.", id=pk
        ) from None
