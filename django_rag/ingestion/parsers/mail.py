"""EML (RFC 5322 email), read with the standard library's :mod:`email` package: headers as
metadata, the body, and attachments read through the parser registry."""

from __future__ import annotations

import contextvars
import email
import email.policy
from email.message import EmailMessage
from email.utils import getaddresses, parsedate_to_datetime
from pathlib import Path
from typing import Any

from ...exceptions import CorruptFile, DocumentTooLarge, InvalidInput, MissingDependency
from .base import ParsedDocument, Parser, budget_setting, check_input_size
from .common import TextBuilder

# How deep attachments are being read (an email attached to an email attached to ...).
_DEPTH: contextvars.ContextVar[int] = contextvars.ContextVar("django_rag_mail_depth", default=0)
_ADDRESS_HEADERS = ("from", "to", "cc", "reply-to")


def _header(message: EmailMessage, name: str) -> str:
    try:
        value = message.get(name)
    except Exception:  # a header the policy cannot parse: its raw text, below
        value = None
        for key, raw in message.raw_items():
            if key.lower() == name:
                value = raw
                break
    return " ".join(str(value or "").split())[:1000]


def _addresses(message: EmailMessage, name: str) -> list[str]:
    raw = _header(message, name)
    if not raw:
        return []
    found = []
    for display, address in getaddresses([raw])[:100]:
        found.append(f"{display} <{address}>" if display and address else address or display)
    return [item for item in found if item]


def _text_of(part: EmailMessage) -> str:
    """A text part's content, decoded by its declared charset (undecodable bytes replaced:
    mail in the wild often declares the wrong one)."""
    payload = part.get_payload(decode=True) or b""
    charset = part.get_content_charset() or "utf-8"
    try:
        return payload.decode(charset, errors="replace")
    except LookupError:  # an unknown charset name
        return payload.decode("utf-8", errors="replace")


class EmlParser(Parser):
    """An email saved as ``.eml``: the subject is the title (and a ``#`` heading); from, to,
    cc, date and subject are metadata (and a header block in the text, so they can be
    searched); the plain-text body is preferred, an HTML-only body is read like an HTML page
    (the ``html`` extra); attachments of registered types follow under ``## Attachment:``
    headings, parsed by their own parsers, as deep as ``MAX_ATTACHMENT_DEPTH``. Attachments
    that cannot be read (an unsupported type, a damaged file) are listed in the metadata with
    the reason; a budget exceeded anywhere refuses the whole email."""

    content_type = "message/rfc822"
    format = "markdown"

    def max_input_bytes(self) -> int | None:
        # Base64 spends 4 bytes on 3: an email may be larger than its text and attachments.
        limit = budget_setting("MAX_DOCUMENT_CHARS")
        return None if limit is None else 8 * limit + 4

    def parse(self, data: bytes, *, filename: str) -> ParsedDocument:
        check_input_size(self, len(data), filename=filename)
        try:
            message = email.message_from_bytes(data, policy=email.policy.default)
        except RecursionError as exc:
            raise CorruptFile(
                f"{filename} nests its MIME parts too deeply to be read; it is damaged or hostile.",
                filename=filename,
            ) from exc
        if not any(key for key, _ in message.raw_items()):
            raise CorruptFile(
                f"{filename} is not an email (it has no headers); check the file or its extension.",
                filename=filename,
            )
        subject = _header(message, "subject")
        metadata: dict[str, Any] = {"subject": subject} if subject else {}
        for name in _ADDRESS_HEADERS:
            addresses = _addresses(message, name)
            if addresses:
                metadata[name.replace("-", "_")] = addresses
        date = _header(message, "date")
        if date:
            try:
                metadata["date"] = parsedate_to_datetime(date).isoformat()
            except (TypeError, ValueError, IndexError):
                metadata["date"] = date
        builder = TextBuilder(filename)
        if subject:
            builder.add(f"# {subject}")
        header_lines = [
            f"{label}: {', '.join(metadata[key]) if isinstance(metadata[key], list) else metadata[key]}"
            for label, key in (("From", "from"), ("To", "to"), ("Cc", "cc"), ("Date", "date"))
            if key in metadata
        ]
        builder.add("\n".join(header_lines))
        try:
            builder.add(self._body(message))
            attachments = self._attachments(message, builder, filename)
        except RecursionError as exc:
            raise CorruptFile(
                f"{filename} nests its MIME parts too deeply to be read; it is damaged or hostile.",
                filename=filename,
            ) from exc
        if attachments:
            metadata["attachments"] = attachments
        return builder.result(
            format=self.format,
            content_type=self.content_type,
            title=subject[:500],
            metadata=metadata,
        )

    @staticmethod
    def _body(message: EmailMessage) -> str:
        body = message.get_body(preferencelist=("plain", "html"))
        if body is None:
            return ""
        text = _text_of(body)
        if body.get_content_subtype() == "html":
            from .html import html_to_markdown  # needs the html extra

            return html_to_markdown(text, main_content=False)
        return "\n".join(line.rstrip() for line in text.strip().splitlines())

    def _attachments(
        self, message: EmailMessage, builder: TextBuilder, filename: str
    ) -> list[dict[str, Any]]:
        from .registry import get_parser, parse_bytes

        max_depth = budget_setting("MAX_ATTACHMENT_DEPTH")
        depth = _DEPTH.get()
        found: list[dict[str, Any]] = []
        for part in message.iter_attachments():
            builder.check_time()
            if len(found) >= 1000:
                break
            name = part.get_filename() or ""
            is_message = part.get_content_type() == "message/rfc822"
            if is_message and not name:
                name = "attached.eml"
            name = Path(name.replace("\\", "/")).name[:200]
            entry: dict[str, Any] = {"filename": name, "content_type": part.get_content_type()}
            found.append(entry)
            if not name:
                entry["skipped"] = "no file name"
                continue
            if max_depth is not None and depth >= max_depth:
                entry["skipped"] = f"deeper than MAX_ATTACHMENT_DEPTH ({max_depth})"
                continue
            try:
                get_parser(name)
            except InvalidInput as exc:
                entry["skipped"] = exc.code
                continue
            if is_message:
                inner = part.get_payload()
                inner = inner[0] if isinstance(inner, list) and inner else inner
                content = inner.as_bytes() if hasattr(inner, "as_bytes") else b""
            else:
                content = part.get_payload(decode=True) or b""
            entry["size"] = len(content)
            token = _DEPTH.set(depth + 1)
            try:
                parsed = parse_bytes(content, filename=name)
            except DocumentTooLarge:
                raise
            except (InvalidInput, MissingDependency) as exc:
                entry["skipped"] = exc.code  # the email is read without it
                continue
            finally:
                _DEPTH.reset(token)
            builder.add(f"## Attachment: {name}")
            builder.add(parsed.text.strip())
        return found
