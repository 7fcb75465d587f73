"""One tolerant parser for JSON written by an LLM, used by every step that expects JSON."""

from __future__ import annotations

import json
import re
from typing import Any

from ..exceptions import LLMResponseError

_FENCE = re.compile(r"```[ \t]*(?:json|JSON|javascript)?[ \t]*\n?(.*?)```", re.DOTALL)
_TRAILING_COMMA = re.compile(r",(\s*[}\]])")


def _outside_strings(text: str, start: int = 0):
    """Yield (index, char) for the characters of ``text`` that are not inside string literals."""
    in_string = escaped = False
    for index in range(start, len(text)):
        char = text[index]
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        else:
            yield index, char


def _balanced(text: str, start: int) -> str | None:
    """The balanced {...} or [...] starting at ``start``, brackets inside strings ignored."""
    closing = "}" if text[start] == "{" else "]"
    depth = 0
    for index, char in _outside_strings(text, start):
        if char in "{[":
            depth += 1
        elif char in "}]":
            depth -= 1
            if depth == 0:
                return text[start : index + 1] if char == closing else None
    return None


def _strip_trailing_commas(candidate: str) -> str:
    drop = {
        index
        for index, char in _outside_strings(candidate)
        if char == "," and candidate[index + 1 :].lstrip()[:1] in ("}", "]")
    }
    return "".join(char for index, char in enumerate(candidate) if index not in drop)


def _candidates(text: str):
    for match in _FENCE.finditer(text):
        yield match.group(1).strip()
    yield text.strip()


def parse_json(text: str | None, *, expect: type | None = dict) -> Any:
    """Parse the JSON value in an LLM's answer.

    Accepts a bare value, one inside a Markdown code fence, or one surrounded by prose; trailing
    commas and ``True``/``False``-style Python literals are tolerated. With ``expect`` (``dict``,
    ``list`` or None for any), the first value of that type wins. Raises
    :class:`~django_rag.exceptions.LLMResponseError` when nothing can be parsed.
    """
    if not text or not text.strip():
        raise LLMResponseError("The LLM returned an empty answer where JSON was expected.")
    openers = {dict: "{", list: "["}.get(expect, "{[")
    for candidate in _candidates(text):
        for start, char in enumerate(candidate):
            if char not in openers:
                continue
            block = _balanced(candidate, start)
            if block is None:
                continue
            value = _loads(block)
            if value is not _MISSING and (expect is None or isinstance(value, expect)):
                return value
    raise LLMResponseError(
        "The LLM's answer contained no parseable JSON"
        + (f" {expect.__name__}" if expect else "")
        + "; check the prompt asks for JSON only.",
        text=text,
    )


_MISSING = object()
_PY_LITERALS = re.compile(r"\b(True|False|None)\b")


def _loads(block: str) -> Any:
    for attempt in (
        block,
        _strip_trailing_commas(block),
        _PY_LITERALS.sub(
            lambda m: {"True": "true", "False": "false", "None": "null"}[m.group(1)],
            _strip_trailing_commas(block),
        ),
    ):
        try:
            return json.loads(attempt)
        except ValueError:
            continue
    return _MISSING


def as_bool(value: Any) -> bool:
    """A yes/no field of LLM JSON: only explicit negatives (false, "no", "0", "") are False."""
    if isinstance(value, str):
        return value.strip().lower() not in ("false", "no", "0", "")
    return bool(value)
