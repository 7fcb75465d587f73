"""The endpoints. Each one is thin: check the caller and the scope, call a service, shape JSON.

Built on django-ninja (see docs/api.md for why): plain Django views underneath, request bodies
validated by pydantic schemas, and the OpenAPI description generated from the same code.
"""

from __future__ import annotations

from typing import Annotated, Any

from django.db.models import Count
from django.http import HttpResponse
from ninja import File, Form, Path, Query, Schema
from ninja.errors import AuthenticationError, HttpError, ValidationError
from ninja.files import UploadedFile
from pydantic import Field

from .. import __version__
from ..access import api_collections, can_manage
from ..answers import ask as ask_service
from ..conversations import chat as chat_service
from ..conversations import (
    citation_dict,
    get_conversation,
    rename_conversation,
    start_conversation,
)
from ..exceptions import InvalidOption, RagError, UnknownCollection
from ..ingestion.service import delete as delete_document
from ..ingestion.service import ingest_bytes
from ..llm import UsageMeter
from ..models import Chunk, Collection, Conversation, Document
from ..results import Usage
from ..retrieval.service import search as search_service
from ..validation import upload_source_id
from . import limits
from .errors import (
    ApiError,
    forbidden,
    is_staff,
    json_error,
    not_authenticated,
    not_found,
    rag_error_response,
)
from .inputs import (
    MAX_OFFSET,
    MAX_PK,
    CollectionName,
    CollectionScope,
    ModeName,
    OptionalCollection,
    SourceId,
    Text,
    Title,
)
from .openapi import RagNinjaAPI
from .sse import stream_events

api = RagNinjaAPI(
    title="django_rag",
    version=__version__,
    description="Search, answers, conversations and documents of django_rag (docs/api.md).",
    urls_namespace="django_rag_api",
    docs_url=None,  # the interactive page loads its assets from a CDN; the JSON is served
)

Scope = str | list[str] | None


class Caller:
    """Runs before a request's body is read: size limit, authentication, rate limit, budget."""

    def __init__(self, *, anonymous: bool = False, llm: bool = False, upload: bool = False):
        self.anonymous = anonymous
        self.llm = llm
        self.upload = upload

    def __call__(self, request):
        limit = limits.api_setting("MAX_BODY_BYTES")
        if self.upload:
            limit = limits.get_setting("DASHBOARD")["MAX_UPLOAD_BYTES"] + 64 * 1024
        limits.check_body_size(request, limit)
        user = limits.authenticate(request, anonymous=self.anonymous)
        if not user.is_authenticated and request.session.session_key is None:
            request.session.save()  # anonymous chat is kept per session
        key = limits.caller_key(request, user)
        limits.check_rate(key)
        if self.llm:
            limits.check_budget(key)
        request.rag_key = key
        request.rag_collections = api_collections(user)
        return user


READ = Caller()
OPEN = Caller(anonymous=True)
LLM = Caller(anonymous=True, llm=True)
UPLOAD = Caller(upload=True)


# --- errors as JSON with stable codes ---------------------------------------------------------


@api.exception_handler(RagError)
def _rag_error(request, exc):
    return rag_error_response(exc, staff=is_staff(getattr(request, "user", None)))


@api.exception_handler(ApiError)
def _api_error(request, exc):
    return json_error(exc.status, exc.code, exc.message, exc.headers)


@api.exception_handler(ValidationError)
def _validation_error(request, exc):
    problems = []
    for error in exc.errors[:5]:
        where = ".".join(str(part) for part in error.get("loc", ())[1:]) or "body"
        problems.append(f"{where}: {error.get('msg', 'invalid')}")
    return json_error(400, "invalid_input", "; ".join(problems) or "The request is invalid.")


@api.exception_handler(AuthenticationError)
def _authentication_error(request, exc):
    error = not_authenticated()
    return json_error(error.status, error.code, error.message)


@api.exception_handler(HttpError)
def _http_error(request, exc):
    code = {400: "invalid_input", 404: "not_found", 405: "method_not_allowed"}.get(
        exc.status_code, "http_error"
    )
    return json_error(exc.status_code, code, str(exc))


