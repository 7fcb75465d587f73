"""Server-Sent Events: ``event: <name>`` + ``data: <json>`` frames, one per line pair."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Iterator

from django.http import StreamingHttpResponse

from ..exceptions import RagError
from .errors import public_message

logger = logging.getLogger("django_rag.api")


def frame(event: str, data: dict) -> str:
    return f"event: {event}\ndata: {json.dumps(data, default=str)}\n\n"


def stream_events(
    meta: dict, pieces: Iterable[str], finish: Callable[[], dict]
) -> StreamingHttpResponse:
    """``meta`` first, a ``token`` event per piece of text, then ``done`` with what
    ``finish()`` returns (citations, usage...). A failure while streaming (a cut upstream
    stream, a timeout) ends the stream with an ``error`` event and no ``done``: the client
    never mistakes a partial answer for a finished one."""

    def events() -> Iterator[str]:
        yield frame("meta", meta)
        try:
            for piece in pieces:
                if piece:
                    yield frame("token", {"text": piece})
            done = finish()
        except RagError as exc:
            yield frame("error", {"code": exc.code, "message": public_message(exc)})
            return
        except Exception:  # never a half answer presented as whole; the log has the cause
            logger.exception("API stream failed")
            yield frame(
                "error", {"code": "internal_error", "message": "The answer failed; try again."}
            )
            return
        yield frame("done", done)

    response = StreamingHttpResponse(events(), content_type="text/event-stream; charset=utf-8")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # nginx: pass events through as they come
    return response
