"""Typed errors raised by django_rag.

Every error carries a stable ``code`` (match on it, not on the message) and a message that says
what to do next. Errors about bad input subclass :class:`ValueError`; configuration errors
subclass Django's :class:`~django.core.exceptions.ImproperlyConfigured`.
"""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured


class RagError(Exception):
    """Base class of every django_rag error."""

    code = "rag_error"

    def __init__(self, message: str, **details):
        super().__init__(message)
        self.message = message
        self.details = details

    def __str__(self) -> str:
        return self.message


# --- configuration -------------------------------------------------------------------------


class ConfigurationError(RagError, ImproperlyConfigured):
    """A ``DJANGO_RAG`` setting or a per-call component is invalid."""

    code = "configuration_error"

    def __init__(self, setting: str, value, cause: str):
        super().__init__(
            f"DJANGO_RAG[{setting!r}] = {value!r} is invalid: {cause}",
            setting=setting,
            value=value,
        )
        self.setting = setting
        self.value = value
        self.cause = cause


class UnknownSetting(ConfigurationError):
    """``DJANGO_RAG`` (or one of its sections: ``SEARCH``, ``GRAPH``...) has a key the library
    does not know, most often a typo. ``suggestions``: the closest known keys, best first
    (``suggestion``: the first, or None); ``known``: every key accepted there."""

    code = "unknown_setting"

    def __init__(self, setting: str, value, suggestions, known):
        self.suggestions = list(suggestions)
        self.suggestion = self.suggestions[0] if self.suggestions else None
        self.known = list(known)
        if self.suggestions:
            cause = f"unknown setting; did you mean {' or '.join(map(repr, self.suggestions))}?"
        else:
            cause = f"unknown setting; known settings are {', '.join(self.known)}"
        super().__init__(setting, value, cause)
        self.details["suggestions"] = self.suggestions


class MissingDependency(RagError, ImproperlyConfigured):
    """An optional dependency is needed for what was asked."""

    code = "missing_dependency"

    def __init__(self, package: str, extra: str, feature: str):
        super().__init__(
            f"{feature} needs the '{package}' package, which is not installed. "
            f"Install it with: pip install 'django-rag[{extra}]'",
            package=package,
            extra=extra,
        )
        self.package = package
        self.extra = extra


class ParserUnavailable(MissingDependency):
    """The parser chosen for a file needs an optional extra that is not installed. Raised
    before the parser runs (and before an upload is stored or a worker is started), naming
    the parser, the file and the extra to install. Also a :class:`MissingDependency`, so
    handlers of that keep working."""

    code = "parser_unavailable"

    def __init__(self, package: str, extra: str, *, parser: str, filename: str):
        super().__init__(package, extra, f"The parser {parser} (chosen for {filename!r})")
        self.details.update(parser=parser, filename=filename)
        self.parser = parser
        self.filename = filename


class BrokenDependency(MissingDependency):
    """An optional dependency is installed but cannot be imported: a package it needs is
    missing or broken (an older pip, for one, skips a dependency's extra whose name it does not
    normalise). ``module`` is the module whose import failed and ``error`` the ImportError, as
    ``Class: message``."""

    code = "broken_dependency"

    def __init__(
        self, package: str, extra: str, feature: str, *, version: str, module: str, error: str
    ):
        RagError.__init__(
            self,
            f"{feature} needs the '{package}' package, which is installed ({version}) but cannot "
            f"be imported: importing {module} failed with {error}. Install what it is missing "
            f"with: pip install 'django-rag[{extra}]' (the extra names every package "
            "its imports need), or install the module the error names.",
            package=package,
            extra=extra,
            version=version,
            module=module,
            error=error,
        )
        self.package = package
        self.extra = extra
        self.version = version
        self.module = module
        self.error = error


class MissingModel(MissingDependency):
    """A model an optional component loads (a spaCy pipeline, ...) is not installed.

    ``install`` is the command that installs it."""

    code = "missing_model"

    def __init__(self, model: str, feature: str, install: str, setting: str = ""):
        RagError.__init__(
            self,
            f"{feature} needs the model {model!r}, which is not installed. Install it with: "
            f"{install}"
            + (f" (or name another one in DJANGO_RAG[{setting!r}])" if setting else ""),
            model=model,
            install=install,
        )
        self.package = model
        self.extra = ""
        self.model = model
        self.install = install


class EmbeddedServerError(RagError, ImproperlyConfigured):
    """The embedded PostgreSQL (``django_rag.embedded``) cannot start or upgrade."""

    code = "embedded_server_error"


class EmbeddedDataVersionMismatch(EmbeddedServerError):
    """The embedded data directory was created by another PostgreSQL major version than the
    embedded server runs (a PostgreSQL 16 directory from the older ``pgserver`` default)."""

    code = "embedded_data_version_mismatch"

    def __init__(self, message: str, *, path, data_version: int, server_version: int):
        super().__init__(
            message, path=str(path), data_version=data_version, server_version=server_version
        )
        self.path = path
        self.data_version = data_version
        self.server_version = server_version


