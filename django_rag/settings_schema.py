"""The ``DJANGO_RAG`` settings schema: every key and nested key, declared once.

Each :class:`Setting` gives a key's name, the values it accepts (Python types and/or a list of
choices; no types for component specs, which their builders check), its default and a one-line
description. :mod:`django_rag.conf` builds ``DEFAULTS`` from it, rejects unknown keys (with the
closest known name), and checks each value's type when it is read; the system check
``django_rag.E005`` reports every problem at start-up; a test keeps docs/configuration.md in
step with it.

Bounds that need more than a type (a positive number, a weight from 0 to 1, two settings that
depend on each other) stay in the accessors of :mod:`django_rag.conf`, which name the setting.
"""

from __future__ import annotations

import copy
import difflib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .exceptions import ConfigurationError, UnknownSetting
from .modes import NAMES as MODE_NAMES

NUMBER = (int, float)
INTEGER = (int,)


@dataclass(frozen=True)
class Setting:
    """One key of ``DJANGO_RAG``, or of one of its sections (``keys`` set)."""

    name: str
    default: Any
    doc: str
    types: tuple[type, ...] = ()  # () with no choices: any value (a component spec)
    choices: tuple[Any, ...] = ()
    nullable: bool = False
    keys: tuple[Setting, ...] = ()  # a section: a dict of these keys, merged over defaults
    secret: bool = False  # an error about the key never repeats its value

    @property
    def is_section(self) -> bool:
        return bool(self.keys)

    def default_value(self) -> Any:
        if self.is_section:
            return {key.name: key.default_value() for key in self.keys}
        return copy.deepcopy(self.default)

    def accepts(self) -> str:
        """What the key accepts, in words (error messages and docs)."""
        if self.is_section:
            return "a dict"
        parts = []
        if self.choices:
            parts.append(f"one of {', '.join(repr(c) for c in self.choices)}")
        elif self.types:
            names = {
                NUMBER: "a number",
                INTEGER: "an integer",
                (bool,): "True or False",
                (str,): "a string",
                (list, tuple): "a list",
                (dict,): "a dict",
                (str, int): "a string or an integer",
            }
            parts.append(names.get(self.types, " or ".join(t.__name__ for t in self.types)))
        else:
            return "any value"
        if self.nullable:
            parts.append("None")
        return " or ".join(parts)

    def check(self, value: Any, path: str) -> None:
        """Raise :class:`ConfigurationError` naming ``path`` when ``value`` has a wrong type
        or is not among the choices."""
        if self.is_section:
            if not isinstance(value, Mapping):
                raise ConfigurationError(path, value, "must be a dict of settings")
            return
        if value is None and (self.nullable or not (self.types or self.choices)):
            return
        if self.choices:
            ok = any(value == c and type(value) is type(c) for c in self.choices)
        elif self.types:
            # bool is an int to Python; a flag given where a number is wanted is a mistake.
            ok = isinstance(value, self.types) and (
                bool in self.types or not isinstance(value, bool)
            )
        else:
            ok = True
        if not ok:
            shown = HIDDEN if self.secret else value
            raise ConfigurationError(path, shown, f"must be {self.accepts()}")


HIDDEN = "<hidden>"


def secret_values(settings: Mapping[str, Any]) -> list[str]:
    """The strings held by the keys the schema marks secret (``MCP.TOKENS``), in
    ``settings`` (the merged ``DJANGO_RAG``): what log scrubbing and displays must hide."""
    found: list[str] = []

    def collect(value: Any) -> None:
        if isinstance(value, str):
            found.append(value)
        elif isinstance(value, list | tuple):
            for item in value:
                collect(item)

    def walk(keys: tuple[Setting, ...], values: Any) -> None:
        if not isinstance(values, Mapping):
            return
        for key in keys:
            if key.is_section:
                walk(key.keys, values.get(key.name))
            elif key.secret:
                collect(values.get(key.name))

    walk(SCHEMA, settings)
    return found


