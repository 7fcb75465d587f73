"""Who is calling, and how much they may: authentication, body size, rate limit, token budget.

Counters live in Django's cache (``API["CACHE"]``), in fixed windows: one per minute for
requests, one per ``TOKEN_WINDOW`` for LLM tokens. With several web processes, use a shared
cache (Redis, Memcached, the database cache); the default local-memory cache counts per process.
"""

from __future__ import annotations

import time

from django.contrib.auth.models import AnonymousUser
from django.core.cache import caches
from django.middleware.csrf import CsrfViewMiddleware

from ..conf import get_setting, import_string
from ..exceptions import RateLimited, TokenBudgetExceeded
from .errors import ApiError, not_authenticated

SAFE_METHODS = ("GET", "HEAD", "OPTIONS")


def api_setting(name: str):
    return get_setting("API")[name]


def _hook():
    hook = api_setting("AUTHENTICATE")
    if isinstance(hook, str):
        hook = import_string(hook, setting="API.AUTHENTICATE")
    return hook


def _csrf_failure(request) -> str | None:
    def view(request):  # not csrf_exempt: the check runs
        return None

    response = CsrfViewMiddleware(lambda r: None).process_view(request, view, (), {})
    if response is None:
        return None
    return "CSRF verification failed: send the csrftoken cookie's value as X-CSRFToken."


def authenticate(request, *, anonymous: bool):
    """The caller's user (an ``AnonymousUser`` when anonymous use is allowed), or raise.

    The ``API["AUTHENTICATE"]`` hook is tried first (token or API-key auth: no CSRF, as no
    browser sends those credentials by itself); then the Django session, with CSRF checked on
    every method that changes something."""
    hook = _hook()
    if hook is not None:
        user = hook(request)
        if user is not None and getattr(user, "is_authenticated", False):
            request.user = user
            request.rag_token_auth = True
            return user
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated and user.is_active:
        if request.method not in SAFE_METHODS:
            problem = _csrf_failure(request)
            if problem:
                raise ApiError(403, "csrf_failed", problem)
        return user
    if anonymous and api_setting("ANONYMOUS"):
        if request.method not in SAFE_METHODS:
            problem = _csrf_failure(request)
            if problem:
                raise ApiError(403, "csrf_failed", problem)
        return AnonymousUser()
    raise not_authenticated()


def caller_key(request, user) -> str:
    """Whose counters a request uses: the user's, else the client address's. Not the session's:
    a client that drops its cookies would get a fresh session, and fresh limits, per request."""
    if user.is_authenticated:
        return f"user:{user.pk}"
    return f"ip:{request.META.get('REMOTE_ADDR', '')}"


def _cache():
    return caches[api_setting("CACHE")]


def check_body_size(request, limit: int) -> None:
    """Refuse a body larger than ``limit`` bytes from its Content-Length, before it is read."""
    try:
        length = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        raise ApiError(400, "invalid_input", "The Content-Length header is not a number.") from None
    if length > limit:
        raise ApiError(
            413,
            "request_too_large",
            f"The request body has {length:,} bytes; at most {limit:,} are accepted.",
        )


def check_rate(key: str) -> None:
    """Count one request of ``key``; over ``API["RATE_LIMIT"]`` in this minute, refuse it."""
    limit = api_setting("RATE_LIMIT")
    if limit is None:
        return
    now = time.time()
    window = int(now // 60)
    name = f"django_rag:api:rate:{key}:{window}"
    cache = _cache()
    cache.add(name, 0, timeout=61)
    try:
        count = cache.incr(name)
    except ValueError:  # expired between add and incr
        cache.set(name, 1, timeout=61)
        count = 1
    if count > limit:
        raise RateLimited(
            f"More than {limit} requests in a minute; wait and try again.",
            retry_after=max(1, int(60 - now % 60)),
        )


def _budget_key(key: str) -> tuple[str, int, int]:
    window = api_setting("TOKEN_WINDOW")
    now = time.time()
    return f"django_rag:api:tokens:{key}:{int(now // window)}", window, int(window - now % window)


def check_budget(key: str) -> None:
    """Refuse an LLM request when ``key`` has spent its ``API["TOKEN_BUDGET"]``."""
    budget = api_setting("TOKEN_BUDGET")
    if budget is None:
        return
    name, _, left = _budget_key(key)
    spent = _cache().get(name, 0)
    if spent >= budget:
        raise TokenBudgetExceeded(
            f"The token budget ({budget:,} tokens per window) is spent; it renews in "
            f"{left} seconds.",
            retry_after=max(1, left),
        )


def spend(key: str, tokens: int) -> None:
    """Add ``tokens`` to ``key``'s spending in the current budget window."""
    if api_setting("TOKEN_BUDGET") is None or tokens <= 0:
        return
    name, window, _ = _budget_key(key)
    cache = _cache()
    cache.add(name, 0, timeout=window + 1)
    try:
        cache.incr(name, tokens)
    except ValueError:
        cache.set(name, tokens, timeout=window + 1)