class EmbeddedDataDirectoryError(EmbeddedServerError):
    """The embedded data directory cannot be used as it is; the message says what to do.

    ``problem`` says which, as a stable string: ``"not_a_directory"`` (the path is a file),
    ``"not_a_data_directory"`` (a non-empty directory without ``PG_VERSION`` that no
    interrupted first start left), ``"bad_pg_version"`` (``PG_VERSION`` holds no major
    version) or ``"bad_handle_pids"`` (``.handle_pids.json`` is not a list of process ids)."""

    code = "embedded_data_directory_error"

    def __init__(self, message: str, *, path, problem: str):
        super().__init__(message, path=str(path), problem=problem)
        self.path = path
        self.problem = problem


class EmbeddedServerNotReady(EmbeddedServerError):
    """The embedded server did not accept connections in time: a server of the directory is
    still starting, stopping or recovering, processes of a killed one have not exited, or a
    first start in another process is still creating the directory. The message names them."""

    code = "embedded_server_not_ready"


class DimensionMismatch(RagError):
    """An embedder returned vectors whose size differs from the embedding column."""

    code = "dimension_mismatch"


class InvalidParserOutput(RagError):
    """A parser (built-in or from ``DJANGO_RAG["PARSERS"]``) returned a document that cannot
    be stored as it is: text not a string, or pages outside the text, out of order or
    overlapping. The message names the parser and the file; fix the parser."""

    code = "invalid_parser_output"


# --- input ------------------------------------------------------------------------------------


class InvalidInput(RagError, ValueError):
    """Base class for errors caused by the caller's input."""

    code = "invalid_input"


class EmptyDocument(InvalidInput):
    code = "empty_document"


class DocumentTooLarge(InvalidInput):
    code = "document_too_large"


class InvalidText(InvalidInput):
    code = "invalid_text"


class InvalidOption(InvalidInput):
    code = "invalid_option"


class UnsupportedFileType(InvalidInput):
    code = "unsupported_file_type"


class CorruptFile(InvalidInput):
    code = "corrupt_file"


class EncryptedPDF(CorruptFile):
    code = "encrypted_pdf"


class NoTextLayer(InvalidInput):
    code = "no_text_layer"


class FileNotFound(InvalidInput):
    code = "file_not_found"


class InvalidSearchMode(InvalidInput):
    code = "invalid_search_mode"


class QueryTooLong(InvalidInput):
    """A search query or question is longer than ``MAX_QUERY_CHARS``."""

    code = "query_too_long"


class SearchTimeout(RagError, TimeoutError):
    """A database statement of a search ran longer than ``SEARCH["STATEMENT_TIMEOUT"]`` and
    was cancelled (nothing was written; the search returned nothing)."""

    code = "search_timeout"

    def __init__(self, seconds: float, *, database: str = "default"):
        super().__init__(
            f"The search was cancelled: one of its database statements ran longer than "
            f"SEARCH['STATEMENT_TIMEOUT'] ({seconds:g} s) on database {database!r}. Search "
            "again with a shorter query (fewer distinct words) or scoped to a collection; if "
            "such searches are expected, raise STATEMENT_TIMEOUT or lower "
            "SEARCH['MAX_QUERY_TERMS'] (docs/search.md, 'Cost budget').",
            seconds=seconds,
            database=database,
        )
        self.seconds = seconds
        self.database = database


# --- state ------------------------------------------------------------------------------------


class UnknownCollection(RagError, LookupError):
    code = "unknown_collection"

    def __init__(self, name: str, *, hint: str | None = None):
        hint = hint or "Ingest a document into it first, or create it with"
        super().__init__(
            f"No collection named {name!r}. {hint} "
            f"Collection.objects.create(name={name!r}); names are case-sensitive.",
            name=name,
        )
        self.name = name


class CollectionNotEmpty(RagError):
    code = "collection_not_empty"

    def __init__(self, name: str, document_count: int):
        super().__init__(
            f"Collection {name!r} still has {document_count} document(s); delete them first "
            "(django_rag.delete(document) for each) and then delete the collection.",
            name=name,
            document_count=document_count,
        )


class DocumentNotFound(RagError, LookupError):
    code = "document_not_found"


class TestCaseNotFound(RagError, LookupError):
    """No evaluation test case has this id (or it lies outside the collections asked for)."""

    __test__ = False  # not a pytest test class
    code = "test_case_not_found"


class RunNotFound(RagError, LookupError):
    """No evaluation run has this id (or it lies outside the collections asked for)."""

    code = "run_not_found"


class DocumentSuperseded(RagError):
    """A write came too late: a newer version of the same (collection, source_id) was submitted
    after it and has already replaced or deleted the source, so this older version was not
    stored. Nothing is lost (the newer version is what the caller asked for last); a
    background job that meets this ends as ``superseded``."""

    code = "document_superseded"

    def __init__(self, collection: str, source_id: str, version: int, newer: int = 0):
        by = (
            f"was overtaken by version {newer}, submitted after it and already written"
            if newer
            else "was replaced by a newer version or deleted before it was written"
        )
        super().__init__(
            f"Not stored: version {version} of source {source_id!r} in collection "
            f"{collection!r} {by}. Nothing to do unless you expected this call to be the "
            "newest.",
            collection=collection,
            source_id=source_id,
            version=version,
            newer=newer,
        )
        self.collection, self.source_id, self.version, self.newer = (
            collection,
            source_id,
            version,
            newer,
        )


