"""Declaring which models are indexed: :func:`indexed` (a class decorator; for a model you do
not own, call ``indexed(...)(Model)`` in your ``AppConfig.ready``). Registering connects the
signals that keep the index in step (:mod:`.signals`); rows changed where no signal fires are
reconciled by ``manage.py rag_sync`` (:func:`django_rag.sync.reconcile`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from django.db import models
from django.db.models import Q, QuerySet

from ..exceptions import InvalidOption
from ..validation import rejects_unknown_options
from .registry import FORMATS, Getter, IndexedModel, add, remove
from .signals import connect, disconnect


@rejects_unknown_options("indexed()")
def indexed(
    *,
    text: Getter,
    title: Getter | None = None,
    metadata: Getter | None = None,
    collection: str | Callable[[Any], str] | None = None,
    where: Mapping[str, Any] | Q | None = None,
    queryset: Callable[[], QuerySet] | None = None,
    format: str = "text",
    m2m: Sequence[str] = (),
    related: Mapping[Any, Callable[[Any], Iterable[Any]]] | None = None,
    visible: Callable[[Any, QuerySet], QuerySet] | None = None,
) -> Callable[[type[models.Model]], type[models.Model]]:
    """Class decorator: keep the rows of this model indexed.

    - ``text``: a field name, a list of field names (joined by blank lines), a method name, or
      a function ``row -> str``. A row whose text is empty is not indexed.
    - ``title``, ``metadata``: the same for the title; for metadata, field names or a function
      ``row -> dict`` (values are stored as JSON).
    - ``collection``: a name, or a function ``row -> name`` (one collection per tenant, say);
      default ``app_label.modelname``.
    - ``where`` (filter arguments or a ``Q``) and/or ``queryset`` (a function returning the
      base queryset): which rows are indexed; a row that leaves the set loses its document.
    - ``format``: ``"text"``, ``"markdown"`` or ``"html"`` (a rich-text field: read into
      Markdown, scripts and styles dropped, headings, lists, tables and link text kept).
    - ``m2m``: many-to-many fields whose changes re-index the row.
    - ``related``: ``{OtherModel: function(other_row) -> rows of this model}``: saving or
      deleting an ``OtherModel`` row re-indexes the rows the function returns (an author's
      name in each article's text, say).
    - ``visible``: ``function(user, queryset) -> queryset``, the rows a user may see; used by
      :func:`~django_rag.sync.with_objects` to drop hits a user may not see.
    """
    if format not in FORMATS:
        raise InvalidOption(f"format must be one of {', '.join(FORMATS)}, got {format!r}")

    def register(model: type[models.Model]) -> type[models.Model]:
        if not (isinstance(model, type) and issubclass(model, models.Model)):
            raise InvalidOption(f"indexed() decorates a Django model class, got {model!r}")
        spec = IndexedModel(
            model=model,
            text=text,
            title=title,
            metadata=metadata,
            collection=collection,
            where=where,
            queryset=queryset,
            format=format,
            m2m=tuple(m2m),
            related=dict(related or {}),
            visible=visible,
        )
        add(spec)
        connect(spec)
        return model

    return register


def unregister(model: type[models.Model]) -> None:
    """Stop indexing ``model`` (its documents stay; tests and data migrations use this)."""
    spec = remove(model._meta.label_lower)
    if spec is not None:
        disconnect(spec)
