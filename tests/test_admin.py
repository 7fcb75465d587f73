import pytest
from django.contrib.auth.models import User
from django.urls import reverse

import django_rag as rag
from django_rag.models import Collection, Document
from django_rag.store import recount_statistics

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client(client):
    user = User.objects.create_superuser("admin", "admin@example.com", "pw")
    client.force_login(user)
    return client


def test_admin_pages_render(admin_client):
    doc = rag.ingest("<script>alert(1)</script> Admin pages list this text.", collection="adm")
    chunk = doc.chunks.get()
    for url in [
        reverse("admin:django_rag_collection_changelist"),
        reverse("admin:django_rag_document_changelist"),
        reverse("admin:django_rag_chunk_changelist"),
        reverse("admin:django_rag_document_change", args=[doc.pk]),
        reverse("admin:django_rag_chunk_change", args=[chunk.pk]),
    ]:
        response = admin_client.get(url)
        assert response.status_code == 200, url
        assert b"<script>alert(1)</script>" not in response.content
    page = admin_client.get(reverse("admin:django_rag_document_change", args=[doc.pk]))
    assert b"Admin pages list this text." in page.content  # the chunk inline


def test_admin_refuses_to_delete_a_non_empty_collection(admin_client):
    doc = rag.ingest("still here", collection="busy")
    url = reverse("admin:django_rag_collection_delete", args=[doc.collection_id])
    response = admin_client.post(url, {"post": "yes"}, follow=True)
    assert Collection.objects.filter(name="busy").exists()
    assert b"protected related objects" in response.content


def test_evaluation_admin_pages_render(admin_client):
    from django_rag.evaluation import create_test_case, run_evaluation

    doc = rag.ingest("Refunds take <b>14</b> days.", collection="adm")
    case = create_test_case(
        "refund <script>x</script> time?", chunks=list(doc.chunks.all()), collection="adm"
    )
    run = run_evaluation(mode="fulltext", collection="adm")
    for url in [
        reverse("admin:django_rag_testcase_changelist"),
        reverse("admin:django_rag_testcase_change", args=[case.pk]),
        reverse("admin:django_rag_run_changelist"),
        reverse("admin:django_rag_run_change", args=[run.pk]),
    ]:
        response = admin_client.get(url)
        assert response.status_code == 200, url
        assert b"<script>x</script>" not in response.content
    listing = admin_client.get(reverse("admin:django_rag_run_changelist")).content.decode()
    assert "1.000" in listing and "fulltext" in listing


def test_graph_and_job_admin_pages_render(admin_client):
    from django_rag.models import Community, Entity, Job, Relationship

    collection = Collection.objects.create(name="g")
    a = Entity.objects.create(collection=collection, name="<b>A</b>", normalized_name="a")
    b = Entity.objects.create(collection=collection, name="B", normalized_name="b")
    rel = Relationship.objects.create(source=a, target=b, type="KNOWS")
    community = Community.objects.create(
        collection=collection, entity_ids=[a.pk, b.pk], summary="S"
    )
    job = Job.objects.create(kind="reembed")
    for model, obj in [
        ("entity", a),
        ("relationship", rel),
        ("community", community),
        ("job", job),
    ]:
        for response in (
            admin_client.get(reverse(f"admin:django_rag_{model}_changelist")),
            admin_client.get(reverse(f"admin:django_rag_{model}_change", args=[obj.pk])),
        ):
            assert response.status_code == 200, model
            assert b"<b>A</b>" not in response.content