def _s(
    name, default, doc, types=(), *, choices=(), nullable=False, keys=(), secret=False
) -> Setting:
    return Setting(name, default, doc, types, tuple(choices), nullable, tuple(keys), secret)


MiB = 1024 * 1024

SCHEMA: tuple[Setting, ...] = (
    _s(
        "EMBEDDER",
        {"BACKEND": "sentence-transformers", "OPTIONS": {"model": "all-MiniLM-L6-v2"}},
        "How text becomes vectors: an alias, a dotted path, {BACKEND, OPTIONS}, a class, an "
        "instance or a function.",
    ),
    _s(
        "EMBEDDING_DIMENSIONS",
        384,
        "Size of the chunk embedding column; equals the embedder's output size (at most 2,000 "
        "with VECTOR_INDEX_TYPE 'vector', 4,000 with 'halfvec').",
        INTEGER,
    ),
    _s(
        "VECTOR_INDEX_TYPE",
        "vector",
        "What the HNSW index of the chunk vectors holds: 'vector' (32-bit floats) or 'halfvec' "
        "(16-bit floats, an expression index over the same column: about 43% smaller, models "
        "up to 4,000 dimensions, pgvector 0.7+); rag_maintenance vector-index rebuilds it.",
        choices=("vector", "halfvec"),
    ),
    _s(
        "NEXT_EMBEDDER",
        None,
        "The embedder rag_reembed switches to without downtime (same forms as EMBEDDER).",
    ),
    _s(
        "CHUNKER",
        {"BACKEND": "token", "OPTIONS": {}},
        "How documents are split (same forms as EMBEDDER; 'token' is the built-in splitter).",
    ),
    _s(
        "CHUNK_HEADERS",
        True,
        "Embed and index new chunks with their document title and heading path before their "
        "text (the stored text is unchanged).",
        (bool,),
    ),
    _s(
        "PARSERS",
        {},
        "Parsers by file extension, merged over the built-ins: a dotted path, a Parser class "
        "or instance, or a (parser, {options}) pair; None disables one (the fallback too).",
        (dict,),
    ),
    _s(
        "FALLBACK_PARSER",
        None,
        "The parser for files whose extension no PARSERS entry claims (same forms as a "
        "PARSERS value); None: such files are refused with UnsupportedFileType.",
    ),
    _s(
        "VECTOR_STORE",
        "pgvector",
        "Where search runs: 'pgvector', 'memory', a dotted path or a VectorStore instance.",
    ),
    _s("DEFAULT_COLLECTION", "default", "Collection used when ingest gets none.", (str,)),
    _s(
        "STRICT_COLLECTIONS",
        False,
        "Ingest never creates a collection: an unknown one raises UnknownCollection.",
        (bool,),
    ),
    _s(
        "MAX_DOCUMENT_CHARS",
        10_000_000,
        "Longest document text ingest accepts, in characters.",
        INTEGER,
    ),
    _s(
        "MAX_PDF_PAGES",
        2_000,
        "PDFs with more pages (decks with more slides, workbooks with more sheets) are refused "
        "(None: no limit).",
        INTEGER,
        nullable=True,
    ),
    _s(
        "MAX_PDF_PAGE_CONTENT_BYTES",
        16 * MiB,
        "Bytes of drawing instructions one PDF page may cost (None: no limit).",
        INTEGER,
        nullable=True,
    ),
    _s(
        "PARSE_TIMEOUT",
        60,
        "Seconds reading one file (PDF, office, mail, HTML) may take (None: no limit).",
        NUMBER,
        nullable=True,
    ),
    _s(
        "OCR",
        "auto",
        "OCR of scanned PDF pages: 'auto' (RapidOCR if installed, else Tesseract if on the "
        "PATH), 'rapidocr', 'tesseract' or 'off'.",
        choices=("auto", "rapidocr", "tesseract", "off"),
    ),
    _s("OCR_DPI", 150, "Resolution scanned pages are rendered at for OCR.", INTEGER),
    _s(
        "OCR_MAX_PAGES",
        200,
        "Most scanned pages of one document read by OCR (None: no limit).",
        INTEGER,
        nullable=True,
    ),
    _s(
        "MAX_ZIP_MEMBERS",
        10_000,
        "ZIP-based inputs: most members, from the central directory (None: no limit).",
        INTEGER,
        nullable=True,
    ),
    _s(
        "MAX_ZIP_UNCOMPRESSED_BYTES",
        256 * MiB,
        "ZIP-based inputs: most bytes the archives of one parse may inflate to, counted as "
        "they inflate (None: no limit).",
        INTEGER,
        nullable=True,
    ),
    _s(
        "MAX_ZIP_RATIO",
        100,
        "ZIP-based inputs: most times a member of 1 MiB or more may inflate (None: no limit).",
        NUMBER,
        nullable=True,
    ),
    _s(
        "PDF_TABLES",
        True,
        "Find tables on PDF pages and write them as Markdown tables (costs about 9 times the "
        "text extraction, within half of PARSE_TIMEOUT).",
        (bool,),
    ),
    _s(
        "MAX_ATTACHMENT_DEPTH",
        3,
        "Emails: how deep attachments are read (1: the email's own; 2: also those of an "
        "attached email...; None: no limit).",
        INTEGER,
        nullable=True,
    ),
    _s(
        "MAX_PARSE_MEMORY",
        1024 * MiB,
        "Bytes of address space one parse may add: every entry point parses in a pooled worker "
        "limited to this (None: in the calling process, unbounded, for trusted input).",
        INTEGER,
        nullable=True,
    ),
    _s(
        "TEXT_SEARCH_CONFIG",
        "english",
        "PostgreSQL text search configuration of the chunks' search vectors.",
        (str,),
    ),
    _s(
        "SEARCH",
        None,
        "Search defaults; keys given are merged over these.",
        keys=(
            _s(
                "MODE",
                "semantic",
                "Default search mode (one of the modes or their aliases).",
                (str,),
                choices=MODE_NAMES,
            ),
            _s("LIMIT", 10, "Results per search.", INTEGER),
            _s(
                "EXACT_SEARCH_MAX_ROWS",
                5_000,
                "A filtered search over at most this many chunks is an exact scan.",
                INTEGER,
            ),
            _s(
                "HNSW_EF_SEARCH",
                200,
                "HNSW candidate list size (raised to the limit when smaller).",
                INTEGER,
            ),
            _s("BM25_K1", 1.2, "BM25 k1 of full-text mode.", NUMBER),
            _s("BM25_B", 0.75, "BM25 b of full-text mode.", NUMBER),
            _s(
                "BM25_K3",
                8,
                "BM25 k3: how a word repeated in a full-text query weighs (0: once; None: its "
                "count).",
                NUMBER,
                nullable=True,
            ),
            _s(
                "SYNTAX",
                "natural",
                "How full-text and hybrid modes read a query.",
                choices=("natural", "websearch"),
            ),
            _s(
                "FUSION",
                "adaptive",
                "Hybrid fusion method.",
                choices=("adaptive", "weighted", "rrf"),
            ),
            _s("RRF_K", 60, "Reciprocal rank fusion constant.", NUMBER),
            _s(
                "SEMANTIC_WEIGHT",
                0.7,
                "Adaptive fusion's starting semantic weight; weighted fusion's fixed one.",
                NUMBER,
            ),
            _s(
                "FULLTEXT_WEIGHT",
                0.3,
                "Adaptive fusion's starting full-text weight; weighted fusion's fixed one.",
                NUMBER,
            ),
            _s(
                "KEYWORD_SCORE_FLOOR",
                0.05,
                "Weighted fusion: BM25 is divided by the larger of the best candidate's BM25 "
                "and this floor (a weak full-text side stays weak).",
                NUMBER,
            ),
            _s(
                "CANDIDATES",
                2,
                "Hybrid: each side's top CANDIDATES x limit chunks are fused.",
                INTEGER,
            ),
            _s(
                "CONTEXT_WINDOW",
                0,
                "Chunks each side of a hit returned with it as its context (0: none).",
                INTEGER,
            ),
            _s(
                "DIVERSITY",
                0.0,
                "Relevance traded for chunks unlike those above them (MMR), 0 (off) to 1.",
                NUMBER,
            ),
            _s(
                "RERANK_CANDIDATES",
                3,
                "With a reranker, RERANK_CANDIDATES x limit chunks are reranked.",
                INTEGER,
            ),
            _s(
                "FULLTEXT_BACKEND",
                "auto",
                "Where full-text BM25 runs.",
                choices=("auto", "sql", "pg_textsearch"),
            ),
            _s(
                "DATABASE",
                None,
                "The DATABASES alias searches read (None: the routers, else 'default').",
                (str,),
                nullable=True,
            ),
            _s(
                "MAX_QUERY_TERMS",
                32,
                "Most distinct words a full-text or hybrid query scores with (None: no cap).",
                INTEGER,
                nullable=True,
            ),
            _s(
                "STATEMENT_TIMEOUT",
                None,
                "Seconds one SQL statement of a search may run (None: no limit).",
                NUMBER,
                nullable=True,
            ),
        ),
    ),
    _s(
        "MAX_QUERY_CHARS",
        10_000,
        "Longest query or question search() and ask() accept, in characters.",
        INTEGER,
    ),
    _s(
        "LLM",
        None,
        "Default LLM of ask(), the agent and evaluation: a litellm model string, a dict, a "
        "dotted path, a function or an LLM instance.",
    ),
    _s(
        "LLM_DEADLINE",
        120.0,
        "Seconds one LLM answer may take, retries and streaming included (None: no limit).",
        NUMBER,
        nullable=True,
    ),
    _s(
        "AGENT_DEADLINE",
        300.0,
        "Seconds one Agent run may take (None: no limit).",
        NUMBER,
        nullable=True,
    ),
    _s(
        "ASK",
        None,
        "Defaults of ask() (and chat()'s ask engine) for the options a call leaves unset "
        "(None); keys given are merged over these.",
        keys=(
            _s("LIMIT", 5, "Chunks an answer is written from.", INTEGER),
            _s(
                "MODE",
                None,
                "Search mode of ask() (None: SEARCH['MODE']).",
                (str,),
                choices=MODE_NAMES,
                nullable=True,
            ),
            _s(
                "THRESHOLD",
                None,
                "Lowest score a chunk needs to be answered from (None: no threshold).",
                NUMBER,
                nullable=True,
            ),
            _s(
                "PROMPT",
                None,
                "The answer prompt: a function (question, chunks) or (question, chunks, "
                "graph_context), or its dotted path (None: the built-in prompt).",
            ),
            _s(
                "GROUND",
                False,
                "Whether answers are grounded: False, True (the GROUNDER setting) or a grounder "
                "spec.",
            ),
        ),
    ),
    _s(
        "LOOP",
        None,
        "Defaults of Loop (the tool-calling agent) for the options a call leaves unset (None); "
        "keys given are merged over these.",
        keys=(
            _s("MAX_ITERATIONS", 10, "Most controller turns of one run.", INTEGER),
            _s("LIMIT", 5, "Results of a search the model does not size.", INTEGER),
            _s("MAX_LIMIT", 20, "Most results the model may ask one search for.", INTEGER),
            _s("MAX_CHUNKS", 30, "Most sources one run holds.", INTEGER),
            _s("MAX_TOOL_CALLS", 10, "Most tool calls run from one reply.", INTEGER),
            _s(
                "MAX_TOOL_RESULT_CHARS",
                100_000,
                "Longest tool result sent to the model, in characters.",
                INTEGER,
            ),
            _s(
                "FALLBACK_SYNTHESIS",
                True,
                "Write an answer from the sources found when the turns run out.",
                (bool,),
            ),
            _s(
                "KEEP_SOURCES",
                "best",
                "Which sources are kept once MAX_CHUNKS are held: the best-scoring or the first found.",
                choices=("first", "best"),
            ),
            _s(
                "LLM",
                None,
                "The controller (same forms as LLM; None: the LLM setting).",
            ),
            _s(
                "ANSWER_LLM",
                None,
                "A model that writes the final answer (same forms as LLM; None: the controller's "
                "answer is kept).",
            ),
        ),
    ),
    _s("RERANKER", None, "Reranker search() applies when none is given (None: no reranking)."),
    _s(
        "GROUNDER",
        "llm",
        "Grounder that ground=True uses: 'llm', 'cross-encoder'/'nli', 'embedding', a dict, a "
        "dotted path, a function, an instance, or None.",
    ),
    _s(
        "GRAPH",
        None,
        "GraphRAG: off by default; extractors, matching, Leiden, summaries.",
        keys=(
            _s("ENABLED", False, "Graph on for ingest and search by default.", (bool,)),
            _s(
                "STORE",
                "postgres",
                "Where the graph is kept: 'postgres', 'memory' (this process only), a dotted "
                "path, a class, an instance or a dict.",
            ),
            _s(
                "EXTRACTOR",
                "llm",
                "Combined entity and relationship extractor; None to use the two below.",
            ),
            _s(
                "ENTITY_EXTRACTOR",
                "ner",
                "Entity extractor used when EXTRACTOR is None.",
            ),
            _s(
                "RELATIONSHIP_EXTRACTOR",
                "cooccurrence",
                "Relationship extractor used when EXTRACTOR is None.",
            ),
            _s(
                "SPACY_MODEL",
                "en_core_web_sm",
                "spaCy pipeline the 'spacy' entity extractor loads (a package name or a path).",
                (str,),
            ),
            _s("CONCURRENCY", 3, "Chunks extracted at once.", INTEGER),
            _s(
                "BATCH_SIZE",
                1,
                "Chunks the LLM graph extractor reads in one call (1 to 16).",
                INTEGER,
            ),
            _s(
                "MAX_ENTITIES_PER_CHUNK",
                50,
                "Most entities one chunk's extraction may add.",
                INTEGER,
            ),
            _s(
                "MAX_RELATIONSHIPS_PER_CHUNK",
                100,
                "Most relationships one chunk's extraction may add.",
                INTEGER,
            ),
            _s("ENTITY_MATCHER", "embedding", "How a query is matched to entities."),
            _s("MATCH_THRESHOLD", 0.3, "Lowest score of a matched entity.", NUMBER),
            _s("MATCH_LIMIT", 20, "Most entities a query matches.", INTEGER),
            _s("DEPTH", 0, "Relationship hops expanded from the matched entities.", INTEGER),
            _s("DEPTH_DECAY", 0.5, "Score factor per hop of expansion.", NUMBER),
            _s("RRF_K", 60, "Reciprocal rank fusion constant of the graph list.", NUMBER),
            _s("WEIGHT", 0.75, "The graph list's weight in the fusion (a number >= 0).", NUMBER),
            _s(
                "MIN_MATCH_SCORE",
                0.8,
                "No graph list when the best matched entity scores less (0 to 1).",
                NUMBER,
            ),
            _s("RESOLUTION", 1.0, "Leiden resolution.", NUMBER),
            _s("LEVELS", 1, "Leiden hierarchy levels.", INTEGER),
            _s("MAX_CLUSTER_SIZE", 50, "Largest community before it is split.", INTEGER),
            _s("MIN_SIZE", 2, "Smallest community kept.", INTEGER),
            _s("SEED", 42, "Leiden random seed.", INTEGER, nullable=True),
            _s(
                "COMMUNITY_DETECTOR",
                "leiden",
                "Community detector: 'leiden', a dotted path, a class, an instance, a function "
                "(entities, relationships, options) -> levels, or None/False: no detection.",
                nullable=True,
            ),
            _s(
                "ISOLATED_COMMUNITIES",
                False,
                "Give each entity without relationships a community of its own.",
                (bool,),
            ),
            _s(
                "COMMUNITY_SUMMARIZER",
                None,
                "Community summarizer: None (the LLM), a dotted path, a class, an instance or "
                "a function (entities, relationships) -> str.",
                nullable=True,
            ),
            _s(
                "SUMMARY_THRESHOLD",
                10,
                "Changes to a community before its summary is refreshed.",
                INTEGER,
            ),
            _s("SUMMARY_CONCURRENCY", 4, "Summaries written at once.", INTEGER),
            _s("SUMMARY_LEVELS", [0], "Community levels that get summaries.", (list, tuple)),
            _s("CONTEXT_ENTITIES", 10, "Entities ask(graph=True) adds to the prompt.", INTEGER),
            _s(
                "CONTEXT_RELATIONSHIPS",
                20,
                "Relationships ask(graph=True) adds to the prompt.",
                INTEGER,
            ),
            _s(
                "CONTEXT_SUMMARIES",
                5,
                "Community summaries ask(graph=True) adds to the prompt.",
                INTEGER,
            ),
        ),
    ),
    _s(
        "DASHBOARD",
        None,
        "The dashboard: who may use it, which collections each user sees, upload limit.",
        keys=(
            _s(
                "PERMISSION",
                None,
                "A callable (user) -> bool or its dotted path (None: staff users).",
            ),
            _s(
                "COLLECTIONS",
                None,
                "A callable (user) -> collection names or its dotted path (None: all).",
            ),
            _s("MAX_UPLOAD_BYTES", 10 * MiB, "Largest upload accepted, in bytes.", INTEGER),
            _s("PAGE_SIZE", 20, "Rows per page of the dashboard's lists.", INTEGER),
        ),
    ),
    _s(
        "CHAT",
        None,
        "Conversations: how follow-ups are condensed, how much history is kept, citation links.",
        keys=(
            _s(
                "CONDENSER",
                "llm",
                "Turns a follow-up into a standalone query: 'llm', None (never), a dotted path "
                "or a function (message, history) -> str.",
            ),
            _s("LLM", None, "LLM of the 'llm' condenser (None: DJANGO_RAG['LLM']).", nullable=True),
            _s(
                "HISTORY_TOKENS",
                2_000,
                "Most tokens of earlier turns the condenser and the answer see (older dropped).",
                INTEGER,
            ),
            _s(
                "CITATION_URL",
                None,
                "Where the chat box links a citation: a template with {source_id}, "
                "{document_id}, {chunk_id}, {collection} (None: no link).",
                (str,),
                nullable=True,
            ),
        ),
    ),
    _s(
        "API",
        None,
        "The HTTP API: token authentication hook, anonymous chat, rate limits, body sizes.",
        keys=(
            _s(
                "AUTHENTICATE",
                None,
                "A callable (request) -> user or None, or its dotted path, tried before the "
                "session (token or API-key auth; such requests need no CSRF token).",
            ),
            _s(
                "ANONYMOUS",
                False,
                "Let anonymous visitors search, ask and chat (conversations kept per session).",
                (bool,),
            ),
            _s(
                "READ_ALL",
                None,
                "Who reads every collection when DASHBOARD['COLLECTIONS'] is not set: 'staff' "
                "(active staff; other callers read nothing), 'authenticated' (every logged-in "
                "user), 'anyone' (anonymous visitors too, with ANONYMOUS); None: 'staff', and "
                "system check W007 says so.",
                choices=("staff", "authenticated", "anyone"),
                nullable=True,
            ),
            _s(
                "RATE_LIMIT",
                60,
                "Requests per minute per user (per IP address when anonymous); None: no limit.",
                INTEGER,
                nullable=True,
            ),
            _s(
                "TOKEN_BUDGET",
                200_000,
                "LLM tokens per user in TOKEN_WINDOW seconds; None: no budget.",
                INTEGER,
                nullable=True,
            ),
            _s("TOKEN_WINDOW", 86_400, "Seconds of the token budget's window.", INTEGER),
            _s(
                "RESERVE_TOKENS",
                None,
                "Tokens an answer reserves against TOKEN_BUDGET before it runs (settled with "
                "what it used); None: estimated from the question, limit, chat history and the "
                "LLM's max_tokens.",
                INTEGER,
                nullable=True,
            ),
            _s("MAX_BODY_BYTES", 64 * 1024, "Largest JSON request body, in bytes.", INTEGER),
            _s(
                "CACHE",
                "default",
                "The CACHES alias rate limits and budgets count in (shared by every process, "
                "with an atomic incr: Redis or Memcached).",
                (str,),
            ),
        ),
    ),
    _s(
        "BACKGROUND",
        "auto",
        "Where background work runs ('sync' is accepted for 'inline').",
        choices=("auto", "celery", "thread", "worker", "inline", "sync"),
    ),
    _s(
        "JOBS",
        None,
        "Jobs outside Celery: thread pool size, heartbeat, stall limit, worker polling.",
        keys=(
            _s("THREADS", 1, "Size of the thread pool.", INTEGER),
            _s("HEARTBEAT_SECONDS", 10, "How often a running job records a heartbeat.", NUMBER),
            _s(
                "STALLED_AFTER_SECONDS",
                120,
                "After how long without a heartbeat a job counts as stalled.",
                NUMBER,
            ),
            _s("POLL_SECONDS", 1.0, "How often an idle rag_worker polls for work.", NUMBER),
        ),
    ),
    _s(
        "PRELOAD_MODELS",
        False,
        "Load the local models when a web or Celery worker process starts.",
        (bool,),
    ),
    _s(
        "MCP",
        None,
        "The MCP server (manage.py rag_mcp): what it may read and write, and its caps.",
        keys=(
            _s(
                "COLLECTIONS",
                [],
                "Collections its tools may read: a list of names, or '*' for all ([]: none).",
                (list, tuple, str),
            ),
            _s(
                "TOOLS",
                ["search", "ask"],
                "Tools it offers, from 'search', 'ask' and 'ingest_text'.",
                (list, tuple),
            ),
            _s(
                "INGEST_COLLECTIONS",
                [],
                "Collections the ingest_text tool may write to ([]: the tool is off).",
                (list, tuple),
            ),
            _s("MAX_RESULTS", 20, "Most chunks one search or ask call may ask for.", INTEGER),
            _s("MAX_INGEST_CHARS", 100_000, "Longest text ingest_text accepts.", INTEGER),
            _s(
                "MAX_CONCURRENT_CALLS",
                4,
                "Tool calls run at once (more wait their turn).",
                INTEGER,
            ),
            _s(
                "TOKENS",
                [],
                "Bearer tokens an HTTP client must send one of ([]: none asked for; loopback "
                "only unless --allow-remote).",
                (list, tuple),
                secret=True,
            ),
        ),
    ),
    _s(
        "TELEMETRY",
        None,
        "Telemetry: raw text in metadata, logging, Prometheus, OpenTelemetry.",
        keys=(
            _s(
                "INCLUDE_TEXT",
                False,
                "Put raw document, query and answer text in metadata.",
                (bool,),
            ),
            _s(
                "LOG_LEVEL",
                None,
                "Attach the logging receiver at this level at start-up (None: not attached).",
                (str, int),
                nullable=True,
            ),
            _s("PROMETHEUS", True, "Count Prometheus metrics.", (bool,)),
            _s("OPENTELEMETRY", False, "Emit OpenTelemetry spans.", (bool,)),
            _s(
                "PROMETHEUS_COLLECTION_LABELS",
                False,
                "Label Prometheus metrics with collection names (else 'all').",
                (bool,),
            ),
        ),
    ),
)

