"""The HTTP API: ``path("rag/api/", include("django_rag.api.urls"))`` (see docs/api.md)."""
