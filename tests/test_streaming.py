"""django_rag.streaming.StreamingResponse read the way Django's ASGI handler reads it
(``aiter(response)`` inside a ``ThreadSensitiveContext``): one piece at a time, every pull in
one thread and one context, and a stream cancelled mid-way (the client left) closed in that
thread. tests/test_asgi.py runs it end to end under uvicorn."""

import asyncio
import contextvars
import threading
from contextlib import aclosing

import pytest
from asgiref.sync import ThreadSensitiveContext

from django_rag.streaming import StreamingResponse

current = contextvars.ContextVar("current", default=None)


async def read_all(response) -> list[bytes]:
    async with ThreadSensitiveContext(), aclosing(aiter(response)) as content:
        return [part async for part in content]


def test_pieces_are_pulled_one_at_a_time_in_one_thread_and_one_context():
    made, threads = [], set()

    def pieces():
        # Set while making the first piece, reset after the last: a later pull in another
        # context would fail the reset (ValueError) or not see the value.
        token = current.set("stream")
        try:
            for number in range(3):
                threads.add(threading.get_ident())
                assert current.get() == "stream"
                made.append(number)
                yield f"piece{number} "
        finally:
            current.reset(token)

    got = []

    async def consume():
        async with ThreadSensitiveContext():
            async with aclosing(aiter(StreamingResponse(pieces()))) as content:
                async for part in content:
                    got.append((part, list(made)))  # nothing made ahead of the reader

    asyncio.run(consume())
    assert got == [(b"piece0 ", [0]), (b"piece1 ", [0, 1]), (b"piece2 ", [0, 1, 2])]
    assert len(threads) == 1 and threading.get_ident() not in threads
    assert current.get() is None


def test_a_stream_cancelled_mid_way_is_closed_in_its_thread_after_the_piece_in_hand():
    made, closed, threads = [], [], set()
    making_second = threading.Event()
    go_on = threading.Event()

    def pieces():
        try:
            for number in range(5):
                threads.add(threading.get_ident())
                if number == 1:
                    making_second.set()
                    assert go_on.wait(10)
                made.append(number)
                yield f"piece{number} "
        finally:
            closed.append(threading.get_ident())

    response = StreamingResponse(pieces())
    sent = []

    async def main():
        async with ThreadSensitiveContext():

            async def serve():  # as Django's handler sends a streaming response
                async with aclosing(aiter(response)) as content:
                    async for part in content:
                        sent.append(part)

            task = asyncio.create_task(serve())
            while not making_second.is_set():
                await asyncio.sleep(0.01)
            task.cancel()  # the client left while the second piece was being made
            go_on.set()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(main())
    assert sent == [b"piece0 "]
    assert made == [0, 1]  # the piece in hand was finished, nothing after it
    assert closed and closed[0] in threads and len(threads) == 1
    response.close()  # what Django may still call: nothing happens twice
    assert len(closed) == 1


def test_under_wsgi_it_is_a_plain_streaming_response():
    response = StreamingResponse(iter(["a", "b"]))
    assert list(response) == [b"a", b"b"]
    assert asyncio.run(read_all(StreamingResponse(iter(["c"])))) == [b"c"]