class EmbeddingFailed(RagError):
    """The embedder failed; nothing was written."""

    code = "embedding_failed"

    def __init__(self, message: str, *, chunk_index: int | None = None):
        super().__init__(message, chunk_index=chunk_index)
        self.chunk_index = chunk_index


# --- LLM ------------------------------------------------------------------------------------


class LLMNotConfigured(RagError, ImproperlyConfigured):
    """An operation needs an LLM and none was given or configured."""

    code = "llm_not_configured"

    def __init__(self, feature: str):
        super().__init__(
            f"{feature} needs an LLM: pass llm=... (a litellm model string such as "
            "'openai/gpt-4o-mini', a callable or an LLM instance) or set DJANGO_RAG['LLM'].",
            feature=feature,
        )


class LLMError(RagError):
    """An LLM call failed (after its retries, when the failure was transient)."""

    code = "llm_error"

    def __init__(self, message: str, *, model: str = "", attempts: int = 1):
        super().__init__(message, model=model, attempts=attempts)
        self.model = model
        self.attempts = attempts


class LLMAuthenticationError(LLMError):
    """The provider refused the call's credentials: no API key was found, or the key was
    rejected (HTTP 401/403). Never retried: set or fix the key (``env_var`` names the
    environment variable litellm reads for the model's provider, when known)."""

    code = "llm_authentication_failed"

    def __init__(self, message: str, *, model: str = "", attempts: int = 1, env_var: str = ""):
        super().__init__(message, model=model, attempts=attempts)
        self.env_var = env_var


class LLMResponseError(LLMError):
    """The LLM answered, but not in the expected form (no JSON found, empty text, ...)."""

    code = "llm_response_error"

    def __init__(self, message: str, *, text: str = "", model: str = ""):
        super().__init__(message, model=model)
        # Keep a bounded excerpt: enough to debug a prompt, never a whole document.
        self.text = text[:500]


class BackgroundUnavailable(RagError):
    """Background work could not be handed to a worker (the Celery broker is unreachable).
    Nothing was left waiting: the pending document or job was removed or marked failed."""

    code = "background_unavailable"


class JobNotRetryable(RagError):
    """A job cannot be retried: it is neither failed nor stalled, or its kind has no task to
    run again (a foreground command's job: run the command again, with ``--resume``)."""

    code = "job_not_retryable"


class LLMStreamError(LLMError):
    """A streamed answer ended before the model finished it (the connection dropped, or the
    provider never sent its finish event). The text received so far is in ``partial``: it is
    incomplete, so show it as such or ask again."""

    code = "llm_stream_incomplete"

    def __init__(self, message: str, *, model: str = "", partial: str = ""):
        super().__init__(message, model=model)
        self.partial = partial


class LLMTimeout(LLMError, TimeoutError):
    """An LLM answer did not finish within its deadline (``DJANGO_RAG["LLM_DEADLINE"]``, or
    what was left of the agent's ``AGENT_DEADLINE``), retries and streaming included."""

    code = "llm_timeout"

    def __init__(self, message: str, *, model: str = "", attempts: int = 1):
        super().__init__(message, model=model, attempts=attempts)


class AgentTimeout(RagError, TimeoutError):
    """An agent run passed ``AGENT_DEADLINE`` (or ``Agent(deadline=...)``): the steps after it
    did not run. Set as ``ctx.error`` with ``failed_step`` naming the first skipped step."""

    code = "agent_timeout"


class CollectionNotAllowed(RagError, PermissionError):
    """A caller outside the trusted code (an MCP client) named a collection its configuration
    does not let it read or write. The message is the same whether the collection exists or
    not, so it tells the caller nothing about collections it may not see."""

    code = "collection_not_allowed"

    def __init__(self, name: str, setting: str):
        super().__init__(
            f"Collection {name!r} is not one this server may use. Ask for one of the collections "
            f"it lists; the project decides which in DJANGO_RAG[{setting!r}].",
            name=name,
            setting=setting,
        )
        self.name = name


class ConversationNotFound(RagError, LookupError):
    """No conversation with this id belongs to the caller (another user's conversation is
    reported the same way, so ids cannot be probed). Start a new conversation instead."""

    code = "conversation_not_found"


class RateLimited(RagError):
    """The caller sent more requests than ``API["RATE_LIMIT"]`` allows, or spent the tokens
    ``API["TOKEN_BUDGET"]`` allows in its window. ``retry_after`` says how many seconds to wait."""

    code = "rate_limited"

    def __init__(self, message: str, *, retry_after: int = 60):
        super().__init__(message, retry_after=retry_after)
        self.retry_after = retry_after


class TokenBudgetExceeded(RateLimited):
    """The caller's answers used more LLM tokens than ``API["TOKEN_BUDGET"]`` allows in its
    window; ``retry_after`` says when the window ends."""

    code = "token_budget_exceeded"
