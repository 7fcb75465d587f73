from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("tools/rag/", include("django_rag.dashboard.urls")),
    path("", include("django_prometheus.urls")),  # serves /metrics
]
