"""The conversation memory: the most recent turns that fit a token budget.

Older turns are **dropped**, not summarised: a summary costs an LLM call on every long
conversation and can silently lose or invent the detail a follow-up refers to, while the
turns a follow-up leans on are almost always the last one or two. The budget counts tokens
with a cheap estimate (about four characters per token), which needs no tokenizer for the
chat model.
"""

from __future__ import annotations

from collections.abc import Iterable

CHARS_PER_TOKEN = 4


def estimate_tokens(text: str) -> int:
    """About how many tokens ``text`` costs a chat model (4 characters each, at least 1)."""
    return max(1, -(-len(text) // CHARS_PER_TOKEN))


def recent_turns(messages: Iterable[tuple[str, str, int]], budget: int) -> list[tuple[str, str]]:
    """The newest ``(role, text)`` turns whose token counts fit ``budget``, oldest first.

    ``messages`` are ``(role, text, token_count)`` oldest first. A single turn larger than the
    budget is cut to its last ``budget`` tokens' worth of characters rather than lost, so the
    last answer always reaches the model; every older turn that does not fit is dropped.
    """
    kept: list[tuple[str, str]] = []
    left = budget
    for role, text, tokens in reversed(list(messages)):
        tokens = tokens or estimate_tokens(text)
        if tokens > left:
            if not kept and left > 0:
                kept.append((role, "…" + text[-left * CHARS_PER_TOKEN :]))
            break
        kept.append((role, text))
        left -= tokens
    kept.reverse()
    return kept
