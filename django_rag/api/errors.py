"""JSON errors: every failure is ``{"error": {"code": ..., "message": ...}}`` with a stable code."""

from __future__ import annotations

import logging

from django.http import JsonResponse
from django.utils.translation import gettext as _

from ..exceptions import (
    BackgroundUnavailable,
    ConfigurationError,
    ConversationNotFound,
    DocumentNotFound,
    InvalidInput,
    LLMError,
    LLMNotConfigured,
    LLMResponseError,
    LLMStreamError,
    LLMTimeout,
    QueryTooLong,
    RagError,
    RateLimited,
    SearchTimeout,
    TokenBudgetExceeded,
    UnknownCollection,
)

logger = logging.getLogger("django_rag.api")


class ApiError(Exception):
    """An HTTP-level refusal (authentication, permission, size) with its status and code."""

    def __init__(self, status: int, code: str, message: str, headers: dict | None = None):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers or {}


def not_authenticated() -> ApiError:
    return ApiError(
        401,
        "not_authenticated",
        "Log in (session cookie) or send the credentials the site's API["
        "'AUTHENTICATE'] hook accepts.",
    )


def forbidden(message: str = "You may not do this.") -> ApiError:
    return ApiError(403, "permission_denied", message)


def not_found(message: str = "No such object.") -> ApiError:
    return ApiError(404, "not_found", message)


def error_body(code: str, message: str) -> dict:
    return {"error": {"code": code, "message": message}}


def json_error(status: int, code: str, message: str, headers: dict | None = None) -> JsonResponse:
    response = JsonResponse(error_body(code, message), status=status)
    for name, value in (headers or {}).items():
        response[name] = value
    return response


def status_of(exc: RagError) -> int:
    """The HTTP status a library error answers with."""
    if isinstance(exc, RateLimited):
        return 429
    if isinstance(exc, UnknownCollection | DocumentNotFound | ConversationNotFound):
        return 404
    if isinstance(exc, InvalidInput):
        return 400
    if isinstance(exc, LLMNotConfigured | ConfigurationError | BackgroundUnavailable):
        return 503
    if isinstance(exc, LLMTimeout | SearchTimeout):
        return 504
    if isinstance(exc, LLMError):
        return 502
    return 400


def is_staff(user) -> bool:
    """Whether ``user`` may see a failure's details (provider, model, setting): active staff."""
    return bool(
        user is not None and getattr(user, "is_active", False) and getattr(user, "is_staff", False)
    )


def visitor_message(exc: RagError) -> str | None:
    """The short, translated text a site visitor sees for a failure that is the site's, not
    theirs (the provider, the configuration, a limit); None for errors about what the visitor
    sent, whose own message says what to change. Never a model, provider, exception class or
    setting."""
    if isinstance(exc, LLMStreamError):
        return _("The answer was cut off. Please ask again.")
    if isinstance(exc, LLMTimeout):
        return _("The answer took too long. Please try again in a moment.")
    if isinstance(exc, LLMResponseError):
        # Most often an answer with no words: unavailable, not incomplete.
        return _("No answer is available for this question right now. Please try again later.")
    if isinstance(exc, LLMError):
        return _("The assistant is unavailable right now. Please try again later.")
    if isinstance(exc, SearchTimeout):
        return _("The search took too long. Please try a shorter question.")
    if isinstance(exc, UnknownCollection):
        return _("There is no collection named “%(name)s”.") % {"name": exc.details.get("name", "")}
    if isinstance(exc, TokenBudgetExceeded):
        return _("You have reached your limit of answers for now. Please try again later.")
    if isinstance(exc, RateLimited):
        return _("Too many requests. Please wait a minute and try again.")
    if isinstance(exc, QueryTooLong):
        return _("The question is too long. Please shorten it.")
    if isinstance(exc, InvalidInput | ConversationNotFound | DocumentNotFound):
        return None
    # The configuration (an LLM, an extra, a setting), the embedder or the workers: the site's.
    return _("The assistant is not available on this site right now.")


def public_message(exc: RagError, *, staff: bool = False) -> str:
    """The message a caller may see, with the full detail in the log. Active staff see the
    library's message (what failed and how to fix it); everyone else the short text of
    :func:`visitor_message`. A configuration error's message quotes the setting's value (maybe
    a secret), so no one is shown it: staff are told which setting, the log has why."""
    if isinstance(exc, ConfigurationError):
        setting = exc.details.get("setting", "")
        cause = getattr(exc, "cause", "")
        logger.error("API request failed (%s): DJANGO_RAG[%r] %s", exc.code, setting, cause)
        if staff:
            return (
                f"The server's django_rag configuration is incomplete: DJANGO_RAG[{setting!r}] "
                "is invalid; see its log."
            )
        return visitor_message(exc) or ""
    text = visitor_message(exc)
    if text is None:
        return str(exc)
    if not isinstance(exc, RateLimited | UnknownCollection | QueryTooLong):
        logger.error("API request failed (%s): %s", exc.code, exc)
    return str(exc) if staff else text


def rag_error_response(exc: RagError, *, staff: bool = False) -> JsonResponse:
    headers = {}
    if isinstance(exc, RateLimited):
        headers["Retry-After"] = str(exc.retry_after)
    return json_error(status_of(exc), exc.code, public_message(exc, staff=staff), headers)
