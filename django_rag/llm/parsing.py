"""One tolerant parser for JSON written by an LLM, used by every step that expects JSON.

What a model writes is hostile input: the parsers here run in time linear in the text and
refuse it, before any recursion, when it is longer than :data:`MAX_JSON_CHARS` or nested
deeper than :data:`MAX_JSON_DEPTH`. One scan finds every bracket pair (and fixes trailing
commas and Python literals on the way); the decoder then starts at the blocks in order, never
re-reading what a failed attempt already read, so each character is decoded about once.
"""

from __future__ import annotations

import json
import re
from itertools import accumulate
from typing import Any

from ..exceptions import LLMResponseError

#: The longest reply (in characters) :func:`parse_json` reads; longer ones are refused.
MAX_JSON_CHARS = 2_000_000
#: The deepest nesting of ``{``/``[`` :func:`parse_json` and tool arguments accept: real
#: replies are a few levels deep, and Python's JSON decoder recurses once per level.
MAX_JSON_DEPTH = 64
#: The most values (dicts, lists and scalars) a tool call's arguments may hold.
MAX_JSON_ITEMS = 1_000_000
#: The most bracketed blocks :func:`parse_json` tries to decode in one reply (a real reply
#: holds its value in one of the first few).
MAX_JSON_ATTEMPTS = 1_000

_FENCE = "```"
_FENCE_TAGS = ("json", "JSON", "javascript")
# Outside brackets (prose) only an opener matters.
_PROSE = re.compile(r"[{\[]")
# Inside brackets: a whole string literal (or a quote that opens one never closed), an
# escape outside strings, a bracket, a trailing comma, or a Python literal. The string's
# alternatives cannot both match one character, so it is matched in linear time.
_BLOCK = re.compile(
    r'"(?:[^"\\]|\\.)*"|"|\\.|[{}\[\]]|,(?=\s*[}\]])|\b(?:True|False|None)\b', re.DOTALL
)
# For the depth of JSON text: string literals (one never closed runs to the end) and escapes
# are dropped, then everything but brackets.
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"|".*|\\.', re.DOTALL)
_NOT_BRACKETS = re.compile(r"[^{}\[\]]+")
_DEPTH_STEP = {"{": 1, "[": 1, "}": -1, "]": -1}
_PY_LITERALS = {"True": "true", "False": "false", "None": "null"}
_OPENERS = {"{": "}", "[": "]"}
_CLOSERS = ("}", "]")


def _fences(text: str):
    """The contents of the Markdown code fences of ``text``, in order, each once (linear)."""
    position = 0
    while True:
        start = text.find(_FENCE, position)
        if start < 0:
            return
        end = text.find(_FENCE, start + len(_FENCE))
        if end < 0:
            return
        body = text[start + len(_FENCE) : end].lstrip(" \t")
        for tag in _FENCE_TAGS:
            if body.startswith(tag):
                body = body[len(tag) :].lstrip(" \t")
                break
        yield body.strip()
        position = end + len(_FENCE)


def _candidates(text: str):
    yield from _fences(text)
    yield text.strip()


def _scan(text: str) -> tuple[str, list[tuple[int, int]]]:
    """``text`` made tolerable JSON, and ``(start, end)`` of its balanced ``{...}``/``[...]``
    blocks (in that text), by start.

    One left-to-right pass with a stack. Inside brackets, string literals are followed (their
    brackets ignored), trailing commas are dropped and Python's ``True``/``False``/``None``
    become JSON's literals; prose outside brackets is left as it is, and a stray quote there
    does not hide a later value. A closer of the other kind leaves its opener unbalanced.
    Raises :class:`LLMResponseError` past :data:`MAX_JSON_DEPTH` levels.
    """
    parts: list[str] = []
    kept = 0  # text[kept:] is not yet in parts
    shift = 0  # position in the output minus position in text, at the current token
    stack: list[tuple[int, str]] = []  # (output position, closer) of the open brackets
    blocks: list[tuple[int, int]] = []

    def opened(position: int) -> None:
        if len(stack) >= MAX_JSON_DEPTH:
            raise LLMResponseError(
                f"The LLM's answer nests brackets more than {MAX_JSON_DEPTH} levels deep; "
                "no JSON this deep is expected.",
                text=text,
            )
        stack.append((position + shift, _OPENERS[text[position]]))

    position = 0
    while True:
        if not stack:
            match = _PROSE.search(text, position)
            if match is None:
                break
            opened(match.start())
            position = match.end()
            continue
        match = _BLOCK.search(text, position)
        if match is None:
            break
        token, position = match.group(), match.end()
        if token[0] == '"':
            if len(token) == 1:
                break  # a string that never closes: nothing after it can close a block
        elif token in _OPENERS:
            opened(match.start())
        elif token in _CLOSERS:
            start, closer = stack.pop()
            if closer == token:
                blocks.append((start, match.start() + shift + 1))
        elif token == ",":  # a trailing comma
            parts.append(text[kept : match.start()])
            kept = match.end()
            shift -= 1
        elif token in _PY_LITERALS:
            parts.append(text[kept : match.start()])
            parts.append(_PY_LITERALS[token])
            kept = match.end()
            shift += len(_PY_LITERALS[token]) - len(token)
    if not parts:
        return text, sorted(blocks)
    parts.append(text[kept:])
    return "".join(parts), sorted(blocks)


