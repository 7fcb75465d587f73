"""Helpers for prompts that show stored text to an LLM.

Prompts put data (chunks, titles, collection descriptions, previous answers...) between tags
such as ``<source id="1">...</source>``. Data must never be able to open or close such a tag
itself: :func:`quote` neutralises every closing tag and the opening tags of our delimiters, and
:func:`attr` makes a value safe inside a ``name="..."`` attribute.
"""

from __future__ import annotations

import re

# Every tag name the built-in prompts use as a delimiter (and a few obvious relatives). A
# custom prompt that delimits with another name can add it here.
DELIMITERS = {
    "answer",
    "collection",
    "collections",
    "context",
    "data",
    "document",
    "documents",
    "instructions",
    "key_points",
    "knowledge_graph",
    "message",
    "messages",
    "passage",
    "passages",
    "previous_answer",
    "question",
    "reference",
    "source",
    "sources",
    "summaries",
    "summary",
    "system",
}

# "<" then optional whitespace, then a delimiter name (any case) ending at a word boundary:
# <source id="1">, < SOURCE>, <Source\n ...>.
_OPENING = re.compile(r"<(\s*)([A-Za-z_][\w-]*)(?=[\s/>]|$)")
# Any closing tag, with whitespace variants: </x>, < /x>, </ x>.
_CLOSING = re.compile(r"<(\s*)/")


def _open(match: re.Match) -> str:
    if match.group(2).lower() in DELIMITERS:
        return "<\\" + match.group(1) + match.group(2)
    return match.group(0)


def quote(text: str) -> str:
    """Neutralise tags in stored text so it cannot open or close the delimiters around it.

    ``</anything`` becomes ``<\\/anything`` and ``<source`` (any delimiter name, any case,
    whitespace after ``<`` allowed) becomes ``<\\source``; the text stays readable.
    """
    text = _CLOSING.sub(lambda m: "<" + m.group(1) + "\\/", str(text))
    return _OPENING.sub(_open, text)


def attr(value: object) -> str:
    """``value`` made safe inside a double-quoted attribute (``title="..."``): quotes and
    angle brackets are escaped and line breaks become spaces."""
    text = " ".join(str(value).split())
    return (
        text.replace("&", "&amp;").replace('"', "&quot;").replace("<", "&lt;").replace(">", "&gt;")
    )


def tool_protocol_messages(messages: list[dict], tools: list[dict]) -> list[dict]:
    """A tool-calling conversation as one system and one user message, for backends with no
    native tool calling (:meth:`django_rag.llm.LLM._chat`): the tools and a JSON reply format
    go in the system message, the conversation so far in the user message."""
    import json

    system = [m["content"] for m in messages if m.get("role") == "system" and m.get("content")]
    if tools:
        described = [
            {
                "name": tool["function"]["name"],
                "description": tool["function"].get("description", ""),
                "parameters": tool["function"].get("parameters", {}),
            }
            for tool in tools
        ]
        system.append(
            "You can call these tools (JSON schemas of their arguments):\n"
            + json.dumps(described, indent=1)
            + '\nTo call tools, reply with only a JSON object: {"tool_calls": [{"name": '
            '"<tool>", "arguments": {...}}]}. Otherwise reply with plain text.'
        )
    lines = []
    for message in messages:
        role, content = message.get("role"), message.get("content") or ""
        if role == "user":
            lines.append(f"User: {content}")
        elif role == "assistant":
            if content:
                lines.append(f"Assistant: {content}")
            for call in message.get("tool_calls") or []:
                function = call.get("function", {})
                lines.append(
                    f"Assistant called {function.get('name')} with {function.get('arguments')} "
                    f"(call {call.get('id')})"
                )
        elif role == "tool":
            lines.append(
                f"Result of call {message.get('tool_call_id')}:\n<tool_result>\n{content}\n"
                "</tool_result>"
            )
    flat = [{"role": "system", "content": "\n\n".join(system)}] if system else []
    flat.append({"role": "user", "content": "\n\n".join(lines)})
    return flat
