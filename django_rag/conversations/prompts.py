"""The prompt of the conversation layer: condensing a follow-up into a standalone query.

Earlier turns are text we did not write (the user's messages, the model's own answers): they
travel between ``<turn>`` tags, quoted, and the model is told they are context, not orders
(the block and the notice are the answer layer's, :mod:`django_rag.answers.prompts`).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..answers.prompts import HISTORY_NOTICE, history_block
from ..llm.prompting import quote

CONDENSE_SYSTEM = (
    "You turn the latest message of a conversation into one standalone search query. "
    + HISTORY_NOTICE
    + " Replace pronouns and references such as 'it', 'they', 'that one' or 'and for X?' with "
    "the names and topics they point to in the earlier turns, so the query can be understood "
    "without them. Keep the language of the latest message. If the message already stands "
    "alone, repeat it unchanged. Reply with the query only, on one line, with no preface, "
    "quotes or explanation."
)


def condense_messages(message: str, turns: Sequence[tuple[str, str]]) -> tuple[str, str]:
    """(system, user) asking for the standalone form of ``message``."""
    user = (
        history_block(turns)
        + "\n\nLatest message:\n<latest>\n"
        + quote(message)
        + "\n</latest>\n\nStandalone search query:"
    )
    return CONDENSE_SYSTEM, user
