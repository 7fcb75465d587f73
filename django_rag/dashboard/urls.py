from django.urls import path

from . import views

app_name = "django_rag_dashboard"

urlpatterns = [
    path("", views.home, name="home"),
    path("documents/", views.documents, name="documents"),
    path("documents/<int:pk>/", views.document, name="document"),
    path("documents/<int:pk>/delete/", views.delete_document, name="delete_document"),
    path("documents/<int:pk>/graph/", views.build_document_graph, name="build_document_graph"),
    path("documents/ingest/", views.ingest_text, name="ingest_text"),
    path("documents/upload/", views.upload, name="upload"),
    path("collections/", views.collections, name="collections"),
    path("collections/save/", views.save_collection, name="save_collection"),
    path("collections/<int:pk>/delete/", views.delete_collection, name="delete_collection"),
    path("search/", views.search, name="search"),
    path("ask/", views.ask_page, name="ask"),
    path("ask/pipeline/", views.ask_page, {"way": "pipeline"}, name="ask_pipeline"),
    path("ask/loop/", views.ask_page, {"way": "loop"}, name="ask_loop"),
    path("ask/advanced/", views.ask_page, {"way": "ask"}, name="ask_advanced"),  # Arcana's name
    path("ask/stream/", views.ask_stream, name="ask_stream"),
    path("graph/", views.graph, name="graph"),
    path("maintenance/", views.maintenance, name="maintenance"),
    path("evaluation/", views.evaluation, name="evaluation"),
    path("evaluation/runs/<int:pk>/", views.evaluation_run, name="evaluation_run"),
    path("evaluation/jobs/", views.evaluation_jobs, name="evaluation_jobs"),
    path("sync/", views.sync_page, name="sync"),
    path("jobs/", views.jobs, name="jobs"),
    path("jobs/<int:pk>/retry/", views.retry_job, name="retry_job"),
    path("info/", views.info, name="info"),
]