# --- helpers -------------------------------------------------------------------------------------


def scope(request, requested: Scope) -> list[str] | None:
    """The collections a request searches: what it names, each within the caller's scope (a
    collection outside it is reported as unknown, like one that does not exist); nothing named:
    every collection the caller may read."""
    allowed = request.rag_collections
    if requested is not None:
        names = [requested] if isinstance(requested, str) else list(requested)
        if not names:
            raise ApiError(400, "invalid_option", "collection must not be an empty list.")
        for name in names:
            if allowed is not None and name not in allowed:
                raise UnknownCollection(name)
        return names
    if allowed is None:
        return None
    if not allowed:
        raise forbidden("You may read no collection.")
    return sorted(allowed)


def _id() -> Any:
    """A path id: an integer a bigint primary key can hold (else 400 invalid_input)."""
    return Path(..., ge=1, le=MAX_PK)


def _offset() -> Any:
    return Query(0, ge=0, le=MAX_OFFSET)


def _scoped(queryset, request, field: str = "collection__name"):
    allowed = request.rag_collections
    return queryset if allowed is None else queryset.filter(**{f"{field}__in": allowed})


def _session_key(request) -> str | None:
    return None if request.user.is_authenticated else request.session.session_key


def _owner(request) -> dict:
    if request.user.is_authenticated:
        return {"user": request.user}
    return {"session_key": request.session.session_key}


def answer_json(answer) -> dict:
    return {
        "text": answer.text,
        "citations": [citation_dict(c) for c in answer.citations],
        "chunks": [
            {"chunk_id": c.chunk_id, "document_id": c.document_id, "score": c.score}
            for c in answer.chunks
        ],
        "usage": answer.usage.to_dict(),
        "model": answer.model,
    }


# --- search and ask ------------------------------------------------------------------------------


class SearchIn(Schema):
    query: Text
    collection: CollectionScope = None
    mode: ModeName | None = None
    limit: int = Field(10, ge=1, le=50)


class AskIn(Schema):
    question: Text
    collection: CollectionScope = None
    mode: ModeName | None = None
    limit: int = Field(5, ge=1, le=20)
    stream: bool = False


@api.post("/search", auth=OPEN, tags=["search"], summary="Search the chunks", url_name="search")
def search(request, body: SearchIn):
    hits = search_service(
        body.query, collection=scope(request, body.collection), mode=body.mode, limit=body.limit
    )
    return {"results": [hit.to_dict() for hit in hits]}


class Budgeted:
    """One answer run against the caller's token budget: tokens are reserved before the
    answer starts (:func:`limits.reserve`, 429 when the budget is spent) and settled with what
    every LLM call of the request used, counted by a :class:`UsageMeter`: when the answer is
    done, when it fails, and when the client drops its stream (what was written so far)."""

    def __init__(self, request, text: str, limit: int, *, chat: bool = False):
        tokens = limits.estimate_request(text, limit, chat=chat)
        self.reservation = limits.reserve(request.rag_key, tokens)
        self.meter = UsageMeter()

    def run(self, service, *args, **kwargs):
        """``service(*args, **kwargs)`` inside the meter; a failure settles what it used."""
        try:
            with self.meter.active():
                return service(*args, **kwargs)
        except BaseException:
            self.settle()
            raise

    def settle(self, usage: Usage | None = None) -> None:
        """Charge what the request used: the answer's usage when it is known, never less than
        what the meter counted (condensing, grounding, a stream's partial estimate)."""
        used = self.meter.usage.total_tokens
        if usage is not None:
            used = max(used, usage.total_tokens)
        self.reservation.settle(used)

    def stream(self, meta: dict, pieces, finish, *, staff: bool = False):
        """The SSE response; ``finish`` settles with the answer's usage before ``done`` is
        sent, and closing the response settles with what the meter counted if it did not
        (a failed or dropped stream). ``staff`` callers see errors' details."""
        return stream_events(
            meta, pieces, finish, meter=self.meter, on_close=self.settle, staff=staff
        )


