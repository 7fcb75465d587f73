"""The dashboard with the Django test client: access, scoping, CSRF, escaping, every page."""

import pytest
from django.contrib.auth.models import User
from django.test import Client, override_settings
from django.urls import reverse

import django_rag as rag
from django_rag.models import Collection, Document
from tests.helpers import make_pdf, url

pytestmark = pytest.mark.django_db

PAGES = ["documents", "collections", "search", "ask", "graph", "evaluation", "maintenance", "info"]


@pytest.fixture
def corpus():
    a = rag.ingest(
        "Refunds take 14 days. <script>alert('x')</script>",
        collection="a",
        title="Refunds",
        source_id="refunds",
    )
    b = rag.ingest("Secret salaries of the board.", collection="b", title="Salaries")
    return a, b


def only_a(user):
    return ["a"]


SCOPED = {"EMBEDDER": "hashing", "DASHBOARD": {"COLLECTIONS": "tests.test_dashboard.only_a"}}


def test_mounted_under_any_prefix():
    assert url("documents") == "/tools/rag/documents/"


@pytest.mark.parametrize("page", PAGES)
def test_anonymous_users_go_to_login_and_non_staff_get_403(client, page):
    response = client.get(url(page))
    assert response.status_code == 302 and "/login/" in response["Location"]
    client.force_login(User.objects.create_user("plain", password="pw"))
    assert client.get(url(page)).status_code == 403


def test_a_custom_permission_check(client):
    client.force_login(User.objects.create_user("analyst", password="pw"))
    settings = {
        "EMBEDDER": "hashing",
        "DASHBOARD": {"PERMISSION": lambda user: user.username == "analyst"},
    }
    with override_settings(DJANGO_RAG=settings):
        assert client.get(url("documents")).status_code == 200


@pytest.mark.parametrize("page", PAGES)
def test_every_page_renders_and_escapes_stored_text(staff, corpus, page):
    response = staff.get(url(page), {"q": "refunds script"} if page == "search" else {})
    assert response.status_code == 200
    body = response.content.decode()
    assert "<script>alert(" not in body
    assert "/tools/rag/documents/" in body  # links use the real mount prefix


def test_document_detail_shows_chunks_escaped(staff, corpus):
    a, _ = corpus
    body = staff.get(url("document", a.pk)).content.decode()
    assert "Refunds take 14 days." in body and "&lt;script&gt;alert" in body


def test_ingest_upload_and_delete(staff):
    response = staff.post(
        url("ingest_text"),
        {"collection": "new", "format": "markdown", "text": "# Title\n\nSome text.", "title": "T"},
    )
    doc = Document.objects.get(title="T")
    assert response.status_code == 302 and response["Location"] == url("document", doc.pk)
    from django.core.files.uploadedfile import SimpleUploadedFile

    pdf = SimpleUploadedFile(
        "manual.pdf", make_pdf(["Press the red button."]), content_type="application/pdf"
    )
    staff.post(url("upload"), {"collection": "new", "file": pdf})
    uploaded = Document.objects.get(original_filename="manual.pdf")
    assert uploaded.status == "completed" and uploaded.chunks.count() == 1
    bad = SimpleUploadedFile("evil.exe", b"MZ")
    page = staff.post(url("upload"), {"collection": "new", "file": bad}, follow=True)
    from django_rag.dashboard import forms

    _, words = forms.upload_types()  # the parser registry's extensions, in words
    assert f"Upload a {words} file." in page.content.decode() and ".pdf" in words
    with override_settings(
        DJANGO_RAG={"EMBEDDER": "hashing", "DASHBOARD": {"MAX_UPLOAD_BYTES": 10}}
    ):
        big = SimpleUploadedFile("big.txt", b"x" * 100)
        page = staff.post(url("upload"), {"collection": "new", "file": big}, follow=True)
    assert "larger than" in page.content.decode()
    empty = staff.post(
        url("ingest_text"), {"collection": "new", "text": "   ", "format": "text"}, follow=True
    )
    assert empty.status_code == 200 and "messages" in empty.content.decode()
    # Deleting asks first: the first POST shows a confirmation page and deletes nothing.
    confirm = staff.post(url("delete_document", doc.pk))
    assert confirm.status_code == 200 and Document.objects.filter(pk=doc.pk).exists()
    assert 'name="confirmed" value="yes"' in confirm.content.decode()
    staff.post(url("delete_document", doc.pk), {"confirmed": "yes"})
    assert not Document.objects.filter(pk=doc.pk).exists()


