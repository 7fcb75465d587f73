"""Server-Sent Events: ``event: <name>`` + ``data: <json>`` frames, one per line pair."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Iterator

from django.utils.translation import gettext as _

from ..exceptions import RagError
from ..llm import UsageMeter
from ..streaming import StreamingResponse
from .errors import public_message

logger = logging.getLogger("django_rag.api")


def frame(event: str, data: dict) -> str:
    return f"event: {event}\ndata: {json.dumps(data, default=str)}\n\n"


class EventStream:
    """The body of an SSE response: iterating it runs the answer a piece at a time (each piece
    inside ``meter.active()``, so the LLM calls it makes are counted), and :meth:`close`
    ends it whatever happened.

    The server calls :meth:`close` when the response is over: after ``done``, after an
    ``error``, and when the client went away mid-stream (under WSGI when a write failed, even
    before the first event; under ASGI when the client disconnected:
    :class:`~django_rag.streaming.StreamingResponse`). Closing stops the answer's LLM stream (which records what it cost so far in
    the meter) and then calls ``on_close`` once, where the caller settles its budget.
    """

    def __init__(
        self,
        events: Iterator[str],
        pieces: Iterable[str],
        *,
        meter: UsageMeter | None = None,
        on_close: Callable[[], None] | None = None,
    ):
        self._events = events
        self._pieces = pieces
        self._meter = meter or UsageMeter()
        self._on_close = on_close

    def __iter__(self) -> EventStream:
        return self

    def __next__(self) -> str:
        with self._meter.active():
            return next(self._events)

    def close(self) -> None:
        try:
            with self._meter.active():
                self._events.close()
                close = getattr(self._pieces, "close", None)
                if close is not None:  # never started: events() could not close it
                    close()
        finally:
            on_close, self._on_close = self._on_close, None
            if on_close is not None:
                on_close()


def stream_events(
    meta: dict,
    pieces: Iterable[str],
    finish: Callable[[], dict],
    *,
    meter: UsageMeter | None = None,
    on_close: Callable[[], None] | None = None,
    staff: bool = False,
) -> StreamingResponse:
    """``meta`` first, a ``token`` event per piece of text, then ``done`` with what
    ``finish()`` returns (citations, usage...). A failure while streaming (a cut upstream
    stream, a timeout) ends the stream with an ``error`` event and no ``done``: the client
    never mistakes a partial answer for a finished one. ``meter`` counts the LLM calls made
    while streaming; ``on_close`` runs once when the response is closed (:class:`EventStream`).
    The error event's message is the visitor's short text, or the details for ``staff``
    (:func:`~django_rag.api.errors.public_message`)."""

    def events() -> Iterator[str]:
        try:
            yield frame("meta", meta)
            try:
                for piece in pieces:
                    if piece:
                        yield frame("token", {"text": piece})
                done = finish()
            except RagError as exc:
                message = public_message(exc, staff=staff)
                yield frame("error", {"code": exc.code, "message": message})
                return
            except Exception:  # never a half answer presented as whole; the log has the cause
                logger.exception("API stream failed")
                message = _("The answer failed. Please try again.")
                yield frame("error", {"code": "internal_error", "message": message})
                return
            yield frame("done", done)
        finally:
            # The client went away (GeneratorExit at a yield) or the answer ended: stop the
            # answer's LLM stream now, not when the garbage collector finds it.
            close = getattr(pieces, "close", None)
            if close is not None:
                close()

    body = EventStream(events(), pieces, meter=meter, on_close=on_close)
    response = StreamingResponse(body, content_type="text/event-stream; charset=utf-8")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # nginx: pass events through as they come
    return response