BY_NAME: dict[str, Setting] = {setting.name: setting for setting in SCHEMA}
# "NAME" and "SECTION.NAME" -> Setting: the accessors look a key up on every read.
_BY_PATH: dict[str, Setting] = {
    **BY_NAME,
    **{f"{s.name}.{key.name}": key for s in SCHEMA for key in s.keys},
}


def defaults() -> dict[str, Any]:
    """A new dict of every key's default (sections as dicts of their keys' defaults)."""
    return {setting.name: setting.default_value() for setting in SCHEMA}


def lookup(path: str) -> Setting:
    """The :class:`Setting` of ``"NAME"`` or ``"SECTION.NAME"``."""
    return _BY_PATH[path]


def closest(name: Any, known: Iterable[str], n: int = 3) -> list[str]:
    """The known names closest to ``name`` (a typo's likely meanings), best first: by the
    whole name, else by its words (``HYRBID_WEIGHTS`` -> the keys with ``WEIGHT``)."""
    if not isinstance(name, str):
        return []
    known = list(known)
    upper = {k.upper(): k for k in known}
    if name.upper() in upper:  # "search" for "SEARCH"
        return [upper[name.upper()]]
    found = difflib.get_close_matches(name.upper(), known, n=n, cutoff=0.6)
    if found:
        return found
    words = {word for key in known for word in key.split("_")}
    matched = set()
    for word in name.upper().split("_"):
        if len(word) > 2:
            matched.update(difflib.get_close_matches(word, words, n=n, cutoff=0.8))
    return [k for k in known if matched & set(k.split("_"))][:n]


