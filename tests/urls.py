import importlib.util

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("tools/rag/", include("django_rag.dashboard.urls")),
    path("", include("django_prometheus.urls")),  # serves /metrics
]
if importlib.util.find_spec("ninja") is not None:  # the "api" extra
    from tests.chat_host import help_article, host_page

    urlpatterns += [
        path("rag/api/", include("django_rag.api.urls")),
        path("host/chat/", host_page),  # a plain host page embedding the chat box
        path("help/<str:source_id>/", help_article),  # where its citations link
    ]
