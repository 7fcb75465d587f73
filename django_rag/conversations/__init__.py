"""Conversations: follow-up questions answered with the conversation's memory.

:func:`chat` condenses a follow-up into a standalone query from the recent turns, retrieves and
answers like :func:`django_rag.ask` (or with the agent or the Loop), and stores the user's
message and the answer in one transaction::

    import django_rag as rag
    first = rag.chat("What is the refund policy?", user=request.user, collection="help")
    second = rag.chat("And for opened products?", conversation=first.conversation,
                      user=request.user)
    second.query   # "refund policy for opened products", what retrieval searched
"""

from __future__ import annotations

from .condense import Condenser, LLMCondenser, get_condenser
from .memory import estimate_tokens, recent_turns
from .service import (
    ChatReply,
    ChatStream,
    chat,
    citation_dict,
    get_conversation,
    rename_conversation,
    start_conversation,
    title_from_message,
)

__all__ = [
    "ChatReply",
    "ChatStream",
    "Condenser",
    "LLMCondenser",
    "chat",
    "citation_dict",
    "estimate_tokens",
    "get_condenser",
    "get_conversation",
    "recent_turns",
    "rename_conversation",
    "start_conversation",
    "title_from_message",
]
