"""The ingest request: the write side's options declared once (:class:`IngestOptions`, what the
public ``ingest*`` signatures take as ``**options``), checked once per call
(:func:`build_ingest_request`) into one frozen :class:`IngestRequest`, which every step below
the entry point receives unchanged: the single-document path (:mod:`.service`), the batches
(:mod:`.batch`, :mod:`.files`), folder sync (:mod:`.folders`), background ingestion
(:mod:`.queued`) and model sync (:mod:`django_rag.sync`).

The collection is resolved here and nowhere else: a name or ``{"name", "description"}``, and
under strict ingest (``strict_collections=`` or ``STRICT_COLLECTIONS``) one that must exist, so
every entry point refuses an unknown collection the same way, before anything is parsed,
embedded or written.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any, NamedTuple, TypedDict

from ..embeddings import Embedder, get_embedder
from ..exceptions import InvalidOption
from ..graph.extractors import GraphExtractor
from ..validation import clean_metadata, clean_title
from .chunkers import Chunker, chunk_options, get_chunker
from .collections import resolve_ingest_collection, strict_setting
from .graphs import refuse_background_extractors, use_graph

# "html" is read into Markdown first (rich-text fields, CMS pages): see parsers.html.
FORMATS = ("text", "markdown", "html")
ON_CHUNK_ERROR = ("raise", "skip")
# Arcana spells the all-or-nothing mode "abort"; ours was "raise" first. Both are accepted.
ON_CHUNK_ERROR_ALIASES = {"abort": "raise"}
ON_ERROR = ("raise", "skip")


class IngestOptions(TypedDict, total=False):
    """The keyword options of the ``ingest*`` functions (each takes the subset listed for it
    in :data:`TAKES`); docs/ingestion.md describes each one."""

    collection: str | Mapping[str, str] | None
    title: str | None
    metadata: dict[str, Any] | None
    source_id: str | None
    replace: bool
    format: str
    chunker: Any
    embedder: Any
    chunk_size: int | None
    chunk_overlap: int | None
    background: bool
    graph: bool | None
    extractor: Any
    entity_extractor: Any
    relationship_extractor: Any
    graph_store: Any
    on_chunk_error: str
    strict_collections: bool | None
    group_size: int
    on_error: str
    progress: Callable[[int, int], None] | None


class CollectionTarget(NamedTuple):
    """The collection an ingest writes to: its name, and the description the call gave (stored
    once the input is valid: :func:`~django_rag.ingestion.collections.apply_description`)."""

    name: str
    description: str | None = None


@dataclass(frozen=True)
class IngestRequest:
    """One ingest call's options, checked: built by :func:`build_ingest_request`, then only
    read. Its fields are :class:`IngestOptions`' keys (a test keeps them equal), resolved:
    ``collection`` a :class:`CollectionTarget`, ``chunker`` the
    :class:`~django_rag.ingestion.chunkers.Chunker` with ``chunk_size`` / ``chunk_overlap``
    applied, ``embedder`` an :class:`~django_rag.embeddings.Embedder`, ``graph`` False, True (the configured extractor)
    or the call's :class:`~django_rag.graph.extractors.GraphExtractor`, ``on_chunk_error``
    ``"raise"`` or ``"skip"`` and ``strict_collections`` a bool."""

    collection: CollectionTarget
    title: str = ""
    metadata: dict[str, Any] | None = None
    source_id: str | None = None
    replace: bool = False
    format: str = "text"
    chunker: Chunker | None = None
    embedder: Embedder | None = None
    chunk_size: int | None = None
    chunk_overlap: int | None = None
    background: bool = False
    graph: bool | GraphExtractor = False
    extractor: Any = None
    entity_extractor: Any = None
    relationship_extractor: Any = None
    graph_store: Any = None
    on_chunk_error: str = "raise"
    strict_collections: bool = False
    group_size: int = 64
    on_error: str = "skip"
    progress: Callable[[int, int], None] | None = None

    @property
    def collection_name(self) -> str:
        return self.collection.name

    @property
    def job_options(self) -> dict[str, Any]:
        """What a background job needs of the request (JSON: a worker gets no components)."""
        return {
            "chunk_size": self.chunk_size,
            "chunk_overlap": self.chunk_overlap,
            "graph": bool(self.graph),
            "on_chunk_error": self.on_chunk_error,
        }


# --- which entry point takes which option ---------------------------------------------------

_SHARED = frozenset(
    {
        "collection",
        "chunker",
        "embedder",
        "chunk_size",
        "chunk_overlap",
        "graph",
        "extractor",
        "entity_extractor",
        "relationship_extractor",
        "graph_store",
        "strict_collections",
    }
)
_ONE_DOCUMENT = _SHARED | {
    "title",
    "metadata",
    "source_id",
    "replace",
    "background",
    "on_chunk_error",
}
_BATCH = _SHARED | {"replace", "group_size"}

#: The options each entry point takes; another known option is refused naming those that take
#: it (``ingest_many`` items carry their own title and source id; a file's format is its
#: extension; folder sync derives identities and always replaces).
TAKES: dict[str, frozenset[str]] = {
    "ingest": _ONE_DOCUMENT | {"format"},
    "ingest_file": _ONE_DOCUMENT,
    "ingest_bytes": _ONE_DOCUMENT,
    "ingest_many": _BATCH | {"format", "on_error"},
    "ingest_files": _BATCH | {"title", "metadata", "progress"},
    "sync_folder": _SHARED | {"metadata", "group_size", "progress"},
    # MemoryVectorStore.ingest: chunked and embedded as the write path does, kept in memory.
    "MemoryVectorStore.ingest": frozenset(
        {
            "collection",
            "title",
            "metadata",
            "source_id",
            "format",
            "chunker",
            "embedder",
            "chunk_size",
            "chunk_overlap",
            "on_chunk_error",
        }
    ),
    # Model sync (django_rag.sync): a row's document, replaced, embedded where it runs.
    "sync": frozenset(
        {"collection", "title", "metadata", "source_id", "replace", "format", "strict_collections"}
    ),
}

OPTION_NAMES = frozenset(IngestOptions.__annotations__)


def check_ingest_options(options: Mapping[str, Any], entry: str) -> None:
    """Raise :class:`~django_rag.exceptions.InvalidOption` for the first option ``entry``
    (an ``ingest*`` function's name) does not take: an unknown name with the closest known
    one, a known one with the entry points that take it."""
    takes = TAKES[entry]
    for name in options:
        if name in takes:
            continue
        if name in OPTION_NAMES:
            others = ", ".join(f"{other}()" for other, names in TAKES.items() if name in names)
            raise InvalidOption(
                f"{entry}() does not take {name!r} (taken by {others or 'no entry point'})"
            )
        close = difflib.get_close_matches(str(name), sorted(takes), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise InvalidOption(
            f"{entry}() got an unknown option {name!r}{hint} (its options: "
            f"{', '.join(sorted(takes))})"
        )


def normalize_on_chunk_error(value: Any) -> str:
    """``"raise"`` or ``"skip"`` (``"abort"``, Arcana's spelling, is ``"raise"``)."""
    value = ON_CHUNK_ERROR_ALIASES.get(value, value) if isinstance(value, str) else value
    if value not in ON_CHUNK_ERROR:
        raise InvalidOption(
            f"on_chunk_error must be one of {', '.join((*ON_CHUNK_ERROR, 'abort'))}, got {value!r}"
        )
    return value


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidOption(f"{name} must be a positive integer, got {value!r}")
    return value


def build_ingest_request(entry: str, options: Mapping[str, Any]) -> IngestRequest:
    """The :class:`IngestRequest` of one call to ``entry`` with ``options``: every option
    checked (:func:`check_ingest_options`, then each value), the collection resolved (strict
    ingest: an unknown one raises :class:`~django_rag.exceptions.UnknownCollection`), the
    embedder and the graph extractor resolved. Nothing is written."""
    check_ingest_options(options, entry)
    values = {field.name: field.default for field in fields(IngestRequest)}
    values.update(options)
    values["on_chunk_error"] = normalize_on_chunk_error(values["on_chunk_error"])
    if values["on_error"] not in ON_ERROR:
        raise InvalidOption(
            f"on_error must be one of {', '.join(ON_ERROR)}, got {values['on_error']!r}"
        )
    if values["format"] not in FORMATS:
        raise InvalidOption(f"format must be one of {', '.join(FORMATS)}, got {values['format']!r}")
    _positive_int("group_size", values["group_size"])
    if values["progress"] is not None and not callable(values["progress"]):
        raise InvalidOption("progress must be a callable progress(done, total) or None")
    if values["title"] is None:
        values["title"] = ""
    clean_title(values["title"])
    if values["metadata"] is not None:
        clean_metadata(values["metadata"])
    if values["replace"] and not values["source_id"] and "source_id" in TAKES[entry]:
        raise InvalidOption(
            "replace=True needs a source_id: it replaces the document with the same "
            "(collection, source_id)."
        )
    extractors = (
        values["extractor"],
        values["entity_extractor"],
        values["relationship_extractor"],
    )
    if values["background"]:
        if values["chunker"] is not None or values["embedder"] is not None:
            raise InvalidOption(
                "background=True uses the configured chunker and embedder (a worker cannot "
                "receive per-call components)."
            )
        refuse_background_extractors(*extractors, values["graph_store"])
    chunker = get_chunker(
        values["chunker"], **chunk_options(values["chunk_size"], values["chunk_overlap"])
    )
    graph = use_graph(options.get("graph"), *extractors)
    strict = strict_setting(options.get("strict_collections"))
    values.update(
        # Last: the one check that reads the database.
        collection=CollectionTarget(*resolve_ingest_collection(options.get("collection"), strict)),
        strict_collections=strict,
        graph=graph,
        chunker=chunker,
        embedder=get_embedder(values["embedder"]),
    )
    return IngestRequest(**values)