def test_admin_actions_reembed_documents_and_rebuild_graph(admin_client):
    from django.test import override_settings

    from django_rag.models import Job
    from django_rag.testing import HashingEmbedder, ScriptedLLM
    from tests.helpers import respond

    doc = rag.ingest(
        "Acme Corp is in Berlin.", collection="adm", embedder=HashingEmbedder(model_name="old")
    )
    response = admin_client.post(
        reverse("admin:django_rag_document_changelist"),
        {"action": "reembed_documents", "_selected_action": [doc.pk]},
        follow=True,
    )
    assert "Re-embedded 1 chunk with hashing-bow" in response.content.decode()
    assert doc.chunks.get().embedding_model == "hashing-bow"
    collection = Collection.objects.get(name="adm")
    with override_settings(DJANGO_RAG={"EMBEDDER": "hashing", "LLM": ScriptedLLM(default=respond)}):
        response = admin_client.post(
            reverse("admin:django_rag_collection_changelist"),
            {"action": "rebuild_graph", "_selected_action": [collection.pk]},
            follow=True,
        )
    assert "graph job" in response.content.decode()
    assert Job.objects.get(kind="build-graph").status == "completed"
    assert collection.entities.count() == 2
    # A graph extractor that cannot be built: a message, not a 500. (Without an LLM the build
    # now falls back to the local extractors, so that is no longer a failure.)
    broken = {"EMBEDDER": "hashing", "GRAPH": {"EXTRACTOR": "nowhere.Extractor"}}
    with override_settings(DJANGO_RAG=broken):
        response = admin_client.post(
            reverse("admin:django_rag_collection_changelist"),
            {"action": "rebuild_graph", "_selected_action": [collection.pk]},
            follow=True,
        )
    assert response.status_code == 200 and "graph build failed" in response.content.decode()


def test_admin_add_document_goes_through_ingest(admin_client):
    response = admin_client.post(
        reverse("admin:django_rag_document_add"),
        {
            "collection_name": "admin-added",
            "title": "Policy",
            "source_id": "policy",
            "format": "text",
            "metadata": '{"lang": "en"}',
            "content": "Refunds take fourteen days at every store.",
        },
    )
    assert response.status_code == 302
    doc = Document.objects.get(source_id="policy")
    assert doc.status == "completed" and doc.chunks.count() == doc.chunk_count > 0
    assert rag.search("refunds", collection="admin-added", mode="fulltext")[0].document_id == doc.pk
    # Bad input is a form error, with nothing stored.
    response = admin_client.post(
        reverse("admin:django_rag_document_add"),
        {"collection_name": "admin-added", "format": "text", "metadata": "{}", "content": "   "},
    )
    assert response.status_code == 200 and 'class="errornote"' in response.content.decode()
    assert Document.objects.count() == 1


def test_admin_content_is_read_only_and_library_rows_cannot_be_added(admin_client):
    doc = rag.ingest("Original text about refunds.", collection="ro")
    page = admin_client.get(reverse("admin:django_rag_document_change", args=[doc.pk]))
    assert 'name="content"' not in page.content.decode()
    admin_client.post(
        reverse("admin:django_rag_document_change", args=[doc.pk]),
        {
            "title": "Renamed",
            "source_id": "",
            "metadata": "{}",
            "content": "Changed!",
            "chunks-TOTAL_FORMS": "1",
            "chunks-INITIAL_FORMS": "1",
            "chunks-0-id": doc.chunks.get().pk,
            "chunks-0-document": doc.pk,
        },
    )
    doc.refresh_from_db()
    assert doc.title == "Renamed" and doc.content == "Original text about refunds."
    for model in ["job", "run", "entity", "relationship", "community", "chunk"]:
        assert admin_client.get(reverse(f"admin:django_rag_{model}_add")).status_code == 403
    # Deleting through the admin goes through the store: chunks and statistics follow.
    admin_client.post(reverse("admin:django_rag_document_delete", args=[doc.pk]), {"post": "yes"})
    assert not Document.objects.filter(pk=doc.pk).exists()
    counts = recount_statistics()
    assert counts["stored"] == counts["recount"]


def test_chunk_labels_read_as_document_title_and_index(admin_client):
    doc = rag.ingest("First part.\n\nSecond part.", collection="adm", title="Staff handbook")
    chunk = doc.chunks.order_by("chunk_index").first()
    assert str(chunk) == f"Staff handbook #{chunk.chunk_index}"
    page = admin_client.get(reverse("admin:django_rag_chunk_changelist"))
    assert f"Staff handbook #{chunk.chunk_index}".encode() in page.content
    untitled = rag.ingest("Nothing names this document at all here.", collection="adm")
    assert str(untitled.chunks.get()).startswith("Nothing names this document")
