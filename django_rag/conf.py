"""The ``DJANGO_RAG`` settings dict, its defaults, and component resolution.

Settings are read through :func:`get_settings`, which caches the merged dict and is reset when
Django's ``setting_changed`` signal fires (``override_settings`` in tests). Nothing reads
settings at import time.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib
import inspect
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from django.conf import settings as django_settings
from django.core.signals import setting_changed
from django.dispatch import receiver

from . import settings_schema
from .exceptions import ConfigurationError, InvalidInput

SETTING_NAME = "DJANGO_RAG"

# Every key's default, built from the schema (django_rag.settings_schema declares each key once:
# its type or accepted values, its default, what it does).
DEFAULTS: dict[str, Any] = settings_schema.defaults()

_NESTED = tuple(setting.name for setting in settings_schema.SCHEMA if setting.is_section)


@functools.cache
def get_settings() -> dict[str, Any]:
    """Return the effective settings: ``DJANGO_RAG`` merged over :data:`DEFAULTS`.

    An unknown key, top-level or in a section (``SEARCH``, ``GRAPH``...), raises
    :class:`~django_rag.exceptions.UnknownSetting` naming it and the closest known key. Types
    are checked when a value is read (:func:`get_setting`, :func:`search_setting`...) and all
    at once by :func:`validate_settings` (system check E005).
    """
    user = getattr(django_settings, SETTING_NAME, {}) or {}
    if not isinstance(user, Mapping):
        raise ConfigurationError("*", user, "DJANGO_RAG must be a dict")
    settings_schema.check_known(user)
    merged = copy.deepcopy(DEFAULTS)
    for key, value in user.items():
        if key in _NESTED:
            merged[key] = {**merged[key], **value}
        else:
            merged[key] = value
    return merged


def validate_settings() -> list[ConfigurationError]:
    """Every problem of ``DJANGO_RAG`` the schema finds: the first unknown key (with the
    closest known one), else each value of a wrong type or outside its accepted values."""
    try:
        settings = get_settings()
    except ConfigurationError as exc:
        return [exc]
    return settings_schema.problems(settings)


def _checked(path: str, value: Any) -> Any:
    settings_schema.lookup(path).check(value, path)
    return value


def get_setting(name: str) -> Any:
    """The effective value of ``DJANGO_RAG[name]``; a value of a wrong type raises
    :class:`ConfigurationError` naming the setting (a section is returned as its dict)."""
    return _checked(name, get_settings()[name])


def section_setting(section: str, name: str) -> Any:
    """The effective value of ``DJANGO_RAG[section][name]``, type-checked."""
    return _checked(f"{section}.{name}", get_settings()[section][name])


def search_setting(name: str) -> Any:
    return section_setting("SEARCH", name)


def graph_setting(name: str) -> Any:
    return section_setting("GRAPH", name)


# GRAPH numbers read when a search fuses the graph list: (minimum, maximum or None).
_GRAPH_NUMBERS = {
    "WEIGHT": (0.0, None),
    "MIN_MATCH_SCORE": (0.0, 1.0),
    "RRF_K": (0.0, None),
}


def graph_number(name: str) -> float:
    """A numeric ``GRAPH`` setting of the graph fusion, checked against its bounds: a bad value
    raises :class:`ConfigurationError` (system check E005 reports it at startup)."""
    value = graph_setting(name)
    low, high = _GRAPH_NUMBERS[name]
    number = None
    if isinstance(value, int | float) and not isinstance(value, bool):
        try:
            number = float(value)
        except OverflowError:  # an int too large for a float
            number = None
    if (
        number is None
        or not math.isfinite(number)
        or number < low
        or (high is not None and number > high)
    ):
        bounds = f"from {low:g} to {high:g}" if high is not None else f">= {low:g}"
        raise ConfigurationError(f"GRAPH.{name}", value, f"must be a finite number {bounds}")
    return number


FULLTEXT_BACKENDS = settings_schema.lookup("SEARCH.FULLTEXT_BACKEND").choices


def fulltext_backend_setting() -> str:
    """``SEARCH["FULLTEXT_BACKEND"]``, checked: a bad value raises :class:`ConfigurationError`
    (system check E005 reports it at startup)."""
    value = search_setting("FULLTEXT_BACKEND")
    if not isinstance(value, str) or value not in FULLTEXT_BACKENDS:
        raise ConfigurationError(
            "SEARCH.FULLTEXT_BACKEND",
            value,
            f"must be one of {', '.join(repr(b) for b in FULLTEXT_BACKENDS)} (docs/search.md, "
            "'Full-text backends')",
        )
    return value


def max_query_terms() -> int | None:
    """``SEARCH["MAX_QUERY_TERMS"]``, checked: a positive integer or None (no cap); anything
    else raises :class:`ConfigurationError` (system check E005 reports it at startup)."""
    value = search_setting("MAX_QUERY_TERMS")
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigurationError(
            "SEARCH.MAX_QUERY_TERMS",
            value,
            "must be a positive integer (the most distinct words one full-text query scores "
            "with) or None for no cap (docs/search.md, 'Cost budget')",
        )
    return value


def statement_timeout() -> float | None:
    """``SEARCH["STATEMENT_TIMEOUT"]`` in seconds, checked: a positive finite number or None
    (no limit); anything else raises :class:`ConfigurationError` (system check E005)."""
    value = search_setting("STATEMENT_TIMEOUT")
    if value is None:
        return None
    number = None
    if isinstance(value, int | float) and not isinstance(value, bool):
        with contextlib.suppress(OverflowError):
            number = float(value)
    if number is None or not math.isfinite(number) or number <= 0:
        raise ConfigurationError(
            "SEARCH.STATEMENT_TIMEOUT",
            value,
            "must be a positive number of seconds or None for no limit (docs/search.md, "
            "'Cost budget')",
        )
    return number


def check_search_budget() -> None:
    """Raise :class:`ConfigurationError` for an invalid search cost budget setting."""
    max_query_terms()
    statement_timeout()


def check_graph_settings() -> None:
    """Raise :class:`ConfigurationError` for the first invalid graph fusion setting."""
    for name in _GRAPH_NUMBERS:
        graph_number(name)


BACKGROUND_MODES = tuple(c for c in settings_schema.lookup("BACKGROUND").choices if c != "sync")
# "sync" is accepted for "inline" (what a script means by it).
_BACKGROUND_ALIASES = {"sync": "inline"}
# JOBS numbers: (minimum exclusive, integer?).
_JOBS_NUMBERS = {
    "THREADS": (0, True),
    "HEARTBEAT_SECONDS": (0, False),
    "STALLED_AFTER_SECONDS": (0, False),
    "POLL_SECONDS": (0, False),
}


def background_setting() -> str:
    """``BACKGROUND`` as one of :data:`BACKGROUND_MODES` (aliases resolved), or
    :class:`ConfigurationError`."""
    value = get_setting("BACKGROUND")
    mode = _BACKGROUND_ALIASES.get(value, value) if isinstance(value, str) else value
    if mode not in BACKGROUND_MODES:
        raise ConfigurationError(
            "BACKGROUND", value, f"use one of {', '.join(repr(m) for m in BACKGROUND_MODES)}"
        )
    return mode


def jobs_setting(name: str) -> float:
    """A ``JOBS`` number, checked: a bad value raises :class:`ConfigurationError`."""
    value = get_settings()["JOBS"][name]
    low, integer = _JOBS_NUMBERS[name]
    valid = isinstance(value, int | float) and not isinstance(value, bool) and value > low
    if integer and not isinstance(value, int):
        valid = False
    if not valid:
        kind = "a positive integer" if integer else "a positive number of seconds"
        raise ConfigurationError(f"JOBS.{name}", value, f"must be {kind}")
    return value


def check_background_settings() -> None:
    """Raise :class:`ConfigurationError` for an invalid ``BACKGROUND`` or ``JOBS`` value."""
    background_setting()
    for name in _JOBS_NUMBERS:
        jobs_setting(name)
    beat, stalled = jobs_setting("HEARTBEAT_SECONDS"), jobs_setting("STALLED_AFTER_SECONDS")
    if stalled <= 2 * beat:
        raise ConfigurationError(
            "JOBS.STALLED_AFTER_SECONDS",
            stalled,
            f"must be more than twice HEARTBEAT_SECONDS ({beat}), or live jobs show as stalled",
        )


MAX_DIMENSIONS = 2000  # pgvector's HNSW limit for `vector` columns


def embedding_dimensions() -> int:
    dims = get_setting("EMBEDDING_DIMENSIONS")
    if not isinstance(dims, int) or isinstance(dims, bool) or dims <= 0:
        raise ConfigurationError("EMBEDDING_DIMENSIONS", dims, "must be a positive integer")
    if dims > MAX_DIMENSIONS:
        # pgvector's HNSW index takes `vector` columns of at most 2,000 dimensions: migrate
        # would fail creating it. Say so before, with what to do.
        raise ConfigurationError(
            "EMBEDDING_DIMENSIONS",
            dims,
            f"is above {MAX_DIMENSIONS}, the most pgvector's HNSW index takes for vector "
            "columns; use an embedding model of at most 2,000 dimensions, or one that can "
            "shorten its vectors (OpenAI's text-embedding-3 models take dimensions=1536, for "
            "example) and set EMBEDDING_DIMENSIONS to that size",
        )
    return dims


_reset_callbacks: list[Callable[[], None]] = []


def on_reset(func: Callable[[], None]) -> Callable[[], None]:
    """Register ``func`` to run when ``DJANGO_RAG`` changes (for caches of built components)."""
    _reset_callbacks.append(func)
    return func


@receiver(setting_changed)
def _reset(*, setting: str, **kwargs) -> None:
    if setting == SETTING_NAME:
        get_settings.cache_clear()
        for callback in _reset_callbacks:
            callback()


def deadline_setting(name: str) -> float | None:
    """``LLM_DEADLINE`` / ``AGENT_DEADLINE``: a positive number of seconds, or None."""
    value = get_setting(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1e9:
        raise ConfigurationError(name, value, "must be a positive number of seconds, or None")
    return float(value)


# --- secrets ----------------------------------------------------------------------------------
# One place decides what a secret looks like. ``redact`` cleans structured values (settings,
# specs) for display; ``scrub_text`` cleans free text (error messages, log lines, telemetry)
# of every secret the configured specs hold plus anything that looks like a credential.

REDACTED = "[REDACTED]"
# Words that make an option, header or query parameter name a secret wherever they appear...
_SECRET_WORDS = frozenset(
    {
        "secret",
        "secrets",
        "password",
        "passwd",
        "passphrase",
        "pwd",
        "authorization",
        "cookie",
        "cookies",
        "credential",
        "credentials",
        "apikey",
        "signature",
    }
)
# ... and words that do when they end the name (``api_key``, ``hf_token``; not ``max_tokens``).
_SECRET_LAST_WORDS = frozenset({"key", "token", "auth", "sig", "session", "bearer"})
_CAMEL = re.compile(r"([a-z0-9])([A-Z])")


def is_secret_key(key: Any) -> bool:
    """True for names that hold secrets: ``api_key``, ``x-api-key``, ``Authorization``,
    ``hf_token``, ``password``, ``Cookie``, ``apiKey``... (case, ``-`` and ``_`` ignored)."""
    words = [w for w in re.split(r"[^a-z0-9]+", _CAMEL.sub(r"\1_\2", str(key)).lower()) if w]
    if not words:
        return False
    return words[-1] in _SECRET_LAST_WORDS or any(w in _SECRET_WORDS for w in words)


# Free text (error messages, provider replies, telemetry) is hostile input, so each pattern
# below is linear: a match starts only where its first part can start, and no run of
# characters is rescanned from each of its positions (bounded scheme names, lookbehinds).
#
# scheme://user:password@host -> the userinfo part. A scheme has at most 32 characters.
_URL_USERINFO = re.compile(
    r"(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.-]{0,31}://)(?P<userinfo>[^/\s@?#]+)@"
)
# scheme://host/path: the path is checked for credentials (webhook URLs, token segments).
_URL_PATH = re.compile(
    r"(?P<base>\b[a-zA-Z][a-zA-Z0-9+.-]{0,31}://(?P<host>[^\s/?#\"'<>]*))(?P<path>/[^\s?#\"'<>]*)"
)
# ?name=value / &name=value in URLs.
_QUERY_PARAM = re.compile(r"(?P<lead>[?&;](?P<name>[^=&#\s?;]+)=)(?P<value>[^&#\s;\"'<>]*)")
# "Bearer <token>" / "Basic <credentials>" anywhere in text.
_AUTH_SCHEME = re.compile(r"(?P<lead>\b(?:Bearer|Basic|Token)\s+)(?P<value>[A-Za-z0-9._~+/=-]{6,})")
# name=value, name: value, "name": "value", name='value' where name looks secret. The name is
# the run of word characters and dashes up to the separator, from its first letter or
# underscore (``pre`` holds the digits or dashes before it): the match is tried once per run.
_KEY_VALUE = re.compile(
    r"(?<![\w-])(?P<pre>(?:[^\W_A-Za-z]|-)*)(?P<name>[A-Za-z_][\w-]*)"
    r"(?P<sep>[\"']?\s*[:=]\s*[\"']?)(?P<value>(?!\[REDACTED\])[^\s\"',;&}\])]+)"
)

# Webhook URLs are credentials in themselves: whoever has one can post. Their hosts (a
# ``hooks.`` host, or one naming a webhook: Slack, Zapier, Microsoft Teams...) keep only the
# first path segment; after a ``webhook``/``webhooks``/``webhookb2``/``hooks`` segment (Discord,
# many others) nothing is kept.
_WEBHOOK_SEGMENTS = frozenset({"webhook", "webhooks", "webhookb2", "hooks"})
# A token-like run inside a path segment: letters and digits mixed like random text.
_TOKEN_RUN = re.compile(r"[A-Za-z0-9]{20,}")
_MIN_TOKEN_ENTROPY = 3.5  # bits per character; random base62 text has about 4 at length 20


def _is_token(run: str) -> bool:
    """True for a run of letters and digits that looks random (an API key, a webhook token):
    lower case, upper case and digits all present, the kind changing at least every third
    character, and at least 3.5 bits of entropy per character. Words, slugs, ``CamelCase``,
    dates and hexadecimal hashes are not token-like."""
    kinds = [2 if c.isdigit() else 1 if c.isupper() else 0 for c in run]
    if len(set(kinds)) < 3:
        return False
    changes = sum(1 for a, b in zip(kinds, kinds[1:], strict=False) if a != b)
    if changes * 3 < len(run):
        return False
    counts: dict[str, int] = {}
    for char in run:
        counts[char] = counts.get(char, 0) + 1
    entropy = -sum(n / len(run) * math.log2(n / len(run)) for n in counts.values())
    return entropy >= _MIN_TOKEN_ENTROPY


def _secret_path(host: str, path: str) -> tuple[str, list[str]]:
    """``path`` with its credentials replaced, and the credentials found."""
    segments = path.split("/")  # segments[0] is "" (the path starts with /)
    host = host.rpartition("@")[2].split(":")[0].lower()
    keep = len(segments)
    if host.startswith("hooks.") or "webhook" in host:
        keep = 2
    else:
        for index, segment in enumerate(segments):
            if segment.lower() in _WEBHOOK_SEGMENTS:
                keep = index + 1
                break
    found = []
    for index in range(1, len(segments)):
        segment = segments[index]
        if not segment or segment == REDACTED:
            continue
        if index >= keep or any(_is_token(run) for run in _TOKEN_RUN.findall(segment)):
            found.append(segment)
            segments[index] = REDACTED
    if not found:
        return path, []
    if keep < len(segments):  # one marker for everything after the kept segments
        segments = segments[:keep] + [REDACTED]
    return "/".join(segments), found


def _scrub_url_path(match: re.Match) -> str:
    path, found = _secret_path(match["host"], match["path"])
    return match["base"] + path if found else match[0]


def _scrub_patterns(text: str) -> str:
    text = _URL_USERINFO.sub(lambda m: f"{m['scheme']}{REDACTED}@", text)
    text = _URL_PATH.sub(_scrub_url_path, text)
    text = _QUERY_PARAM.sub(
        lambda m: f"{m['lead']}{REDACTED}" if is_secret_key(m["name"]) and m["value"] else m[0],
        text,
    )
    text = _AUTH_SCHEME.sub(lambda m: f"{m['lead']}{REDACTED}", text)
    return _KEY_VALUE.sub(
        lambda m: (
            f"{m['pre']}{m['name']}{m['sep']}{REDACTED}" if is_secret_key(m["name"]) else m[0]
        ),
        text,
    )


def _collect_secrets(value: Any, found: set[str], *, secret: bool = False) -> None:
    if isinstance(value, Mapping):
        for key, item in value.items():
            _collect_secrets(item, found, secret=secret or is_secret_key(key))
    elif isinstance(value, list | tuple | set | frozenset):
        for item in value:
            _collect_secrets(item, found, secret=secret)
    elif isinstance(value, str):
        if secret:
            found.add(value)
            for word in value.split():  # "Bearer sk-..." -> the token alone too
                found.add(word)
        for match in _URL_USERINFO.finditer(value):
            found.add(match["userinfo"])
            found.update(match["userinfo"].split(":"))
        for match in _URL_PATH.finditer(value):
            found.update(_secret_path(match["host"], match["path"])[1])
        for match in _QUERY_PARAM.finditer(value):
            if is_secret_key(match["name"]):
                found.add(match["value"])
        for match in _AUTH_SCHEME.finditer(value):
            found.add(match["value"])


# Shorter values are not treated as secrets in free text: replacing them would mangle it.
_MIN_SECRET_CHARS = 4


def secrets_in(*values: Any) -> list[str]:
    """Every secret string held by ``values`` (nested dicts, lists, strings): values of
    secret-looking keys, URL credentials, secret query parameters, bearer tokens."""
    found: set[str] = set()
    for value in values:
        _collect_secrets(value, found)
    return sorted(
        (s for s in found if len(s) >= _MIN_SECRET_CHARS and s != REDACTED),
        key=lambda s: (-len(s), s),
    )


@functools.cache
def configured_secrets() -> tuple[str, ...]:
    """The secrets of the ``DJANGO_RAG`` settings (LLM, EMBEDDER, RERANKER specs...)."""
    try:
        return tuple(secrets_in(get_settings()))
    except Exception:  # a broken setting is reported elsewhere; never fail while scrubbing
        return ()


on_reset(configured_secrets.cache_clear)


def scrub_text(text: Any, secrets: Any = ()) -> str:
    """``text`` as a string with secrets replaced by ``[REDACTED]``: ``secrets`` (a string or
    strings), every secret of the configured specs, URL credentials, secret query parameters,
    bearer tokens and ``api_key=...``-style pairs. Use it on error messages and log lines."""
    text = str(text)
    extra = [secrets] if isinstance(secrets, str) else [s for s in secrets or () if s]
    known = {s for s in extra if isinstance(s, str) and len(s) >= _MIN_SECRET_CHARS}
    known.update(configured_secrets())
    for secret in sorted(known, key=len, reverse=True):
        if secret in text:
            text = text.replace(secret, REDACTED)
    return _scrub_patterns(text)


def redact(value: Any) -> Any:
    """``value`` with secrets replaced by ``[REDACTED]``, for display: entries of nested
    dicts whose key looks secret (``api_key``, ``x-api-key``, ``Authorization``, ``password``,
    ...), credentials and secret query parameters in URLs, and configured secrets inside any
    string. Other objects are kept unless their text shows a secret (then their scrubbed text
    is returned)."""
    if isinstance(value, Mapping):
        return {
            key: REDACTED if is_secret_key(key) and item else redact(item)
            for key, item in value.items()
        }
    if isinstance(value, list | tuple):
        return type(value)(redact(item) for item in value)
    if isinstance(value, str):
        return scrub_text(value)
    if value is None or isinstance(value, bool | int | float):
        return value
    try:
        shown = str(value)
    except Exception:  # an object that cannot show itself shows no secret either
        return value
    cleaned = scrub_text(shown)
    return value if cleaned == shown else cleaned


# --- component resolution ---------------------------------------------------------------------


def import_string(path: str, *, setting: str) -> Any:
    module_path, _, attr = path.rpartition(".")
    if not module_path:
        raise ConfigurationError(
            setting, path, "expected a dotted path such as 'myapp.rag.MyClass'"
        )
    try:
        module = importlib.import_module(module_path)
    except ImportError as exc:
        raise ConfigurationError(setting, path, f"cannot import {module_path!r}: {exc}") from exc
    try:
        return getattr(module, attr)
    except AttributeError as exc:
        raise ConfigurationError(
            setting, path, f"{module_path!r} has no attribute {attr!r}"
        ) from exc


def build_component(
    spec: Any,
    *,
    setting: str,
    base: type,
    aliases: Mapping[str, str],
    wrap_callable: Callable[[Callable], Any] | None = None,
) -> Any:
    """Turn a component spec into an instance of ``base``.

    ``spec`` may be an instance, a class, an alias, a dotted path (to a class, an instance or a
    callable), a ``{"BACKEND": ..., "OPTIONS": {...}}`` dict, or a plain callable (wrapped by
    ``wrap_callable``). Anything else raises :class:`ConfigurationError` naming ``setting``.
    """
    options: dict[str, Any] = {}
    original = redact(spec)  # errors show the spec; never its secrets
    if isinstance(spec, Mapping):
        unknown = set(spec) - {"BACKEND", "OPTIONS"}
        if "BACKEND" not in spec or unknown:
            raise ConfigurationError(
                setting, original, "a dict needs a 'BACKEND' key and optionally 'OPTIONS'"
            )
        options = dict(spec.get("OPTIONS") or {})
        spec = spec["BACKEND"]
    if isinstance(spec, str):
        spec = import_string(aliases.get(spec, spec), setting=setting)
    if isinstance(spec, base):
        if options:
            raise ConfigurationError(setting, original, "OPTIONS cannot be applied to an instance")
        return spec
    if inspect.isclass(spec):
        if not issubclass(spec, base):
            raise ConfigurationError(
                setting, original, f"{spec.__qualname__} is not a subclass of {base.__qualname__}"
            )
        try:
            return spec(**options)
        except (TypeError, ValueError) as exc:
            if isinstance(exc, ConfigurationError | InvalidInput):
                raise
            raise ConfigurationError(setting, original, f"bad OPTIONS: {scrub_text(exc)}") from exc
    if callable(spec) and wrap_callable is not None:
        return wrap_callable(spec, **options)
    raise ConfigurationError(
        setting,
        original,
        f"expected an alias ({', '.join(sorted(aliases))}), a dotted path, a {base.__qualname__} "
        "subclass or instance, or a callable",
    )
