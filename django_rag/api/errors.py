"""JSON errors: every failure is ``{"error": {"code": ..., "message": ...}}`` with a stable code."""

from __future__ import annotations

import logging

from django.http import JsonResponse

from ..exceptions import (
    BackgroundUnavailable,
    ConfigurationError,
    ConversationNotFound,
    DocumentNotFound,
    InvalidInput,
    LLMError,
    LLMNotConfigured,
    LLMTimeout,
    RagError,
    RateLimited,
    SearchTimeout,
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


def public_message(exc: RagError) -> str:
    """The message a client may see: a configuration error's message quotes the setting's
    value (maybe a secret), so it is logged and replaced."""
    if isinstance(exc, ConfigurationError):
        logger.error("API request failed: %s", exc.code)
        return "The server's django_rag configuration is incomplete; see its log."
    return str(exc)


def rag_error_response(exc: RagError) -> JsonResponse:
    headers = {}
    if isinstance(exc, RateLimited):
        headers["Retry-After"] = str(exc.retry_after)
    return json_error(status_of(exc), exc.code, public_message(exc), headers)