def test_collections_create_edit_and_refuse_to_delete_non_empty(staff, corpus):
    staff.post(url("save_collection"), {"name": "empty", "description": "Nothing yet"})
    empty = Collection.objects.get(name="empty")
    assert empty.description == "Nothing yet"
    # Creating a collection whose name is taken is an error on the form, not an overwrite.
    Collection.objects.filter(name="a").update(description="Kept")
    page = staff.post(url("save_collection"), {"name": "a", "description": "Policies"})
    assert page.status_code == 400
    assert "already exists" in page.content.decode()
    assert 'value="a"' in page.content.decode()  # the form keeps what was typed
    assert Collection.objects.get(name="a").description == "Kept"
    # Editing a description is its own form.
    staff.post(url("save_collection"), {"name": "a", "description": "Policies", "existing": "1"})
    assert Collection.objects.get(name="a").description == "Policies"
    page = staff.post(url("delete_collection", Collection.objects.get(name="a").pk), follow=True)
    assert "still has 1 document" in page.content.decode()
    assert Collection.objects.filter(name="a").exists()
    confirm = staff.post(url("delete_collection", empty.pk))
    assert "Delete the collection" in confirm.content.decode()
    assert Collection.objects.filter(name="empty").exists()
    staff.post(url("delete_collection", empty.pk), {"confirmed": "yes"})
    assert not Collection.objects.filter(name="empty").exists()


def test_search_modes_side_by_side(staff, corpus):
    body = staff.get(
        url("search"), {"q": "refunds days", "compare": "on", "limit": 3}
    ).content.decode()
    for mode in ("semantic", "fulltext", "hybrid"):
        assert f"<h2>{mode}</h2>" in body
    assert "full-text" in body and body.count("Refunds take 14 days.") == 3


def test_a_scoped_user_sees_and_acts_only_on_allowed_collections(staff, corpus):
    a, b = corpus
    with override_settings(DJANGO_RAG=SCOPED):
        listing = staff.get(url("documents")).content.decode()
        assert "Refunds" in listing and "Salaries" not in listing
        assert "1 document ·" in listing  # the stats are scoped too
        assert staff.get(url("document", b.pk)).status_code == 404  # forged id
        assert staff.post(url("delete_document", b.pk)).status_code == 404
        results = staff.get(url("search"), {"q": "secret salaries board"}).content.decode()
        assert "Secret salaries" not in results
        forged = staff.get(url("search"), {"q": "salaries", "collection": "b"})
        assert "Secret salaries" not in forged.content.decode()
        assert (
            staff.post(
                url("ingest_text"), {"collection": "b", "text": "x", "format": "text"}
            ).status_code
            == 404
        )
        assert (
            staff.post(url("delete_collection", Collection.objects.get(name="b").pk)).status_code
            == 404
        )
        info = staff.get(url("info")).content.decode()
        assert "<td>b</td>" not in info
    assert Document.objects.filter(pk=b.pk).exists()


def test_posts_need_csrf(corpus):
    client = Client(enforce_csrf_checks=True)
    client.force_login(User.objects.create_user("s2", password="pw", is_staff=True))
    response = client.post(url("save_collection"), {"name": "x"})
    assert response.status_code == 403


def test_no_secret_on_the_info_page(staff):
    settings = {
        "EMBEDDER": "hashing",
        "LLM": {"model": "openai/gpt-4o-mini", "api_key": "sk-live-123"},
    }
    with override_settings(DJANGO_RAG=settings):
        body = staff.get(url("info")).content.decode()
    assert "sk-live-123" not in body and "[REDACTED]" in body


def llm_settings(llm, **extra):
    return override_settings(DJANGO_RAG={"EMBEDDER": "hashing", "LLM": llm, **extra})


