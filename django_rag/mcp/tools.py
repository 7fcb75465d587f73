"""The MCP tools as plain functions: their JSON schemas, the checks on their arguments and the
calls to the services (no MCP SDK here; :mod:`django_rag.mcp.server` wires them to it).

Tool arguments come from a model or a remote client, so they are hostile: every argument is
checked for its type and size here, an argument the tool does not take is refused (a client
misspelling ``collection`` must not widen a search to every collection), and a collection the
``MCP`` settings do not list is refused with the same message whether it exists or not.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..answers.service import ask as ask_service
from ..conf import scrub_text, section_setting
from ..exceptions import (
    CollectionNotAllowed,
    ConfigurationError,
    InvalidOption,
    RagError,
    UnknownCollection,
)
from ..ingestion.service import ingest as ingest_service
from ..models import Collection
from ..modes import NAMES as MODE_NAMES
from ..modes import SearchMode, aliases_text
from ..results import SearchResult
from ..retrieval.service import search as search_service
from ..settings_schema import HIDDEN
from ..validation import clean_collection_name, clean_query

logger = logging.getLogger("django_rag.mcp")

TOOL_NAMES = ("search", "ask", "ingest_text")
ALL = "*"
# Caps on what a client may send, beyond the settings: names and lists stay small.
MAX_NAME_CHARS = 255
MAX_COLLECTIONS_PER_CALL = 20
MAX_TITLE_CHARS = 500
MAX_SOURCE_ID_CHARS = 512
# How much of a rejected argument name an error repeats.
_SHOWN = 40
# A bearer token shorter than this is guessable; longer than this is not a token.
MIN_TOKEN_CHARS = 24
MAX_TOKEN_CHARS = 512
_TOKEN_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~+/=")


@dataclass(frozen=True)
class McpConfig:
    """The ``MCP`` settings, checked once when the server is built.

    ``collections``: the names the tools may read, or None for every collection (``"*"``);
    ``ingest_collections``: the names ``ingest_text`` may write to (never ``"*"``);
    ``tokens``: the bearer tokens an HTTP client must send one of (empty: none asked for)."""

    collections: tuple[str, ...] | None
    tools: tuple[str, ...]
    ingest_collections: tuple[str, ...]
    max_results: int
    max_ingest_chars: int
    max_concurrent_calls: int
    tokens: tuple[str, ...] = field(default=(), repr=False)

    @classmethod
    def from_settings(cls) -> McpConfig:
        def setting(name: str) -> Any:
            return section_setting("MCP", name)

        read = setting("COLLECTIONS")
        if read == ALL:
            collections = None
        elif isinstance(read, str):
            raise ConfigurationError(
                "MCP.COLLECTIONS", read, "give a list of collection names, or '*' for all"
            )
        else:
            collections = _names("MCP.COLLECTIONS", read)
            if not collections:
                raise ConfigurationError(
                    "MCP.COLLECTIONS",
                    read,
                    "the MCP server may read no collection: list the collections its clients "
                    "may search (or '*' for all)",
                )
        tools = tuple(setting("TOOLS"))
        unknown = [t for t in tools if t not in TOOL_NAMES]
        if unknown or not tools:
            raise ConfigurationError(
                "MCP.TOOLS", list(tools), f"give one or more of {', '.join(TOOL_NAMES)}"
            )
        ingest = _names("MCP.INGEST_COLLECTIONS", setting("INGEST_COLLECTIONS"))
        if "ingest_text" in tools and not ingest:
            raise ConfigurationError(
                "MCP.TOOLS",
                list(tools),
                "'ingest_text' needs MCP.INGEST_COLLECTIONS: the collections it may write to",
            )
        numbers = {}
        for name in ("MAX_RESULTS", "MAX_INGEST_CHARS", "MAX_CONCURRENT_CALLS"):
            value = setting(name)
            if value < 1:
                raise ConfigurationError(f"MCP.{name}", value, "must be 1 or more")
            numbers[name.lower()] = value
        return cls(
            collections=collections,
            tools=tuple(dict.fromkeys(tools)),
            ingest_collections=ingest,
            tokens=_tokens(setting("TOKENS")),
            **numbers,
        )


def _tokens(value: Any) -> tuple[str, ...]:
    """``MCP.TOKENS`` (a list: the settings schema checked) checked token by token; an error
    never repeats a token (errors end up in logs)."""
    for position, token in enumerate(value):
        if (
            not isinstance(token, str)
            or not MIN_TOKEN_CHARS <= len(token) <= MAX_TOKEN_CHARS
            or not set(token) <= _TOKEN_CHARS
        ):
            raise ConfigurationError(
                "MCP.TOKENS",
                HIDDEN,
                f"token {position + 1} is not a bearer token of {MIN_TOKEN_CHARS} to "
                f"{MAX_TOKEN_CHARS} letters, digits or -._~+/=: generate one with "
                "python -c 'import secrets; print(secrets.token_urlsafe(32))'",
            )
    return tuple(value)  # as listed: a client id names its token's position


def _names(setting: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, list | tuple):
        raise ConfigurationError(setting, value, "give a list of collection names")
    for name in value:
        if (
            not isinstance(name, str)
            or not name.strip()
            or len(name) > MAX_NAME_CHARS
            or name == ALL
        ):
            raise ConfigurationError(setting, value, f"{name!r} is not a collection name")
    return tuple(dict.fromkeys(value))


# --- argument checks -------------------------------------------------------------------------


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "..."


def check_arguments(
    tool: str, arguments: Any, accepted: tuple[str, ...], required: tuple[str, ...] = ()
) -> dict[str, Any]:
    """``arguments`` as a dict holding only names of ``accepted``, ``required`` ones present."""
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, Mapping):
        raise InvalidOption(f"{tool}: arguments must be an object, got {type(arguments).__name__}")
    unknown = [key for key in arguments if key not in accepted]
    if unknown:
        shown = ", ".join(_shown(key) for key in unknown[:5])
        more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
        raise InvalidOption(
            f"{tool}: unknown argument(s) {shown}{more}; it takes {', '.join(accepted)}",
        )
    missing = [name for name in required if arguments.get(name) is None]
    if missing:
        raise InvalidOption(f"{tool}: {', '.join(missing)} is required")
    return dict(arguments)


def _string(tool: str, name: str, value: Any, max_chars: int) -> str:
    if not isinstance(value, str):
        raise InvalidOption(f"{tool}: {name} must be a string, got {type(value).__name__}")
    if len(value) > max_chars:
        raise InvalidOption(
            f"{tool}: {name} has {len(value):,} characters, more than the {max_chars:,} allowed"
        )
    return value


def _limit(tool: str, value: Any, default: int, config: McpConfig) -> int:
    if value is None:
        return min(default, config.max_results)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidOption(f"{tool}: limit must be an integer, got {type(value).__name__}")
    if not 1 <= value <= config.max_results:
        raise InvalidOption(
            f"{tool}: limit must be from 1 to {config.max_results} (MCP.MAX_RESULTS), got {value}"
        )
    return value


def _mode(tool: str, value: Any) -> str | None:
    if value is None:
        return None
    _string(tool, "mode", value, 32)
    return SearchMode.parse(value).value  # InvalidSearchMode names the modes


def _requested(tool: str, value: Any) -> list[str]:
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list):
        raise InvalidOption(
            f"{tool}: collection must be a name or a list of names, got {type(value).__name__}"
        )
    if not names or len(names) > MAX_COLLECTIONS_PER_CALL:
        raise InvalidOption(
            f"{tool}: give from 1 to {MAX_COLLECTIONS_PER_CALL} collection names, got {len(names)}"
        )
    for name in names:
        _string(tool, "a collection name", name, MAX_NAME_CHARS)
        clean_collection_name(name)
    return list(dict.fromkeys(names))


def read_scope(tool: str, value: Any, config: McpConfig) -> list[str] | None:
    """The collections a read tool searches: the ones asked for, each checked against
    ``MCP.COLLECTIONS``; without ``collection``, every allowed collection that exists (None
    when every collection may be read)."""
    if value is None:
        if config.collections is None:
            return None
        existing = set(
            Collection.objects.filter(name__in=config.collections).values_list("name", flat=True)
        )
        return [name for name in config.collections if name in existing]
    names = _requested(tool, value)
    if config.collections is not None:
        for name in names:
            if name not in config.collections:
                raise CollectionNotAllowed(name, "MCP.COLLECTIONS")
    return names


# --- results -------------------------------------------------------------------------------


def chunk_dict(result: SearchResult) -> dict[str, Any]:
    """What a client gets of one chunk: its text, ids, where it comes from and its scores."""
    return {
        "chunk_id": result.chunk_id,
        "document_id": result.document_id,
        "collection": result.collection,
        "title": result.title,
        "source_id": result.source_id,
        "filename": result.filename,
        "chunk_index": result.chunk_index,
        "page_start": result.page_start,
        "page_end": result.page_end,
        "score": result.score,
        "semantic_score": result.semantic_score,
        "fulltext_score": result.fulltext_score,
        "rerank_score": result.rerank_score,
        "text": result.text,
    }


# --- the tools ---------------------------------------------------------------------------------

SEARCH_ARGUMENTS = ("query", "collection", "limit", "mode", "source_id")
ASK_ARGUMENTS = ("question", "collection", "limit", "mode")
INGEST_ARGUMENTS = ("text", "collection", "title")


def search(arguments: Any, config: McpConfig) -> dict[str, Any]:
    """The ``search`` tool: the best chunks for ``query`` in the allowed collections."""
    args = check_arguments("search", arguments, SEARCH_ARGUMENTS, required=("query",))
    query = clean_query(_string("search", "query", args["query"], 10**9))
    limit = _limit("search", args.get("limit"), 5, config)
    mode = _mode("search", args.get("mode"))
    source_id = args.get("source_id")
    if source_id is not None:
        _string("search", "source_id", source_id, MAX_SOURCE_ID_CHARS)
    collections = read_scope("search", args.get("collection"), config)
    if collections == []:  # none of the allowed collections holds anything yet
        return {"query": query, "results": []}
    results = search_service(
        query, mode=mode, limit=limit, collection=collections, source_id=source_id
    )
    return {"query": query, "results": [chunk_dict(result) for result in results]}


def ask(arguments: Any, config: McpConfig) -> dict[str, Any]:
    """The ``ask`` tool: an answer from the configured LLM, citing the chunks it used."""
    args = check_arguments("ask", arguments, ASK_ARGUMENTS, required=("question",))
    question = clean_query(_string("ask", "question", args["question"], 10**9))
    limit = _limit("ask", args.get("limit"), 5, config)
    mode = _mode("ask", args.get("mode"))
    collections = read_scope("ask", args.get("collection"), config)
    if collections == []:
        raise UnknownCollection(config.collections[0])
    answer = ask_service(question, mode=mode, limit=limit, collection=collections)
    return {
        "question": question,
        "answer": answer.text,
        "citations": [citation.to_dict() for citation in answer.citations],
        "sources": [
            {"number": number, **chunk_dict(chunk)}
            for number, chunk in enumerate(answer.chunks, start=1)
        ],
        "model": answer.model,
        "usage": {
            "prompt_tokens": answer.usage.prompt_tokens,
            "completion_tokens": answer.usage.completion_tokens,
            "cost": answer.usage.cost,
        },
        "warnings": list(answer.warnings),
    }


def ingest_text(arguments: Any, config: McpConfig) -> dict[str, Any]:
    """The ``ingest_text`` tool (off unless ``MCP.TOOLS`` lists it): store a text in one of
    ``MCP.INGEST_COLLECTIONS``."""
    args = check_arguments("ingest_text", arguments, INGEST_ARGUMENTS, required=("text",))
    text = _string("ingest_text", "text", args["text"], config.max_ingest_chars)
    title = args.get("title")
    title = "" if title is None else _string("ingest_text", "title", title, MAX_TITLE_CHARS)
    collection = args.get("collection")
    if collection is None:
        if len(config.ingest_collections) > 1:
            raise InvalidOption(
                "ingest_text: collection is required: give one of "
                + ", ".join(config.ingest_collections)
            )
        collection = config.ingest_collections[0]
    _string("ingest_text", "collection", collection, MAX_NAME_CHARS)
    if collection not in config.ingest_collections:
        raise CollectionNotAllowed(collection, "MCP.INGEST_COLLECTIONS")
    document = ingest_service(
        text, collection=collection, title=title, metadata={"ingested_by": "mcp"}
    )
    return {
        "document_id": document.pk,
        "collection": collection,
        "title": document.title,
        "status": document.status,
        "chunks": document.chunk_count,
        "deduplicated": bool(getattr(document, "deduplicated", False)),
    }


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    run: Callable[[Any, McpConfig], dict[str, Any]]
    read_only: bool
    schema: Callable[[McpConfig], dict[str, Any]]


def _collection_schema(names: tuple[str, ...] | None, *, many: bool) -> dict[str, Any]:
    one: dict[str, Any] = {"type": "string", "maxLength": MAX_NAME_CHARS}
    if names is not None:
        one["enum"] = list(names)
    if not many:
        return one
    return {
        "anyOf": [one, {"type": "array", "items": one, "maxItems": MAX_COLLECTIONS_PER_CALL}],
        "description": "A collection name or a list of names (default: every one allowed).",
    }


def _read_schema(text: str, about: str, config: McpConfig, *, source: bool) -> dict[str, Any]:
    properties: dict[str, Any] = {
        text: {"type": "string", "minLength": 1, "description": about},
        "collection": _collection_schema(config.collections, many=True),
        "limit": {
            "type": "integer",
            "minimum": 1,
            "maximum": config.max_results,
            "default": min(5, config.max_results),
            "description": "How many chunks to return (search) or to answer from (ask).",
        },
        "mode": {
            "type": "string",
            "enum": list(MODE_NAMES),
            "description": "semantic (meaning), fulltext (words) or hybrid (both); "
            f"aliases: {aliases_text()}; default: the project's SEARCH['MODE'].",
        },
    }
    if source:
        properties["source_id"] = {
            "type": "string",
            "maxLength": MAX_SOURCE_ID_CHARS,
            "description": "Only chunks of the documents with this source id.",
        }
    return {
        "type": "object",
        "properties": properties,
        "required": [text],
        "additionalProperties": False,
    }


def _ingest_schema(config: McpConfig) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "text": {"type": "string", "minLength": 1, "maxLength": config.max_ingest_chars},
            "collection": _collection_schema(config.ingest_collections, many=False),
            "title": {"type": "string", "maxLength": MAX_TITLE_CHARS},
        },
        "required": ["text"],
        "additionalProperties": False,
    }


TOOLS: dict[str, ToolSpec] = {
    "search": ToolSpec(
        "search",
        "Search the project's knowledge base and return the best matching passages (text, "
        "document and chunk ids, titles, scores). Use it to find facts before answering.",
        search,
        True,
        lambda config: _read_schema("query", "What to look for, in words.", config, source=True),
    ),
    "ask": ToolSpec(
        "ask",
        "Answer a question from the project's knowledge base with the project's LLM; the "
        "answer cites its sources as [n], listed with their document and chunk ids.",
        ask,
        True,
        lambda config: _read_schema("question", "The question to answer.", config, source=False),
    ),
    "ingest_text": ToolSpec(
        "ingest_text",
        "Add a text to the project's knowledge base (chunked, embedded and searchable at once).",
        ingest_text,
        False,
        _ingest_schema,
    ),
}


def call_tool(name: str, arguments: Any, config: McpConfig) -> tuple[dict[str, Any], bool]:
    """Run tool ``name`` and return (its result, whether it is an error). Errors the caller
    can act on come back as ``{"error": {"code", "message"}}`` with the library's stable code;
    anything else is logged here and reported without details."""
    spec = TOOLS.get(name) if name in config.tools else None
    try:
        if spec is None:
            raise InvalidOption(
                f"Unknown tool {_shown(name)}; this server offers {', '.join(config.tools)}"
            )
        return spec.run(arguments, config), False
    except RagError as exc:
        return {"error": {"code": exc.code, "message": scrub_text(exc.message)}}, True
    except Exception:
        logger.exception("MCP tool %r failed", name)
        return {
            "error": {
                "code": "internal_error",
                "message": "The tool failed unexpectedly; the server's log has the details.",
            }
        }, True


def result_text(result: dict[str, Any]) -> str:
    """The JSON text a client shows or gives its model."""
    return json.dumps(result, ensure_ascii=False, default=str)
