"""One streaming response for every streaming view: it streams under WSGI and ASGI alike."""

from __future__ import annotations

import contextvars
import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any

from asgiref.sync import sync_to_async
from django.http import StreamingHttpResponse

logger = logging.getLogger("django_rag")

_END = object()


def _pull(iterator: Iterator[Any]) -> Any:
    try:
        return next(iterator)
    except StopIteration:
        return _END


class StreamingResponse(StreamingHttpResponse):
    """A :class:`~django.http.StreamingHttpResponse` over a synchronous iterator whose pieces
    reach the client as they are made, under a WSGI server and under an ASGI server.

    Under WSGI nothing changes: the server iterates the content and calls :meth:`close` when
    the response is over (after the last piece, after an error, or when the client went away
    and a write failed).

    Under ASGI (uvicorn, daphne, hypercorn) Django's handler reads ``aiter(response)``, and a
    plain ``StreamingHttpResponse`` would collect the whole synchronous iterator into a list in
    a thread before sending any of it. Here each piece is pulled on its own, with
    ``sync_to_async(thread_sensitive=True)``: in the request's own sync thread, the one where
    the view ran, so the stream uses the view's database connection and Django's end of request
    (``request_finished``) closes it as usual; and every pull runs in one copy of the request's
    context, so context variables set while producing one piece (telemetry spans, usage
    meters) are there for the next.

    When the client leaves mid-stream, Django cancels the response and never calls
    :meth:`close`; the iterator is closed here instead, in the same thread, after the piece
    being made when the client left: the same close a WSGI server does.
    """

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if self.is_async:
            async for part in super().__aiter__():
                yield part
            return
        iterator = self._iterator
        context = contextvars.copy_context()
        pull = sync_to_async(_pull, thread_sensitive=True, context=context)
        finished = False
        try:
            while True:
                part = await pull(iterator)
                if part is _END:
                    finished = True
                    return
                yield self.make_bytes(part)
        finally:
            if not finished:
                # Cancelled (the client went away) or abandoned by the server: close now,
                # queued behind the pull in flight (the thread runs one call at a time).
                await sync_to_async(self._close_content, thread_sensitive=True, context=context)()

    def _close_content(self) -> None:
        """What :meth:`close` closes, without sending ``request_finished`` (Django's ASGI
        handler sends it for a cancelled response)."""
        for closer in self._resource_closers:
            try:
                closer()
            except Exception:
                logger.exception("Closing a stream the client left failed")