def test_ask_page_plain_and_agentic(staff, corpus):
    from django_rag.testing import ScriptedLLM

    with llm_settings(ScriptedLLM("Refunds take 14 days [1].")):
        page = staff.post(
            url("ask"),
            {
                "question": "How long do refunds take?",
                "collection": "a",
                "mode": "fulltext",
                "limit": 3,
            },
        )
    body = page.content.decode()
    assert page.status_code == 200 and "Refunds take 14 days [1]." in body
    assert f"{url('document', corpus[0].pk)}#chunk-" in body  # the citation links to its chunk
    agentic = ScriptedLLM(
        rules={
            "clean search query": "refunds",
            "You answer the user's question": "Fourteen days [1].",
        }
    )
    with llm_settings(agentic):
        page = staff.post(
            url("ask"),
            {"question": "Hi! refunds?", "mode": "fulltext", "limit": 3, "steps": ["rewrite"]},
        )
    assert "Fourteen days [1]." in page.content.decode()
    with llm_settings(ScriptedLLM(RuntimeError("provider down"))):
        page = staff.post(url("ask"), {"question": "refunds?", "mode": "fulltext", "limit": 3})
    assert page.status_code == 200 and "provider down" in page.content.decode()


def test_ask_stream_sends_text_then_citations(staff, corpus):
    import json

    from django_rag.testing import ScriptedLLM

    with llm_settings(ScriptedLLM("Refunds take 14 days [1].")):
        response = staff.post(
            url("ask_stream"),
            {"question": "refunds?", "collection": "a", "mode": "fulltext", "limit": 3},
        )
        chunks = [piece.decode() for piece in response.streaming_content]
    assert len(chunks) > 2
    text, citations = "".join(chunks).split("\n\x1e")
    assert text == "Refunds take 14 days [1]."
    trailer = json.loads(citations)
    assert trailer["citations"][0]["url"].startswith(url("document", corpus[0].pk))


def test_the_streamed_ask_ends_with_usage_chunks_and_titled_sources(staff, corpus):
    """The default (streamed) single ask shows what the other kinds show: the sources by
    their document's title (not the file name), the chunk table and the usage."""
    import json

    from django_rag.testing import ScriptedLLM

    uploaded = rag.ingest_bytes(
        b"Refunds are paid back within 14 days.",
        filename="refund-policy-v3.txt",
        title="Refund policy",
        collection="a",
    )
    with llm_settings(ScriptedLLM("Within 14 days [1].")):
        response = staff.post(
            url("ask_stream"),
            {"question": "refunds paid back", "collection": "a", "mode": "fulltext", "limit": 1},
        )
        body = b"".join(response.streaming_content).decode()
    trailer = json.loads(body.split("\n\x1e")[1])
    (citation,) = trailer["citations"]
    assert citation["document_id"] == uploaded.pk and citation["label"] == "Refund policy"
    (chunk,) = trailer["chunks"]
    assert chunk["label"] == "Refund policy" and chunk["cited"] is True
    assert chunk["fulltext_score"] > 0 and chunk["semantic_score"] is None
    assert trailer["usage"]["calls"] == 1
    # The page names the same source the same way when posted without JavaScript.
    with llm_settings(ScriptedLLM("Within 14 days [1].")):
        page = staff.post(
            url("ask"),
            {"question": "refunds paid back", "collection": "a", "mode": "fulltext", "limit": 1},
        ).content.decode()
    assert ">Refund policy</a>" in page and ">refund-policy-v3.txt</a>" not in page


def test_search_and_ask_start_in_the_same_mode(staff, settings):
    """One default across the dashboard: hybrid (the best on SciFact), or the project's own
    SEARCH["MODE"] when it sets one."""
    import re

    def initial(name):
        page = staff.get(url(name)).content.decode()
        select = re.search(r'<select name="mode".*?</select>', page, re.S).group(0)
        return re.search(r'<option value="(\w+)" selected>', select).group(1)

    assert initial("search") == initial("ask") == "hybrid"
    settings.DJANGO_RAG = {**settings.DJANGO_RAG, "SEARCH": {"MODE": "keyword"}}
    assert initial("search") == initial("ask") == "fulltext"


