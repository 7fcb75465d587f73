"""``path("rag/api/", include("django_rag.api.urls"))``: the JSON API and its OpenAPI file
(``openapi.json``)."""

from django.urls import path

from .views import api

urlpatterns = [path("", api.urls)]