_DECODER = json.JSONDecoder()


def _check_length(text: str, limit: int, what: str) -> None:
    if len(text) > limit:
        raise LLMResponseError(
            f"{what} has {len(text):,} characters, more than the {limit:,} read; ask for a "
            "shorter reply.",
            text=text,
        )


def parse_json(text: str | None, *, expect: type | None = dict) -> Any:
    """Parse the JSON value in an LLM's answer.

    Accepts a bare value, one inside a Markdown code fence, or one surrounded by prose; trailing
    commas and ``True``/``False``-style Python literals are tolerated. With ``expect`` (``dict``,
    ``list`` or None for any), the first value of that type wins. Raises
    :class:`~django_rag.exceptions.LLMResponseError` when nothing can be parsed, and at once
    for a reply longer than :data:`MAX_JSON_CHARS` or nested deeper than
    :data:`MAX_JSON_DEPTH`. Linear in the length of the reply.
    """
    if not text or not text.strip():
        raise LLMResponseError("The LLM returned an empty answer where JSON was expected.")
    _check_length(text, MAX_JSON_CHARS, "The LLM's answer")
    openers = {dict: "{", list: "["}.get(expect, "{[")
    attempts = 0
    for candidate in _candidates(text):
        if candidate and candidate[0] in openers and json_depth(candidate) <= MAX_JSON_DEPTH:
            # The usual reply: the value alone. The C decoder reads it in one pass.
            try:
                value = json.loads(candidate)
            except (ValueError, RecursionError):
                pass
            else:
                if expect is None or isinstance(value, expect):
                    return value
        fixed, blocks = _scan(candidate)
        # Where the last failed decoding stopped: a block that opens before it and closes
        # after it would stop at the same place (the decoder had entered it), so it is not
        # tried. Every block tried therefore starts past the last failure, or succeeds.
        failed_at = -1
        for start, end in blocks:
            if fixed[start] not in openers or start < failed_at < end:
                continue
            attempts += 1
            if attempts > MAX_JSON_ATTEMPTS:
                break
            try:
                value, _ = _DECODER.raw_decode(fixed, start)
            except ValueError as exc:
                failed_at = getattr(exc, "pos", -1)
                continue
            if expect is None or isinstance(value, expect):
                return value
    raise LLMResponseError(
        "The LLM's answer contained no parseable JSON"
        + (f" {expect.__name__}" if expect else "")
        + "; check the prompt asks for JSON only.",
        text=text,
    )


def json_depth(text: str) -> int:
    """How deep the JSON ``text`` nests ``[``/``{`` (brackets in strings ignored): the
    regex engine and ``accumulate`` do the work in one linear pass each, no recursion."""
    brackets = _NOT_BRACKETS.sub("", _STRINGS.sub("", text))
    return max(accumulate(map(_DEPTH_STEP.__getitem__, brackets)), default=0)


def json_depth_exceeds(text: str, limit: int = MAX_JSON_DEPTH) -> bool:
    """True when the JSON ``text`` nests ``[``/``{`` more than ``limit`` levels. Run it
    before ``json.loads`` on text from a model (the decoder recurses once per level)."""
    return json_depth(text) > limit


def value_too_large(
    value: Any, *, max_depth: int = MAX_JSON_DEPTH, max_items: int = MAX_JSON_ITEMS
) -> str | None:
    """Why ``value`` (dicts, lists and tuples inside each other, as decoded JSON or as a
    function returned them) is too large to encode or check, or None: nested more than
    ``max_depth`` levels (a value that holds itself is infinitely deep) or holding more than
    ``max_items`` values. Iterative, so any depth is safe to check."""
    stack = [(value, 1)]
    items = 0
    while stack:
        item, depth = stack.pop()
        items += 1
        if items > max_items:
            return f"they hold more than {max_items:,} values"
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        if depth > max_depth:
            return f"they are nested more than {max_depth} levels deep"
        stack.extend((child, depth + 1) for child in children)
    return None


_YES = ("true", "yes", "1")
_NO = ("false", "no", "0")


def json_flag(data: dict[str, Any], key: str) -> bool:
    """The yes/no field ``key`` of an LLM's JSON object, read strictly: a boolean, 0/1 or
    true/false/yes/no. Raises :class:`~django_rag.exceptions.LLMResponseError` when the field
    is missing or says neither, so the caller takes (and reports) its fallback instead of
    silently reading a default."""
    value = data.get(key)
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _YES + _NO:
        return value.strip().lower() in _YES
    raise LLMResponseError(
        f"The LLM's JSON had no readable {key!r} (true or false): got {str(value)[:80]!r}.",
        text=str(data)[:500],
    )


def as_bool(value: Any) -> bool:
    """A yes/no field of LLM JSON: only explicit negatives (false, "no", "0", "") are False."""
    if isinstance(value, str):
        return value.strip().lower() not in ("false", "no", "0", "")
    return bool(value)