def test_ask_is_scoped(staff, corpus):
    from django_rag.testing import ScriptedLLM

    llm = ScriptedLLM(default="An answer.")
    with llm_settings(llm, DASHBOARD={"COLLECTIONS": "tests.test_dashboard.only_a"}):
        assert (
            staff.post(
                url("ask"),
                {"question": "salaries", "collection": "b", "mode": "fulltext", "limit": 3},
            ).status_code
            == 200
        )  # not an allowed choice
        staff.post(
            url("ask"), {"question": "secret salaries board", "mode": "fulltext", "limit": 3}
        )
        assert all("Secret salaries" not in call["prompt"] for call in llm.calls)
        forged = staff.post(
            url("ask_stream"),
            {"question": "salaries", "collection": "b", "mode": "fulltext", "limit": 3},
        )
        assert forged.status_code == 400


def test_maintenance_starts_jobs_and_shows_progress(staff, corpus):
    from django_rag.models import Job
    from django_rag.testing import HashingEmbedder

    rag.ingest("legacy text", collection="a", embedder=HashingEmbedder(model_name="old"))
    confirm = staff.post(url("maintenance"), {"action": "reembed", "collection": "a"})
    assert "Re-embed the chunks of the collection “a”?" in confirm.content.decode()
    assert "1 of 2 chunks were embedded by another model than hashing-bow" in (
        confirm.content.decode()
    )
    assert not Job.objects.filter(kind="reembed").exists()
    page = staff.post(
        url("maintenance"),
        {"action": "reembed", "collection": "a", "confirmed": "yes"},
        follow=True,
    )
    body = page.content.decode()
    assert "Reembed finished" in body
    job = Job.objects.get(kind="reembed")
    assert job.status == "completed" and job.done == 1
    assert "<progress" in body and "job-completed" in body
    fragment = staff.get(url("maintenance"), HTTP_HX_REQUEST="true").content.decode()
    assert fragment.startswith('<div id="jobs"') and "<html" not in fragment
    page = staff.post(url("maintenance"), {"action": "orphans"}, follow=True)
    assert "No orphans: nothing to clean." in page.content.decode()
    # A failing job is shown as a message, not a 500.
    page = staff.post(
        url("maintenance"), {"action": "summarize_communities", "confirmed": "yes"}, follow=True
    )
    assert page.status_code == 200 and "needs an LLM" in page.content.decode()
    pending = Job.objects.create(kind="reembed", status="running", total=10, done=3)
    polling = staff.get(url("maintenance")).content.decode()
    assert 'hx-trigger="every 2s"' in polling and f"<td>{pending.pk}</td>" in polling
    assert "htmx" in polling  # htmx is served from django-htmx's static files


def test_maintenance_is_scoped(staff, corpus):
    with override_settings(DJANGO_RAG=SCOPED):
        page = staff.post(url("maintenance"), {"action": "orphans"}, follow=True)
        assert "Choose one of your collections." in page.content.decode()
        assert (
            staff.post(url("maintenance"), {"action": "reembed", "collection": "b"}).status_code
            == 404
        )


def test_evaluation_page_runs_generates_and_charts(staff, corpus):
    from django_rag.evaluation import create_test_case
    from django_rag.models import Run, TestCase
    from django_rag.testing import ScriptedLLM

    create_test_case("refunds days", chunks=list(corpus[0].chunks.all()), collection="a")
    for mode in ("fulltext", "hybrid"):
        page = staff.post(
            url("evaluation"), {"action": "run", "mode": mode, "collection": "a"}, follow=True
        )
    body = page.content.decode()
    assert Run.objects.count() == 2 and "<polyline" in body and "Recall@5" in body
    with llm_settings(ScriptedLLM(default='{"question": "How long are refunds?"}')):
        staff.post(url("evaluation"), {"action": "generate", "sample_size": 1, "collection": "a"})
    assert TestCase.objects.filter(origin="generated").count() == 1
    case = TestCase.objects.filter(origin="generated").get()
    staff.post(url("evaluation"), {"action": "delete_case", "case": case.pk})
    assert TestCase.objects.filter(pk=case.pk).exists()  # asked first
    staff.post(url("evaluation"), {"action": "delete_case", "case": case.pk, "confirmed": "yes"})
    assert not TestCase.objects.filter(pk=case.pk).exists()
    with override_settings(DJANGO_RAG=SCOPED):
        other = create_test_case("salaries", chunks=list(corpus[1].chunks.all()), collection="b")
        assert "salaries" not in staff.get(url("evaluation")).content.decode()
        assert (
            staff.post(url("evaluation"), {"action": "delete_case", "case": other.pk}).status_code
            == 404
        )


