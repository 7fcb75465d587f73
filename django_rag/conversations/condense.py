"""Condensing: a follow-up ("and for opened products?") made into a standalone query.

A condenser is any ``(message, turns) -> str`` callable, or a :class:`Condenser`. The built-in
:class:`LLMCondenser` asks an LLM (``CHAT["LLM"]``, else ``DJANGO_RAG["LLM"]``) with its own
prompt. The first turn of a conversation is never condensed. A condenser that fails (an LLM
error) or replies something unusable (empty, several paragraphs, far longer than the message)
falls back to the message itself: retrieval then runs on what the user typed. So does a reply
holding a control character or an unpaired surrogate, or longer than ``MAX_QUERY_CHARS``: the
model's mistake never fails the turn as if the user had sent bad text.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..conf import build_component, get_setting
from ..exceptions import InvalidInput, RagError
from ..llm import LLM, get_llm
from ..validation import clean_query, control_character
from . import prompts

logger = logging.getLogger("django_rag.conversations")

Turns = Sequence[tuple[str, str]]

# Only this much of a reply is ever looked at: a runaway model costs no more than this.
MAX_REPLY_CHARS = 2_000
# A standalone query may add the names a follow-up leaves out, not write an essay.
MAX_QUERY_CHARS = 500
_PREFIX = re.compile(
    r"^\s*(?:standalone\s+(?:search\s+)?query|search\s+query|query|rewritten(?:\s+query)?)\s*:\s*",
    re.IGNORECASE,
)
_QUOTES = "\"'`“”‘’«»"


class Condenser:
    """Base class: ``__call__(message, turns)`` returns the standalone query.

    ``turns`` are the earlier ``(role, text)`` pairs that fit the history budget, oldest first.
    """

    def __call__(self, message: str, turns: Turns) -> str:
        raise NotImplementedError


class LLMCondenser(Condenser):
    """Asks an LLM for the standalone form of the message (one short call)."""

    def __init__(self, *, llm: Any = None):
        self.llm = llm
        self.last_usage = None

    def __call__(self, message: str, turns: Turns) -> str:
        spec = self.llm if self.llm is not None else get_setting("CHAT")["LLM"]
        model: LLM = get_llm(spec, feature="Condensing a follow-up", setting="CHAT.LLM")
        system, user = prompts.condense_messages(message, turns)
        return model.complete(user, system=system).text


class _Function(Condenser):
    def __init__(self, function: Callable[[str, Turns], str]):
        self.function = function

    def __call__(self, message: str, turns: Turns) -> str:
        return self.function(message, turns)


ALIASES = {"llm": "django_rag.conversations.condense.LLMCondenser"}


def get_condenser(spec: Any = "setting", *, llm: Any = None) -> Condenser | None:
    """The condenser of ``spec`` (``"setting"``: ``CHAT["CONDENSER"]``); None: never condense.

    ``llm`` is given to the built-in LLM condenser when the spec names it by alias."""
    if spec == "setting":
        spec = get_setting("CHAT")["CONDENSER"]
    if spec is None or spec is False:
        return None
    if spec == "llm":
        return LLMCondenser(llm=llm)
    return build_component(
        spec, setting="CHAT.CONDENSER", base=Condenser, aliases=ALIASES, wrap_callable=_Function
    )


@dataclass
class Condensed:
    """The query retrieval uses, and how it was made."""

    query: str
    condensed: bool  # True when the condenser's reply is the query
    fallback: str | None = None  # why the message itself was used, if it was


def clean_reply(reply: Any, message: str) -> str | None:
    """The query in a condenser's reply, or None when the reply is unusable.

    Linear in the first ``MAX_REPLY_CHARS`` characters; the rest is never read."""
    if not isinstance(reply, str):
        return None
    text = reply[:MAX_REPLY_CHARS]
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return None
    if len(lines) > 3:  # an explanation or a list, not a query
        return None
    query = _PREFIX.sub("", lines[0]).strip()
    # One pair of quotes around the whole reply goes; quotes inside it (a title) stay.
    if len(query) >= 2 and query[0] in _QUOTES and query[-1] in _QUOTES:
        if not any(char in _QUOTES for char in query[1:-1]):
            query = query[1:-1].strip()
    if not query:
        return None
    if len(query) > max(MAX_QUERY_CHARS, 3 * len(message)):
        return None
    # What the user's message may hold, a model's reply may not: a control character (NUL
    # included) or an unpaired surrogate makes it unusable, as does a query longer than
    # MAX_QUERY_CHARS, so the turn searches the message instead of failing on the reply.
    if control_character(query) is not None:
        return None
    try:
        visible = clean_query(query)  # "" when only invisible characters are left
    except InvalidInput:
        return None
    return query if visible else None


def condense(message: str, turns: Turns, condenser: Condenser | None) -> Condensed:
    """Run ``condenser`` on a follow-up; the first turn and any failure keep the message."""
    if condenser is None:
        return Condensed(message, False, "condensing is off")
    if not turns:
        return Condensed(message, False, None)
    try:
        reply = condenser(message, turns)
    except RagError as exc:
        logger.warning("Condensing a follow-up failed (%s); searching with the message.", exc.code)
        return Condensed(message, False, f"the condenser failed ({exc.code})")
    query = clean_reply(reply, message)
    if query is None:
        logger.warning("The condenser's reply was unusable; searching with the message.")
        return Condensed(message, False, "the condenser's reply was unusable")
    return Condensed(query, True, None)
