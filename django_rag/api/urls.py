"""``path("rag/api/", include("django_rag.api.urls"))``: the JSON API and its OpenAPI file
(``openapi.json``)."""

import importlib.util

from django.urls import path

from ..exceptions import MissingDependency

if importlib.util.find_spec("ninja") is None:
    raise MissingDependency("django-ninja", "api", "The django_rag HTTP API")

from .views import api  # noqa: E402

urlpatterns = [path("", api.urls)]
