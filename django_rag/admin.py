"""Django admin for collections, documents, chunks, evaluation test cases and runs.

Documents are added through ``ingest`` (chunked, embedded, searchable at once) and deleted
through the store; their content is read-only once stored (ingest a new version with the same
source to change it). Chunks, graph rows, jobs and runs are written by the library only: the
admin shows them.
"""

from django import forms
from django.contrib import admin, messages
from django.db import transaction
from django.db.models import Count
from django.forms.models import BaseInlineFormSet
from django.http import HttpResponseRedirect
from django.template.response import TemplateResponse
from django.utils.html import format_html
from django.utils.text import Truncator

from . import sync
from .background import start
from .exceptions import CollectionNotEmpty, RagError
from .ingestion.service import FORMATS, ingest
from .maintenance import reembed_documents as reembed
from .models import (
    Chunk,
    Collection,
    Community,
    Conversation,
    Document,
    Entity,
    IndexedModelStatus,
    Job,
    Message,
    Relationship,
    Relevance,
    Run,
    TestCase,
)
from .models.databases import write_db
from .store import delete_documents
from .utils import plural


@admin.action(description="Re-embed the selected documents")
def reembed_documents(modeladmin, request, queryset):

    job = reembed(list(queryset.values_list("pk", flat=True)))
    modeladmin.message_user(
        request, f"Re-embedded {plural(job.done, 'chunk')} with {job.result['model']}."
    )


@admin.action(description="Rebuild the graph of the selected collections")
def rebuild_graph(modeladmin, request, queryset):

    for collection in queryset:
        try:
            job = start("build_graph", collection=collection.name, resume=False)
        except Exception as exc:  # shown to the user, never a 500
            modeladmin.message_user(
                request, f"{collection.name}: graph build failed: {exc}", level=messages.ERROR
            )
        else:
            modeladmin.message_user(request, f"{collection.name}: graph job {job.pk} {job.status}.")


@admin.register(Collection)
class CollectionAdmin(admin.ModelAdmin):
    list_display = ["name", "description", "document_count", "created_at"]
    search_fields = ["name", "description"]
    actions = [rebuild_graph]

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(_documents=Count("documents"))

    @admin.display(description="documents", ordering="_documents")
    def document_count(self, obj):
        return obj._documents

    def delete_model(self, request, obj):
        try:
            obj.delete()
        except CollectionNotEmpty as exc:
            self.message_user(request, str(exc), level=messages.ERROR)

    def delete_queryset(self, request, queryset):
        for collection in queryset:
            self.delete_model(request, collection)


class PagedInlineFormSet(BaseInlineFormSet):
    """An inline formset showing one page of its rows (``page`` and ``per_page`` are set on
    the class by :meth:`ChunkInline.get_formset`): a document of 446 chunks must not render
    446 rows."""

    page = 1
    per_page = 50

    def get_queryset(self):
        if not hasattr(self, "_paged"):
            start = (self.page - 1) * self.per_page
            self._paged = super().get_queryset()[start : start + self.per_page]
        return self._paged