@api.post("/ask", auth=LLM, tags=["search"], summary="Answer a question (JSON or SSE)")
def ask(request, body: AskIn):
    collection = scope(request, body.collection)
    budget = Budgeted(request, body.question, body.limit)
    result = budget.run(
        ask_service,
        body.question,
        collection=collection,
        mode=body.mode,
        limit=body.limit,
        stream=body.stream,
    )
    if not body.stream:
        budget.settle(result.usage)
        return answer_json(result)

    def finish():
        budget.settle(result.answer.usage)
        return answer_json(result.answer)

    return budget.stream({"query": body.question}, result, finish, staff=is_staff(request.user))


# --- conversations -------------------------------------------------------------------------------


class ConversationIn(Schema):
    title: Title = ""
    collection: CollectionScope = None


class MessageIn(Schema):
    message: Text
    mode: ModeName | None = None
    limit: int = Field(5, ge=1, le=20)
    stream: bool = False


def conversation_json(conv: Conversation, *, messages: bool = False) -> dict:
    data = {
        "id": conv.pk,
        "title": conv.title,
        "collections": conv.collections,
        "created_at": conv.created_at.isoformat(),
        "updated_at": conv.updated_at.isoformat(),
    }
    if messages:
        data["messages"] = [
            {
                "id": m.pk,
                "role": m.role,
                "text": m.text,
                "query": m.query,
                "citations": m.citations,
                "usage": m.usage,
                "created_at": m.created_at.isoformat(),
            }
            for m in conv.messages.all()
        ]
    return data


@api.get("/conversations", auth=OPEN, tags=["chat"], summary="Your conversations")
def conversations(request, offset: int = _offset(), limit: int = Query(20, ge=1, le=100)):
    if request.user.is_authenticated:
        mine = Conversation.objects.filter(owner=request.user)
    else:
        mine = Conversation.objects.filter(owner=None, session_key=request.session.session_key)
    return {"conversations": [conversation_json(c) for c in mine[offset : offset + limit]]}


@api.post("/conversations", auth=OPEN, tags=["chat"], summary="Start a conversation")
def create_conversation(request, body: ConversationIn):
    collections = None if body.collection is None else scope(request, body.collection)
    conv = start_conversation(collection=collections, title=body.title, **_owner(request))
    return api.create_response(request, conversation_json(conv), status=201)


@api.get("/conversations/{conversation_id}", auth=OPEN, tags=["chat"], summary="A conversation")
def conversation(request, conversation_id: int = _id()):
    conv = get_conversation(conversation_id, **_owner(request))
    return conversation_json(conv, messages=True)


class ConversationEdit(Schema):
    title: Title


@api.patch(
    "/conversations/{conversation_id}", auth=OPEN, tags=["chat"], summary="Rename a conversation"
)
def edit_conversation(request, body: ConversationEdit, conversation_id: int = _id()):
    conv = rename_conversation(conversation_id, body.title, **_owner(request))
    return conversation_json(conv)


@api.post(
    "/conversations/{conversation_id}/messages",
    auth=LLM,
    tags=["chat"],
    summary="Send a message; the answer comes back as JSON or SSE",
)
def post_message(request, body: MessageIn, conversation_id: int = _id()):
    conv = get_conversation(conversation_id, **_owner(request))
    # The stored scope is checked again: the user's own scope may have shrunk since.
    collection = scope(request, conv.collections)
    budget = Budgeted(request, body.message, body.limit, chat=True)
    result = budget.run(
        chat_service,
        body.message,
        conversation=conv,
        collection=collection,
        mode=body.mode,
        limit=body.limit,
        stream=body.stream,
        **_owner(request),
    )
    if not body.stream:
        budget.settle(result.answer.usage)
        return {
            "conversation": conv.pk,
            "message_id": result.message.pk,
            "query": result.query,
            "condensed": result.condensed,
            **answer_json(result.answer),
        }

    def finish():
        reply = result.reply
        budget.settle(reply.answer.usage)
        return {"message_id": reply.message.pk, **answer_json(reply.answer)}

    meta = {"conversation": conv.pk, "query": result.query, "condensed": result.condensed}
    return budget.stream(meta, result, finish, staff=is_staff(request.user))


# --- collections, documents, chunks ------------------------------------------------------------