def test_graph_page_browses_entities_and_neighbourhoods(staff):
    from django_rag.models import Collection, Community, Entity, EntityMention, Relationship

    doc = rag.ingest("Jane Doe works for Acme <i>Corp</i>.", collection="a")
    other = rag.ingest("Hidden Corp in b.", collection="b")
    a, b = Collection.objects.get(name="a"), Collection.objects.get(name="b")
    jane = Entity.objects.create(
        collection=a, name="Jane Doe", normalized_name="jane doe", type="person"
    )
    acme = Entity.objects.create(collection=a, name="Acme <i>Corp</i>", normalized_name="acme corp")
    hidden = Entity.objects.create(collection=b, name="Hidden Corp", normalized_name="hidden corp")
    Relationship.objects.create(source=jane, target=acme, type="WORKS_FOR", strength=8)
    EntityMention.objects.create(entity=jane, chunk=doc.chunks.get())
    EntityMention.objects.create(entity=hidden, chunk=other.chunks.get())
    Community.objects.create(collection=a, entity_ids=[jane.pk, acme.pk], summary="Jane at Acme.")
    body = staff.get(url("graph"), {"entity": jane.pk}).content.decode()
    assert "WORKS_FOR" in body and "<svg" in body and "&lt;i&gt;Corp&lt;/i&gt;" in body
    assert f"entity={acme.pk}" in body  # neighbours link to their own view
    assert "Jane at Acme." in staff.get(url("graph"), {"tab": "communities"}).content.decode()
    assert (
        "WORKS_FOR"
        in staff.get(url("graph"), {"tab": "relationships", "q": "jane"}).content.decode()
    )
    with override_settings(DJANGO_RAG=SCOPED):
        listing = staff.get(url("graph")).content.decode()
        assert "Jane Doe" in listing and "Hidden Corp" not in listing
        assert staff.get(url("graph"), {"entity": hidden.pk}).status_code == 404
        assert staff.get(url("graph"), {"collection": "b"}).status_code == 404


# --- the first hour: reachable, no data traps, screens that explain themselves ----------------


def test_without_a_login_page_anonymous_users_go_to_the_admin_login(client):
    # tests/settings.py sets no LOGIN_URL: Django's /accounts/login/ does not exist here.
    response = client.get(url("search"), {"q": "x"})
    assert response["Location"] == "/admin/login/?next=/tools/rag/search/%3Fq%3Dx"
    assert client.get(response["Location"]).status_code == 200  # a page that exists
    with override_settings(LOGIN_URL="/admin/"):  # a URL the project resolves: kept
        assert client.get(url("documents"))["Location"].startswith("/admin/?next=")
    with override_settings(LOGIN_URL="admin:login"):  # a URL name
        assert client.get(url("documents"))["Location"].startswith("/admin/login/?next=")
    with override_settings(LOGIN_URL="https://sso.example/login"):  # another site: trusted
        assert client.get(url("documents"))["Location"].startswith("https://sso.example/login")


def test_header_shows_the_user_a_logout_form_and_the_admin(staff):
    body = staff.get(url("documents")).content.decode()
    assert '<span class="user" title="Logged in as staff">staff</span>' in body
    assert '<a href="/admin/">Admin</a>' in body
    assert '<form method="post" action="/admin/logout/"' in body  # POST: Django 5 refuses GET
    assert f'name="next" value="{url("home")}"' in body  # back to the dashboard, then login
    response = staff.post("/admin/logout/", {"next": url("home")})
    assert response.status_code == 302 and response["Location"] == url("home")
    assert staff.get(url("documents")).status_code == 302  # logged out


def test_orphan_clean_up_previews_then_applies(staff, corpus):
    from django.db import connection

    from django_rag.models import Chunk

    chunk = Chunk.objects.filter(collection__name="a").first()
    other = Chunk.objects.filter(collection__name="b").first()
    Chunk.objects.filter(pk=chunk.pk).update(collection=other.collection)  # inconsistent
    with connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
    preview = staff.post(url("maintenance"), {"action": "orphans"})
    body = preview.content.decode()
    assert preview.status_code == 200 and "Remove these orphans?" in body
    assert "1 chunk in wrong collection" in body
    assert Chunk.objects.filter(pk=chunk.pk).exists()  # nothing removed by the preview
    page = staff.post(url("maintenance"), {"action": "orphans", "confirmed": "yes"}, follow=True)
    assert "Orphans removed: 0 chunks without document, 1 chunk in wrong collection" in (
        page.content.decode()
    )
    assert not Chunk.objects.filter(pk=chunk.pk).exists()


