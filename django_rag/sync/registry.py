"""Which models are indexed, and how a row becomes a document.

A model is registered once, with :func:`django_rag.sync.declare.indexed`; this module holds
the registrations and turns rows into documents.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.apps import apps
from django.core.serializers.json import DjangoJSONEncoder
from django.db import models
from django.db.models import Q, QuerySet

from ..exceptions import InvalidOption

# One row's text, title or metadata: a field name, field names, or a function of the row.
Getter = str | Sequence[str] | Callable[[Any], Any]

FORMATS = ("text", "markdown", "html")  # html: read into Markdown (rich-text fields)


@dataclass(frozen=True)
class IndexedModel:
    """How the rows of ``model`` are indexed (see :func:`indexed` for the options)."""

    model: type[models.Model]
    text: Getter
    title: Getter | None = None
    metadata: Getter | None = None
    collection: str | Callable[[Any], str] | None = None
    where: Mapping[str, Any] | Q | None = None
    queryset: Callable[[], QuerySet] | None = None
    format: str = "text"
    m2m: tuple[str, ...] = ()
    related: Mapping[Any, Callable[[Any], Iterable[Any]]] = field(default_factory=dict)
    visible: Callable[[Any, QuerySet], QuerySet] | None = None

    @property
    def label(self) -> str:
        """``app_label.modelname``: the prefix of every source_id of this model."""
        return self.model._meta.label_lower

    def source_id(self, pk: Any) -> str:
        """The stable identity of a row's document: ``app_label.modelname:pk``."""
        return f"{self.label}:{pk}"

    def pk_of(self, source_id: str) -> str | None:
        """The primary key in a source_id of this model (as text), or None."""
        prefix = f"{self.label}:"
        return source_id[len(prefix) :] if source_id.startswith(prefix) else None

    def rows(self) -> QuerySet:
        """The rows that are indexed (``queryset`` or the default manager, ``where`` applied)."""
        rows = self.queryset() if self.queryset is not None else self.model._default_manager.all()
        if isinstance(self.where, Q):
            rows = rows.filter(self.where)
        elif self.where:
            rows = rows.filter(**self.where)
        return rows

    @property
    def fixed_collection(self) -> str | None:
        """The collection every row goes to, or None when it depends on the row."""
        if callable(self.collection):
            return None
        return self.collection or self.label

    def collection_for(self, row: Any) -> str:
        if callable(self.collection):
            return self.collection(row)
        return self.fixed_collection or self.label

    def document_for(self, row: Any) -> dict[str, Any]:
        """``text``, ``title`` and ``metadata`` of a row's document (text "" when it has none:
        such a row is not indexed)."""
        text = _joined(_value(row, self.text))
        title = _joined(_value(row, self.title)) if self.title is not None else ""
        metadata = _metadata(row, self.metadata)
        return {"text": text, "title": title[:500], "metadata": metadata}


def _value(row: Any, getter: Getter) -> Any:
    if callable(getter):
        return getter(row)
    if isinstance(getter, str):
        value = getattr(row, getter)
        return value() if callable(value) else value
    return [_value(row, name) for name in getter]


def _joined(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, list | tuple):
        return "\n\n".join(part for part in (_joined(item) for item in value) if part.strip())
    return str(value)


def _metadata(row: Any, getter: Getter | None) -> dict[str, Any]:
    if getter is None:
        return {}
    if callable(getter):
        values = getter(row)
    else:
        names = [getter] if isinstance(getter, str) else list(getter)
        values = {name: _value(row, name) for name in names}
    if not isinstance(values, dict):
        raise InvalidOption(f"metadata of {row!r} must be a dict, got {type(values).__name__}")
    # Dates, decimals, UUIDs... as JSON would store them (what the document's metadata holds).
    return json.loads(json.dumps(values, cls=DjangoJSONEncoder))


# --- the registry ---------------------------------------------------------------------------

_registry: dict[str, IndexedModel] = {}


def add(spec: IndexedModel) -> None:
    _registry[spec.label] = spec


def remove(label: str) -> IndexedModel | None:
    return _registry.pop(label, None)


def registered() -> list[IndexedModel]:
    """Every registered model, by label."""
    return [_registry[label] for label in sorted(_registry)]


def get(model: str | type[models.Model]) -> IndexedModel:
    """The registration of ``model`` (a class or ``"app_label.Model"``)."""
    label = model if isinstance(model, str) else model._meta.label_lower
    label = label.lower()
    if label not in _registry:
        try:
            label = apps.get_model(label)._meta.label_lower
        except (LookupError, ValueError):
            pass
    if label not in _registry:
        known = ", ".join(sorted(_registry)) or "none"
        raise InvalidOption(
            f"{model!r} is not an indexed model (registered: {known}). Register it with "
            "@django_rag.indexed(text=...)."
        )
    return _registry[label]


def for_source(source_id: str) -> IndexedModel | None:
    """The registration whose rows use ``source_id``'s prefix, if any."""
    label, sep, _ = source_id.partition(":")
    return _registry.get(label) if sep else None
