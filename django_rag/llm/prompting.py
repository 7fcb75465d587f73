"""Helpers for prompts that show stored text to an LLM."""

from __future__ import annotations


def quote(text: str) -> str:
    """Neutralise closing tags in stored text so it cannot end the delimiters around it."""
    return text.replace("</", "<\\/")
