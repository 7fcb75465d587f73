"""Secrets: one place decides what a secret looks like. :func:`redact` cleans structured values
(settings, specs) for display; :func:`scrub_text` cleans free text (error messages, log lines,
telemetry) of every secret the configured specs hold plus anything that looks like a credential.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping
from typing import Any

from ..settings_schema import secret_values
from .accessors import get_settings, on_reset

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
    """The secrets of the ``DJANGO_RAG`` settings (LLM, EMBEDDER, RERANKER specs..., and the
    keys the settings schema marks secret, such as ``MCP.TOKENS``)."""
    try:
        settings = get_settings()
        found = set(secrets_in(settings))
        found.update(v for v in secret_values(settings) if len(v) >= _MIN_SECRET_CHARS)
        return tuple(sorted(found, key=lambda s: (-len(s), s)))
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
