"""Server-Sent Events: ``event: <name>`` + ``data: <json>`` frames, one per line pair."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Iterator

from django.http import StreamingHttpResponse
from django.utils.translation import gettext as _

from ..exceptions import RagError
from .errors import public_message

logger = logging.getLogger("django_rag.api")


def frame(event: str, data: dict) -> str:
    return f"event: {event}\ndata: {json.dumps(data, default=str)}\n\n"


def stream_events(
    meta: dict, pieces: Iterable[str], finish: Callable[[], dict], *, staff: bool = False
) -> StreamingHttpResponse:
    """``meta`` first, a ``token`` event per piece of text, then ``done`` with what
    ``finish()`` returns (citations, usage...). A failure while streaming (a cut upstream
    stream, a timeout) ends the stream with an ``error`` event and no ``done``: the client
    never mistakes a partial answer for a finished one. The event's message is the visitor's
    short text, or the details for ``staff`` (:func:`~django_rag.api.errors.public_message`)."""

    def events() -> Iterator[str]:
        yield frame("meta", meta)
        try:
            for piece in pieces:
                if piece:
                    yield frame("token", {"text": piece})
            done = finish()
        except RagError as exc:
            yield frame("error", {"code": exc.code, "message": public_message(exc, staff=staff)})
            return
        except Exception:  # never a half answer presented as whole; the log has the cause
            logger.exception("API stream failed")
            message = _("The answer failed. Please try again.")
            yield frame("error", {"code": "internal_error", "message": message})
            return
        yield frame("done", done)

    response = StreamingHttpResponse(events(), content_type="text/event-stream; charset=utf-8")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # nginx: pass events through as they come
    return response