def check_known(user: Mapping[str, Any]) -> None:
    """Raise :class:`UnknownSetting` for the first unknown key of ``user`` (``DJANGO_RAG``)
    or of one of its sections, and :class:`ConfigurationError` for a section that is not a
    dict."""
    for name in sorted(user, key=str):
        setting = BY_NAME.get(name)
        if setting is None:
            raise _unknown(name, name, user[name], SCHEMA)
        if setting.is_section:
            value = user[name]
            setting.check(value, name)
            for key in sorted(value, key=str):
                if key not in {known.name for known in setting.keys}:
                    raise _unknown(f"{name}.{key}", key, value[key], setting.keys)


def _unknown(path: str, key: Any, value: Any, keys: tuple[Setting, ...]) -> UnknownSetting:
    """The error for an unknown key; its value is hidden when the key it is closest to is
    secret (``MCP.TOKEN`` for ``MCP.TOKENS`` holds tokens all the same)."""
    known = [key.name for key in keys]
    suggestions = closest(key, known)
    secret = {key.name for key in keys if key.secret}
    return UnknownSetting(path, HIDDEN if secret & set(suggestions) else value, suggestions, known)


def problems(settings: Mapping[str, Any]) -> list[ConfigurationError]:
    """Every type error of the merged ``settings`` (unknown keys are checked before)."""
    found = []
    for setting in SCHEMA:
        value = settings.get(setting.name)
        for key, path, item in (
            [(k, f"{setting.name}.{k.name}", value.get(k.name)) for k in setting.keys]
            if setting.is_section and isinstance(value, Mapping)
            else [(setting, setting.name, value)]
        ):
            try:
                key.check(item, path)
            except ConfigurationError as exc:
                found.append(exc)
    return found
