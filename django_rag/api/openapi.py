"""How the OpenAPI description names authentication.

django-ninja writes ``components.securitySchemes`` and each operation's ``security`` from the
``openapi_security_schema`` of the operation's auth callbacks, one scheme per callback. Ours is
one callback (:class:`~django_rag.api.views.Caller`) that accepts the token hook *or* the
session, and the session needs the CSRF header as well on writes: two alternatives, one of them
two schemes together, which that one-scheme-per-callback model cannot say. So the schema class
keeps ninja's generation and only answers ``operation_security`` itself, from the callback's
flags and the settings at the time the description is asked for (the hook is a setting).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from ninja import NinjaAPI
from ninja.openapi.schema import OpenAPISchema

from .limits import SAFE_METHODS, api_setting, authenticate_hook

SESSION = "session"
CSRF = "csrf"
TOKEN = "token"


def _csrf_header() -> str:
    # Django stores it in request.META form: HTTP_X_CSRFTOKEN is sent as X-CSRFToken.
    meta = settings.CSRF_HEADER_NAME
    name = meta[5:] if meta.startswith("HTTP_") else meta
    return "-".join(part.capitalize() for part in name.split("_")).replace("Csrftoken", "CSRFToken")


def security_schemes(hook=None) -> dict[str, dict[str, Any]]:
    """The schemes the API accepts now: the session cookie and the CSRF header always; the
    token hook when ``API["AUTHENTICATE"]`` is set (its own ``openapi_security_schema``, the
    attribute django-ninja's auth classes carry, or a bearer token when it has none)."""
    schemes: dict[str, dict[str, Any]] = {
        SESSION: {
            "type": "apiKey",
            "in": "cookie",
            "name": settings.SESSION_COOKIE_NAME,
            "description": "A logged-in Django session (browsers).",
        },
        CSRF: {
            "type": "apiKey",
            "in": "header",
            "name": _csrf_header(),
            "description": f"The {settings.CSRF_COOKIE_NAME} cookie's value; needed with the "
            "session (or anonymously) on every POST and DELETE.",
        },
    }
    if hook is not None:
        declared = getattr(hook, "openapi_security_schema", None)
        schemes[TOKEN] = (
            dict(declared)
            if declared
            else {
                "type": "http",
                "scheme": "bearer",
                "description": "The project's API['AUTHENTICATE'] hook (token or API key); "
                "such requests need no CSRF token.",
            }
        )
    return schemes


def operation_security(caller, methods, *, hook, anonymous: bool) -> list[dict[str, list]]:
    """The alternatives (OR) that let ``caller`` through ``methods``; schemes in one
    alternative go together (AND)."""
    writes = any(method.upper() not in SAFE_METHODS for method in methods)
    session = {SESSION: [], CSRF: []} if writes else {SESSION: []}
    alternatives: list[dict[str, list]] = []
    if hook is not None:
        alternatives.append({TOKEN: []})
    alternatives.append(session)
    if getattr(caller, "anonymous", False) and anonymous:
        alternatives.append({CSRF: []} if writes else {})  # {}: no credentials at all
    return alternatives


class RagOpenAPISchema(OpenAPISchema):
    def __init__(self, api, path_prefix: str) -> None:
        # Read once per description, before ninja's __init__ walks the operations.
        self.rag_hook = authenticate_hook()
        self.rag_anonymous = bool(api_setting("ANONYMOUS"))
        super().__init__(api, path_prefix)
        self["components"].setdefault("securitySchemes", {})
        self["components"]["securitySchemes"].update(security_schemes(self.rag_hook))

    def operation_security(self, operation):
        callers = [c for c in operation.auth_callbacks if hasattr(c, "anonymous")]
        if not callers:
            return super().operation_security(operation)
        return operation_security(
            callers[0], operation.methods, hook=self.rag_hook, anonymous=self.rag_anonymous
        )


class RagNinjaAPI(NinjaAPI):
    """NinjaAPI whose OpenAPI description names how to authenticate (see the module)."""

    def get_openapi_schema(self, *, path_prefix=None, path_params=None):
        if path_prefix is None:
            path_prefix = self.get_root_path(path_params or {})
        return RagOpenAPISchema(self, path_prefix)
