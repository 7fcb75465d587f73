"""Who is calling, and how much they may: authentication, body size, rate limit, token budget.

Counters live in Django's cache (``API["CACHE"]``), in fixed windows: one per minute for
requests, one per ``TOKEN_WINDOW`` for LLM tokens, changed only by the cache's atomic ``add``
and ``incr``/``decr``. An answer reserves its estimated tokens before it runs and settles with
what it used (:func:`reserve`), so concurrent requests cannot all slip under the budget. With
several web processes use a cache shared by all of them whose ``incr`` is atomic (Redis,
Memcached); local memory counts per process, and the database and file caches read and then
write (system check W008).
"""

from __future__ import annotations

import threading
import time

from django.contrib.auth.models import AnonymousUser
from django.core.cache import caches
from django.middleware.csrf import CsrfViewMiddleware

from ..conf import get_setting, import_string
from ..exceptions import RagError, RateLimited, TokenBudgetExceeded
from ..llm import estimate_tokens, get_llm
from .errors import ApiError, not_authenticated

SAFE_METHODS = ("GET", "HEAD", "OPTIONS")


def api_setting(name: str):
    return get_setting("API")[name]


def authenticate_hook():
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
    hook = authenticate_hook()
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


def _count(cache, name: str, delta: int, timeout: int) -> int:
    """Add ``delta`` to the counter ``name`` and return its new value, atomically where the
    cache's ``add`` and ``incr`` are (Redis, Memcached; local memory within one process): a
    counter is created by ``add`` (only one of several racing processes succeeds) and changed
    by ``incr`` (never read, then written)."""
    for _ in range(3):
        if cache.add(name, delta, timeout=timeout):
            return delta
        try:
            return cache.incr(name, delta)
        except ValueError:  # expired between add and incr: create it again
            continue
    raise RuntimeError(f"the cache {api_setting('CACHE')!r} keeps no counter")


def check_rate(key: str) -> None:
    """Count one request of ``key``; over ``API["RATE_LIMIT"]`` in this minute, refuse it."""
    limit = api_setting("RATE_LIMIT")
    if limit is None:
        return
    now = time.time()
    window = int(now // 60)
    count = _count(_cache(), f"django_rag:api:rate:{key}:{window}", 1, 61)
    if count > limit:
        raise RateLimited(
            f"More than {limit} requests in a minute; wait and try again.",
            retry_after=max(1, int(60 - now % 60)),
        )


def _budget_key(key: str) -> tuple[str, int, int]:
    window = api_setting("TOKEN_WINDOW")
    now = time.time()
    return f"django_rag:api:tokens:{key}:{int(now // window)}", window, int(window - now % window)


def _exceeded(budget: int, left: int) -> TokenBudgetExceeded:
    return TokenBudgetExceeded(
        f"The token budget ({budget:,} tokens per window) is spent; it renews in {left} seconds.",
        retry_after=max(1, left),
    )


def check_budget(key: str) -> None:
    """Refuse an LLM request early, before its body is read, when ``key`` has spent its
    ``API["TOKEN_BUDGET"]``. Only a hint: :func:`reserve` is what holds the budget."""
    budget = api_setting("TOKEN_BUDGET")
    if budget is None:
        return
    name, _, left = _budget_key(key)
    if (_cache().get(name) or 0) >= budget:
        raise _exceeded(budget, left)


#: Tokens a retrieved chunk is taken to add to the prompt: the default chunker's 200 (embedder)
#: tokens, the source's number and header, and another model's tokenizer.
CHUNK_TOKENS = 300
#: The answer prompt's own instructions, and the condenser's with its reply.
PROMPT_TOKENS = 500
#: The answer's length when the LLM sets no ``max_tokens``.
ANSWER_TOKENS = 1_000


def estimate_request(text: str, limit: int, *, chat: bool = False) -> int:
    """The tokens to reserve for answering ``text`` from ``limit`` chunks: ``API["RESERVE_TOKENS"]``
    when set, else the prompt (the text at four characters a token, ``limit`` chunks of
    :data:`CHUNK_TOKENS`, the instructions; for a chat turn the condenser's call and twice
    ``CHAT["HISTORY_TOKENS"]``, as both calls see the history) plus the answer (the LLM's
    ``max_tokens``, else :data:`ANSWER_TOKENS`)."""
    fixed = api_setting("RESERVE_TOKENS")
    if fixed is not None:
        return fixed
    prompt = estimate_tokens(len(text)) + limit * CHUNK_TOKENS + PROMPT_TOKENS
    if chat:
        history = get_setting("CHAT")["HISTORY_TOKENS"]
        prompt += 2 * history + estimate_tokens(len(text)) + PROMPT_TOKENS
    try:
        answer = getattr(get_llm(), "max_tokens", None)
    except RagError:  # no LLM, or a bad one: the service says so, with its own error
        answer = None
    if not isinstance(answer, int) or isinstance(answer, bool) or answer <= 0:
        answer = ANSWER_TOKENS
    return prompt + answer


class Reservation:
    """Tokens held against a caller's budget while a request is answered (:func:`reserve`).

    :meth:`settle` replaces the reservation by what the request used: the unused part is
    refunded, anything beyond it charged. It counts once; later calls change nothing (a
    stream's ``done`` settles, then closing the response tries again)."""

    def __init__(self, name: str | None, tokens: int, timeout: int = 0):
        self.name = name
        self.tokens = tokens
        self.timeout = timeout
        self.used: int | None = None
        self._lock = threading.Lock()

    @property
    def settled(self) -> bool:
        return self.used is not None

    def settle(self, used: int) -> None:
        """Charge ``used`` tokens instead of the reservation (once)."""
        with self._lock:
            if self.used is not None:
                return
            self.used = max(0, int(used))
        if self.name is None:
            return
        delta = self.used - self.tokens
        cache = _cache()
        if delta > 0:
            _count(cache, self.name, delta, self.timeout)
        elif delta < 0:
            try:
                cache.decr(self.name, -delta)
            except ValueError:  # the window ended and its counter expired: nothing to refund
                pass

    def __repr__(self) -> str:
        return f"<Reservation {self.tokens} tokens, used={self.used}>"


def reserve(key: str, tokens: int) -> Reservation:
    """Hold ``tokens`` of ``key``'s ``API["TOKEN_BUDGET"]`` before answering, or refuse.

    The reservation is added to the window's counter in one atomic step and the request goes
    ahead when what was counted *before* it is under the budget; otherwise it is taken back
    and :class:`~django_rag.exceptions.TokenBudgetExceeded` raised. Concurrent requests each
    see the others' reservations, so however many arrive at once, what the admitted ones
    spend stays under the budget plus one reservation (as long as each uses no more than it
    reserved; :meth:`Reservation.settle` charges any excess)."""
    budget = api_setting("TOKEN_BUDGET")
    if budget is None:
        return Reservation(None, 0)
    tokens = max(1, int(tokens))
    name, window, left = _budget_key(key)
    cache = _cache()
    total = _count(cache, name, tokens, window + 1)
    if total - tokens >= budget:
        try:
            cache.decr(name, tokens)
        except ValueError:
            pass
        raise _exceeded(budget, left)
    return Reservation(name, tokens, window + 1)


def spent(key: str) -> int:
    """What ``key`` has spent (and holds reserved) in the current budget window."""
    name, _, _ = _budget_key(key)
    return _cache().get(name) or 0
