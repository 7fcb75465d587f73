"""Plain text and Markdown."""

from __future__ import annotations

from .base import ParsedDocument, Parser, budget_setting, check_input_size, decode_text


class TextParser(Parser):
    content_type = "text/plain"

    def max_input_bytes(self) -> int | None:
        """Inputs larger than this cannot fit MAX_DOCUMENT_CHARS: refused before decoding.

        UTF-8 and UTF-16 both spend at most 4 bytes on a character, plus a byte order mark.
        """
        limit = budget_setting("MAX_DOCUMENT_CHARS")
        return None if limit is None else 4 * limit + 4

    def decode(self, data: bytes, *, filename: str) -> str:
        check_input_size(self, len(data), filename=filename)
        return decode_text(data, filename=filename)

    def parse(self, data: bytes, *, filename: str) -> ParsedDocument:
        return ParsedDocument(
            text=self.decode(data, filename=filename), content_type=self.content_type
        )


def markdown_title(text: str) -> str:
    """The text of the first non-empty level-1 ATX heading (``# Title``), or "".

    Follows CommonMark: up to 3 spaces of indentation, ``#`` then a space, tab or the line end,
    and an optional closing run of ``#`` preceded by a space. Runs in linear time on any input
    (a regular expression with adjacent ``\\s*`` and ``#*`` backtracked cubically on a heading
    followed by many spaces): each line is visited once, and only lines holding a ``#``.
    """
    position, length = 0, len(text)
    while position < length:
        hash_at = text.find("#", position)
        if hash_at < 0:
            return ""
        newline = text.rfind("\n", position, hash_at)
        line_start = position if newline < 0 else newline + 1
        line_end = text.find("\n", hash_at)
        if line_end < 0:
            line_end = length
        position = line_end + 1
        indent = hash_at - line_start
        if indent > 3 or text.count(" ", line_start, hash_at) != indent:
            continue
        after = hash_at + 1
        if after < line_end and text[after] not in " \t\r":
            continue  # "##..." (a lower level) or "#word" (not a heading)
        content = text[after:line_end].strip()
        if content.endswith("#"):
            kept = content.rstrip("#")
            if not kept or kept[-1] in " \t":
                content = kept.rstrip()
        if content:
            return content[:500]
    return ""


class MarkdownParser(TextParser):
    content_type = "text/markdown"
    format = "markdown"

    def parse(self, data: bytes, *, filename: str) -> ParsedDocument:
        text = self.decode(data, filename=filename)
        return ParsedDocument(
            text=text,
            format=self.format,
            content_type=self.content_type,
            title=markdown_title(text),
        )
