from django.urls import include, path

urlpatterns = [path("rag/api/", include("django_rag.api.urls"))]
