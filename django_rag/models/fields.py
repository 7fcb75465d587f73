"""The embedding column, sized from settings when the migration runs."""

from __future__ import annotations

from pgvector.django import VectorField

from ..conf import embedding_dimensions


class EmbeddingField(VectorField):
    """A pgvector column whose size is ``DJANGO_RAG["EMBEDDING_DIMENSIONS"]``.

    The size is left out of the migration state, so changing the setting never produces a
    migration in this app; the column is created at ``migrate`` time with the configured size,
    and system check ``django_rag.E003`` reports a column whose size differs from the setting.
    """

    def __init__(self, *args, **kwargs):
        kwargs.pop("dimensions", None)
        super().__init__(*args, **kwargs)

    def db_type(self, connection) -> str:
        return f"vector({embedding_dimensions()})"

    def deconstruct(self):
        name, path, args, kwargs = super().deconstruct()
        kwargs.pop("dimensions", None)
        return name, "django_rag.models.fields.EmbeddingField", args, kwargs