@api.get("/collections", auth=READ, tags=["documents"], summary="Collections you may read")
def collections(request):
    rows = _scoped(Collection.objects.all(), request, "name").annotate(
        document_count=Count("documents")
    )
    return {
        "collections": [
            {"name": c.name, "description": c.description, "document_count": c.document_count}
            for c in rows.order_by("name")
        ]
    }


def document_json(doc: Document) -> dict:
    return {
        "id": doc.pk,
        "collection": doc.collection.name,
        "source_id": doc.source_id,
        "title": doc.title,
        "filename": doc.original_filename,
        "status": doc.status,
        "chunk_count": doc.chunk_count,
        "created_at": doc.created_at.isoformat(),
    }


@api.get("/documents", auth=READ, tags=["documents"], summary="Documents you may read")
def documents(
    request,
    collection: Annotated[OptionalCollection, Query(None)],
    offset: int = _offset(),
    limit: int = Query(20, ge=1, le=100),
):
    rows = _scoped(Document.objects.select_related("collection"), request)
    if collection:
        scope(request, collection)
        rows = rows.filter(collection__name=collection)
    rows = rows.order_by("-pk")[offset : offset + limit]
    return {"documents": [document_json(doc) for doc in rows]}


@api.get("/documents/{document_id}", auth=READ, tags=["documents"], summary="One document")
def document(request, document_id: int = _id()):
    doc = (
        _scoped(Document.objects.select_related("collection"), request)
        .filter(pk=document_id)
        .first()
    )
    if doc is None:
        raise not_found("No such document.")
    return {**document_json(doc), "metadata": doc.metadata}


@api.post("/documents", auth=UPLOAD, tags=["documents"], summary="Upload a file (parsed by a job)")
def upload(
    request,
    file: File[UploadedFile],
    collection: Form[CollectionName],
    source_id: Annotated[SourceId, Form("")],
    replace: bool = Form(False),
):
    if not can_manage(request.user):
        raise forbidden("Uploading needs the dashboard permission (DASHBOARD['PERMISSION']).")
    scope(request, collection)
    if file.size > limits.get_setting("DASHBOARD")["MAX_UPLOAD_BYTES"]:
        raise ApiError(413, "request_too_large", "The file is larger than MAX_UPLOAD_BYTES.")
    try:
        # As the dashboard: the file's name unless a source id is sent, so `replace` always
        # has a document to replace and a folder sync of the same file finds it.
        source_id = upload_source_id(source_id, file.name or "", strict=True)
    except InvalidOption:
        raise ApiError(
            400,
            "invalid_input",
            "source_id: the file's name cannot serve as the document's source id (it is "
            "empty, longer than 512 characters, or has a control character); send a "
            "source_id field.",
        ) from None
    # Stored with its job: parsed by the job, in a memory-limited child, never in this process.
    doc = ingest_bytes(
        file.read(),
        filename=file.name,
        collection=collection,
        source_id=source_id,
        replace=replace,
        background=True,
    )
    job = getattr(doc, "job", None)
    data = {**document_json(doc), "job": None if job is None else job.pk}
    return api.create_response(request, data, status=202)


@api.delete("/documents/{document_id}", auth=READ, tags=["documents"], summary="Delete a document")
def remove_document(request, document_id: int = _id()):
    if not can_manage(request.user):
        raise forbidden("Deleting needs the dashboard permission (DASHBOARD['PERMISSION']).")
    doc = _scoped(Document.objects.all(), request).filter(pk=document_id).first()
    if doc is None:
        raise not_found("No such document.")
    delete_document(doc)
    return HttpResponse(status=204)


@api.get("/chunks/{chunk_id}", auth=OPEN, tags=["documents"], summary="One chunk (a citation)")
def chunk(request, chunk_id: int = _id()):
    row = (
        _scoped(Chunk.objects.select_related("document", "collection"), request)
        .filter(pk=chunk_id)
        .first()
    )
    if row is None:
        raise not_found("No such chunk.")
    return {
        "chunk_id": row.pk,
        "text": row.text,
        "document_id": row.document_id,
        "collection": row.collection.name,
        "source_id": row.document.source_id,
        "title": row.document.title,
    }