def test_every_destructive_button_asks_first(staff, corpus):
    from django_rag.models import Job
    from django_rag.testing import ScriptedLLM

    for action in ("reembed", "build_graph", "detect_communities", "summarize_communities"):
        with llm_settings(ScriptedLLM("A summary.")):  # Summarise is refused without an LLM
            page = staff.post(url("maintenance"), {"action": action, "collection": "a"})
        body = page.content.decode()
        assert page.status_code == 200 and 'id="confirm-form"' in body, action
        # The confirmation re-posts the same fields.
        assert f'name="action" value="{action}"' in body and 'name="collection" value="a"' in body
    assert not Job.objects.exists()
    # Cancel goes back to the page the form was on, never to another site.
    page = staff.post(
        url("maintenance"), {"action": "reembed"}, HTTP_REFERER="http://testserver/tools/rag/x/"
    )
    assert 'href="http://testserver/tools/rag/x/">Cancel' in page.content.decode()
    page = staff.post(
        url("maintenance"), {"action": "reembed"}, HTTP_REFERER="https://evil.example/"
    )
    assert f'href="{url("home")}">Cancel' in page.content.decode()


@pytest.fixture
def long_document():
    text = "\n\n".join(f"Paragraph number {i} talks about topic{i}." for i in range(120))
    return rag.ingest(text, collection="long", title="Long", chunk_size=12, chunk_overlap=0)


def test_a_long_document_pages_its_chunks(staff, long_document):
    doc = long_document
    total = doc.chunks.count()
    assert total > 100
    first = staff.get(url("document", doc.pk)).content.decode()
    assert first.count('<div class="card" id="chunk-') == 50
    assert f"1–50 of {total}" in first and "?page=2" in first
    chunks = list(doc.chunks.order_by("chunk_index"))
    # A link to one chunk opens the page that holds it.
    target = chunks[60]
    page = staff.get(url("document", doc.pk), {"chunk": target.pk}).content.decode()
    assert f'id="chunk-{target.pk}"' in page and "Page 2 of" in page
    assert staff.get(url("document", doc.pk), {"chunk": 2**40}).status_code == 404