class ChunkInline(admin.TabularInline):
    model = Chunk
    fields = ["chunk_index", "preview", "token_count", "page_start", "page_end", "embedding_model"]
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = True
    ordering = ["chunk_index"]
    formset = PagedInlineFormSet
    # A long document's page stays short: the chunks start folded, 20 a page, with their
    # count and a link to the chunk list filtered to this document.
    per_page = 20
    classes = ["collapse"]
    template = "admin/django_rag/paged_tabular.html"

    def has_add_permission(self, request, obj=None):
        return False

    def get_formset(self, request, obj=None, **kwargs):
        formset = super().get_formset(request, obj, **kwargs)
        total = obj.chunks.count() if obj is not None and obj.pk else 0
        pages = max(1, -(-total // self.per_page))
        try:
            page = min(max(1, int(request.GET.get("chunks_page", 1))), pages)
        except ValueError:
            page = 1
        return type(
            "PagedChunkFormSet",
            (formset,),
            {"page": page, "per_page": self.per_page, "total": total, "pages": pages},
        )

    @admin.display(description="text")
    def preview(self, obj):
        return Truncator(obj.text).chars(160)


class DocumentAddForm(forms.ModelForm):
    """Adding a document ingests it: the form's validation is the ingest itself, so any
    library error (empty text, bad metadata, embedding failure) shows on the form."""

    collection_name = forms.CharField(
        label="Collection", max_length=255, help_text="Created when it does not exist."
    )
    format = forms.ChoiceField(choices=[(f, f) for f in FORMATS], initial="text")
    replace = forms.BooleanField(
        required=False, help_text="Replace the documents with the same source id."
    )

    class Meta:
        model = Document
        fields = ["title", "source_id", "metadata", "content"]

    def clean(self):
        data = super().clean()
        if self.errors:
            return data
        try:
            self.ingested = ingest(
                data["content"],
                collection=data["collection_name"],
                title=data.get("title") or "",
                source_id=data.get("source_id") or None,
                metadata=data.get("metadata") or None,
                format=data["format"],
                replace=data.get("replace", False),
            )
        except RagError as exc:
            raise forms.ValidationError(str(exc)) from exc
        return data


@admin.register(Document)
class DocumentAdmin(admin.ModelAdmin):
    list_display = ["__str__", "collection", "source_id", "status", "chunk_count", "created_at"]
    list_filter = ["status", "collection", "content_type"]
    search_fields = ["title", "source_id", "original_filename"]
    list_select_related = ["collection"]
    readonly_fields = ["content_hash", "chunk_count", "status", "error", "created_at", "updated_at"]
    inlines = [ChunkInline]
    actions = [reembed_documents]

    def get_form(self, request, obj=None, **kwargs):
        if obj is None:
            kwargs["form"] = DocumentAddForm
            kwargs["fields"] = [
                "collection_name",
                "title",
                "source_id",
                "format",
                "replace",
                "metadata",
                "content",
            ]
        return super().get_form(request, obj, **kwargs)

    def get_readonly_fields(self, request, obj=None):
        if obj is None:
            return []
        # The chunks were made from these: change them by ingesting a new version.
        return [
            *self.readonly_fields,
            "collection",
            "content_view",
            "content_type",
            "original_filename",
        ]

    def get_fields(self, request, obj=None):
        fields = super().get_fields(request, obj)
        if obj is None:
            return fields
        # The stored text in a box of bounded height (one of 200,000 characters made the page
        # 22,000 px tall); the add form keeps its editable "content".
        return ["content_view" if f == "content" else f for f in fields if f != "content_view"]

    @admin.display(description="content")
    def content_view(self, obj):
        return format_html(
            '<div class="rag-content" style="max-height: 24em; overflow: auto; '
            'white-space: pre-wrap; max-width: 60em">{}</div>'
            '<p class="help">{} characters; the chunks below hold it piece by piece.</p>',
            obj.content,
            f"{len(obj.content):,}",
        )

    def get_inlines(self, request, obj):
        return self.inlines if obj is not None else []

    def save_form(self, request, form, change):
        if not change:
            return form.ingested  # stored by the form's validation
        return super().save_form(request, form, change)

    def save_model(self, request, obj, form, change):
        if change:
            super().save_model(request, obj, form, change)

    def save_related(self, request, form, formsets, change):
        if change:  # an added document has no related rows to save: ingest stored it all
            super().save_related(request, form, formsets, change)

    def delete_model(self, request, obj):
        self.delete_queryset(request, Document.objects.filter(pk=obj.pk))

    def delete_queryset(self, request, queryset):
        with transaction.atomic(using=write_db()):
            delete_documents(queryset.values_list("pk", flat=True))


@admin.register(Chunk)
class ChunkAdmin(admin.ModelAdmin):
    list_display = [
        "__str__",
        "collection",
        "chunk_index",
        "token_count",
        "page_start",
        "embedding_model",
    ]
    list_filter = ["collection", "embedding_model"]
    search_fields = ["text"]
    list_select_related = ["collection", "document"]
    exclude = ["embedding"]
    readonly_fields = [
        "document",
        "collection",
        "chunk_index",
        "text",
        "token_count",
        "start_char",
        "end_char",
        "page_start",
        "page_end",
        "metadata",
        "embedding_model",
        "created_at",
    ]

    def get_queryset(self, request):
        # The labels read the document's title, never its text (which may be megabytes).
        return super().get_queryset(request).defer("document__content")

    def has_add_permission(self, request):
        return False


class RelevanceInline(admin.TabularInline):
    model = Relevance
    extra = 0
    raw_id_fields = ["chunk", "document"]


@admin.register(TestCase)
class TestCaseAdmin(admin.ModelAdmin):
    list_display = ["short_question", "collection", "level", "origin", "created_at"]
    list_filter = ["origin", "level", "collection"]
    search_fields = ["question", "reference_answer", "external_id"]
    raw_id_fields = ["source_chunk"]
    inlines = [RelevanceInline]

    @admin.display(description="question")
    def short_question(self, obj):
        return Truncator(obj.question).chars(80)


class ShownOnly:
    """Rows the library writes: the admin lists and shows them, nothing more."""

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(Run)
class RunAdmin(ShownOnly, admin.ModelAdmin):
    list_display = ["id", "started_at", "status", "mode", "test_case_count", "recall_at_5", "mrr"]
    list_filter = ["status", "mode"]
    readonly_fields = [f.name for f in Run._meta.fields]

    @admin.display(description="recall@5")
    def recall_at_5(self, obj):
        value = obj.metrics.get("recall_at_5")
        return None if value is None else f"{value:.3f}"

    @admin.display(description="MRR")
    def mrr(self, obj):
        value = obj.metrics.get("mrr")
        return None if value is None else f"{value:.3f}"


@admin.register(Entity)
class EntityAdmin(ShownOnly, admin.ModelAdmin):
    list_display = ["name", "type", "collection", "created_at"]
    list_filter = ["type", "collection"]
    search_fields = ["name", "normalized_name", "description"]
    exclude = ["embedding"]
    readonly_fields = ["normalized_name"]


@admin.register(Relationship)
class RelationshipAdmin(ShownOnly, admin.ModelAdmin):
    list_display = ["source", "type", "target", "strength", "count"]
    list_filter = ["type"]
    search_fields = ["source__name", "target__name", "type", "description"]
    raw_id_fields = ["source", "target"]


@admin.register(Community)
class CommunityAdmin(ShownOnly, admin.ModelAdmin):
    list_display = ["id", "collection", "level", "size", "dirty", "short_summary", "updated_at"]
    list_filter = ["level", "dirty", "collection"]
    search_fields = ["summary"]

    @admin.display(description="entities")
    def size(self, obj):
        return len(obj.entity_ids)

    @admin.display(description="summary")
    def short_summary(self, obj):
        return Truncator(obj.summary).chars(80)


@admin.register(Job)
class JobAdmin(ShownOnly, admin.ModelAdmin):
    list_display = [
        "id",
        "kind",
        "status",
        "done",
        "total",
        "runner",
        "created_at",
        "heartbeat_at",
        "finished_at",
    ]
    list_filter = ["kind", "status", "runner"]
    readonly_fields = [f.name for f in Job._meta.fields]


@admin.register(IndexedModelStatus)
class IndexedModelStatusAdmin(admin.ModelAdmin):
    """Indexed models (``@django_rag.indexed``): rows, documents, missing, pending, failed and
    the last check's stale count; Check and Reconcile start ``sync`` jobs (docs/sync.md)."""

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return request.user.is_active and request.user.is_staff

    def changelist_view(self, request, extra_context=None):
        if request.method == "POST" and self.has_change_permission(request):
            action = request.POST.get("action")
            model = request.POST.get("model", "")
            if action in ("check", "reconcile") and model in {s.label for s in sync.registered()}:
                try:
                    job = start("sync", model=model, dry_run=action == "check")
                except Exception as exc:  # shown to the user, never a 500
                    self.message_user(request, f"{model}: {exc}", level=messages.ERROR)
                else:
                    self.message_user(request, f"{model}: sync job {job.pk} {job.status}.")
            else:
                self.message_user(request, "Unknown action or model.", level=messages.ERROR)
            return HttpResponseRedirect(request.path)
        context = {
            **self.admin_site.each_context(request),
            "title": "Indexed models",
            "opts": self.model._meta,
            "models": sync.status(),
            **(extra_context or {}),
        }
        return TemplateResponse(request, "admin/django_rag/indexed_models.html", context)


class MessageInline(admin.TabularInline):
    model = Message
    extra = 0
    can_delete = False
    fields = ("role", "text", "query", "citations", "usage", "created_at")
    readonly_fields = fields

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Conversation)
class ConversationAdmin(admin.ModelAdmin):
    """Conversations are written by ``chat()``: the admin shows them and may delete them."""

    list_display = ("__str__", "owner", "collections", "updated_at")
    search_fields = ("title",)
    readonly_fields = ("owner", "session_key", "collections", "title", "created_at", "updated_at")
    inlines = [MessageInline]

    def has_add_permission(self, request):
        return False