def test_the_admin_pages_a_documents_chunk_inline(admin_client, long_document):
    doc = long_document
    assert doc.chunks.count() > 100
    change = reverse("admin:django_rag_document_change", args=[doc.pk])
    body = admin_client.get(change).content.decode()
    import re

    total = doc.chunks.count()
    assert len(re.findall(r'<tr class="form-row has_original', body)) == 20
    assert 'id="chunk-pages"' in body and "?chunks_page=2" in body
    assert f"{total} chunks, page 1 of" in body
    assert f"?document__id__exact={doc.pk}" in body  # the chunk list of this document
    # The inline starts folded (Django renders a "collapse" fieldset as <details>).
    inline = body.split('id="chunks-group"')[1].split("</fieldset>")[0]
    assert "<details" in inline and "<details open" not in inline
    # The text is in a box of bounded height, once (not the page's height).
    assert body.count('class="rag-content" style="max-height: 24em') == 1
    assert f"{len(doc.content):,} characters" in body
    last = doc.chunks.order_by("-chunk_index").first()
    pages = -(-total // 20)
    body = admin_client.get(change, {"chunks_page": pages}).content.decode()
    assert f"page {pages} of {pages}" in body and last.text[:30] in body
    assert admin_client.get(change, {"chunks_page": "x"}).status_code == 200


def test_untitled_documents_show_their_first_words(staff):
    rag.ingest("Quarterly numbers improved across every region this year.", collection="u")
    body = staff.get(url("documents")).content.decode()
    assert "Quarterly numbers improved across every region this year." in body


def test_search_explains_its_scores_and_shows_defaults(staff, corpus):
    blank = staff.get(url("search")).content.decode()
    assert 'placeholder="0.7"' in blank and 'placeholder="0.3"' in blank  # the weights
    assert 'name="limit" value="10"' in blank
    assert '<option value="hybrid" selected>' in blank  # the dashboard's mode (dashboard_mode)
    with override_settings(DJANGO_RAG={"EMBEDDER": "hashing", "SEARCH": {"LIMIT": 7}}):
        assert 'name="limit" value="7"' in staff.get(url("search")).content.decode()
    body = staff.get(url("search"), {"q": "refunds", "compare": "on"}).content.decode()
    assert 'id="score-legend"' in body
    for scale in ("from 0 (unrelated) to 1", "no upper bound", "is never negative"):
        assert scale in body


def test_every_form_field_has_help_text():
    from django_rag.dashboard import forms

    for form in (
        forms.IngestTextForm(),
        forms.UploadForm(),
        forms.CollectionForm(),
        forms.SearchForm(),
        forms.AskForm(),
    ):
        for name, field in form.fields.items():
            assert field.help_text, f"{type(form).__name__}.{name}"


def test_evaluation_run_detail_lists_failures_first(staff, corpus):
    from django_rag.evaluation import create_test_case
    from django_rag.models import Run

    create_test_case("refunds days", chunks=list(corpus[0].chunks.all()), collection="a")
    create_test_case("zebra unicorn", chunks=list(corpus[0].chunks.all()), collection="a")
    staff.post(
        url("evaluation"),
        {"action": "run", "mode": "fulltext", "collection": "a"},
        follow=True,
    )
    run = Run.objects.get()
    listing = staff.get(url("evaluation")).content.decode()
    assert url("evaluation_run", run.pk) in listing
    assert '<label for="run-mode">Search mode</label>' in listing
    body = staff.get(url("evaluation_run", run.pk)).content.decode()
    assert body.index("zebra unicorn") < body.index("refunds days")  # the failure first
    assert "not found" in body and "case-failed" in body
    assert staff.get(url("evaluation_run", 2**40)).status_code == 404
    with override_settings(DJANGO_RAG=SCOPED):  # a run over "a" only: visible to a scoped user
        assert staff.get(url("evaluation_run", run.pk)).status_code == 200
        Run.objects.filter(pk=run.pk).update(config={"collections": ["a", "b"]})
        assert staff.get(url("evaluation_run", run.pk)).status_code == 404


def test_the_metrics_chart_has_axes_and_values(staff, corpus):
    from django_rag.models import Run

    for value in (0.25, 0.75):
        Run.objects.create(
            status="completed",
            mode="hybrid",
            metrics={"recall_at_5": value, "mrr": value, "ndcg_at_10": value},
        )
    body = staff.get(url("evaluation")).content.decode()
    assert "Score (0 to 1)" in body and "Run (oldest → newest)" in body
    for tick in ("0.00", "0.50", "1.00"):
        assert f'class="tick">{tick}</text>' in body
    assert "Recall@5 of run" in body and ": 0.750</title>" in body


def test_graph_counts_agree_with_the_build_result(staff):
    from django_rag.graph import build_graph

    for i in range(3):  # the same entities in every chunk, built one chunk per batch
        rag.ingest(f"Alice Smith met Bob Jones in Paris. Note {i}.", collection="g")
    settings = {"EMBEDDER": "hashing", "GRAPH": {"EXTRACTOR": None,
                "ENTITY_EXTRACTOR": "capitalized", "RELATIONSHIP_EXTRACTOR": "cooccurrence"}}  # fmt: skip
    with override_settings(DJANGO_RAG=settings):
        result = build_graph("g", batch_size=1)
    body = staff.get(url("graph"), {"collection": "g"}).content.decode()
    assert result["chunks"] == 3 and result["entities"] > 0
    assert f"{result['entities']} entities · {result['relationships']} relationships" in body


def test_graph_neighbourhood_labels_do_not_overlap(staff):
    from django_rag.models import Collection, Entity, Relationship

    a = Collection.objects.create(name="n")
    hub = Entity.objects.create(collection=a, name="Hub", normalized_name="hub")
    for i in range(30):
        other = Entity.objects.create(
            collection=a, name=f"Neighbour entity number {i}", normalized_name=f"n{i}"
        )
        Relationship.objects.create(source=hub, target=other, type="LINKS", strength=i)
    body = staff.get(url("graph"), {"entity": hub.pk}).content.decode()
    import re

    labels = [
        (float(x), float(y), anchor)
        for x, y, anchor in re.findall(
            r'<text x="([\d.]+)" y="([\d.]+)" text-anchor="(start|end)" class="label">', body
        )
    ]
    assert len(labels) == 16 and "14 more relationships" in body
    for side in ("start", "end"):
        ys = sorted(y for _, y, anchor in labels if anchor == side)
        # 12px labels on one side never share a line; each side's labels are outside the centre.
        assert all(b - a >= 14 for a, b in zip(ys, ys[1:], strict=False)), ys
    assert all((x > 300) == (anchor == "start") for x, _, anchor in labels)


def _luminance(hex_colour: str) -> float:
    channels = [int(hex_colour[i : i + 2], 16) / 255 for i in (1, 3, 5)]
    linear = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]


def _contrast(a: str, b: str) -> float:
    high, low = sorted((_luminance(a), _luminance(b)), reverse=True)
    return (high + 0.05) / (low + 0.05)


def test_colours_meet_wcag_aa_in_both_themes():
    import re
    from pathlib import Path

    import django_rag

    css = (Path(django_rag.__file__).parent / "static/django_rag/dashboard.css").read_text()
    light_block, dark_block = re.findall(r":root\s*\{([^}]*)\}", css)[:2]
    assert "prefers-color-scheme: dark" in css[: css.index(dark_block)]
    light = dict(re.findall(r"--([\w-]+):\s*(#[0-9a-fA-F]{6})", light_block))
    dark = dict(re.findall(r"--([\w-]+):\s*(#[0-9a-fA-F]{6})", dark_block))
    pairs = [
        ("on-accent", "accent"),  # buttons
        ("on-err", "err"),  # danger buttons
        ("fg", "bg"),
        ("fg", "card"),
        ("muted", "bg"),
        ("muted", "card"),
        ("accent", "bg"),  # links
        ("accent", "card"),
        ("err", "bg"),
    ]
    assert "color: var(--on-accent)" in css and "color: var(--on-err)" in css
    for name, theme in (("light", light), ("dark", dark)):
        for fg, bg in pairs:
            ratio = _contrast(theme[fg], theme[bg])
            assert ratio >= 4.5, f"{name}: --{fg} on --{bg} is {ratio:.2f}:1"


def test_a_project_brands_the_dashboard_through_base_html_blocks(staff, tmp_path, settings):
    """As docs/dashboard.md says: a project template of the same name extends the app's."""
    template = tmp_path / "django_rag" / "dashboard" / "base.html"
    template.parent.mkdir(parents=True)
    template.write_text(
        '{% extends "django_rag/dashboard/base.html" %}'
        "{% block site_title %}Acme Knowledge{% endblock %}"
        '{% block logo %}<img src="/static/acme.svg" alt="Acme" class="logo">{% endblock %}'
        "{% block site_name %}Acme{% endblock %}"
        "{% block extra_head %}<style>:root { --accent: #0a5; }</style>{% endblock %}"
        '{% block nav_extra %}<a href="/reports/">Reports</a>{% endblock %}'
    )
    settings.TEMPLATES = [{**settings.TEMPLATES[0], "DIRS": [str(tmp_path)]}]
    body = staff.get(url("collections")).content.decode()
    assert "<title>Collections · Acme Knowledge</title>" in body
    assert '<img src="/static/acme.svg" alt="Acme" class="logo"><strong>Acme</strong>' in body
    assert "<style>:root { --accent: #0a5; }</style>" in body
    assert '<a href="/reports/">Reports</a>' in body and ">Info</a>" in body


def test_element_ids_are_unique_on_every_page(staff, corpus):
    """Two forms on one page (Documents: paste and upload) once both had id="id_collection":
    a label then focuses the wrong field."""
    import re
    from collections import Counter

    pages = ["documents", "collections", "search", "ask", "graph", "maintenance", "evaluation"]
    pages += ["sync", "jobs", "info"]
    for name in pages:
        body = staff.get(url(name)).content.decode()
        twice = [i for i, n in Counter(re.findall(r'\sid="([^"]+)"', body)).items() if n > 1]
        assert not twice, (name, twice)
    documents = staff.get(url("documents")).content.decode()
    assert 'for="text-collection"' in documents and 'for="upload-collection"' in documents
