"""A small OpenAI-compatible HTTP server on 127.0.0.1 for integration tests through litellm."""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from django_rag.testing import HashingEmbedder


class Failure:
    """A scripted HTTP error answer (for example a 429 with Retry-After)."""

    def __init__(self, status: int, message: str = "scripted failure", retry_after=None):
        self.status = status
        self.message = message
        self.retry_after = retry_after


class Drop:
    """A streamed reply cut off after ``after`` pieces of ``text``: no finish chunk, no
    ``[DONE]``. ``reset=True`` resets the TCP connection instead of closing it cleanly."""

    def __init__(self, text: str, after: int = 2, reset: bool = False):
        self.text = text
        self.after = after
        self.reset = reset


class Held:
    """A streamed reply that stops after ``after`` pieces of ``text`` until the test calls
    :meth:`release` (or ``timeout`` seconds pass), then sends the rest: the server under test
    is provably still answering while its client reads the first pieces."""

    def __init__(self, text: str, after: int = 1, timeout: float = 60):
        self.text = text
        self.after = after
        self.timeout = timeout
        self.released = threading.Event()

    def release(self) -> None:
        self.released.set()


class Raw:
    """A chat reply sent exactly as given (a JSON-able payload), e.g. one with no choices."""

    def __init__(self, payload):
        self.payload = payload


class ToolCalls:
    """A chat reply asking for tool calls: ``calls`` are ``(name, arguments)`` pairs, where
    ``arguments`` is a dict (sent as JSON text) or a string sent as it is (broken JSON...)."""

    def __init__(self, *calls, text=None):
        self.calls = calls
        self.text = text


class StubOpenAI:
    """``/embeddings`` from a hashing embedder; ``/chat/completions`` from a script.

    ``chat`` is a list of replies used in order (a string, or a :class:`Failure`); ``rules``
    maps a substring of the last user message to a reply used whenever it matches; a
    :class:`Failure` at the head of ``chat`` is sent before any rule, then rules are checked,
    then ``chat``; ``default`` answers otherwise. Streaming requests get SSE chunks, one per word.
    A :class:`Drop` reply streams a few words and then cuts the connection; a :class:`Held`
    reply streams a few words and waits for the test before the rest; a :class:`Raw`
    reply is sent as given (a reply with no choices, for example); a :class:`ToolCalls` reply
    asks for tool calls (OpenAI ``tool_calls``, finish reason ``tool_calls``).
    """

    def __init__(self, dimensions: int = 384, chat=None, rules=None, default="OK"):
        self.embedder = HashingEmbedder(dimensions=dimensions)
        self.requests: list[dict] = []
        self.chat = list(chat or [])
        self.rules = dict(rules or {})
        self.default = default
        self.embedding_failures: list[Failure] = []
        self.tool_call_ids = 0
        self.lock = threading.Lock()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                stub.requests.append(
                    {
                        "path": self.path,
                        "body": body,
                        "authorization": self.headers.get("Authorization"),
                    }
                )
                if self.path.endswith("/embeddings") and stub.embedding_failures:
                    failure = stub.embedding_failures.pop(0)
                    headers = {"Retry-After": "0"}
                    self._send(failure.status, {"error": {"message": failure.message}}, headers)
                elif self.path.endswith("/embeddings"):
                    inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
                    vectors = stub.embedder._embed(inputs)
                    payload = {
                        "object": "list",
                        "model": body["model"],
                        "data": [
                            {"object": "embedding", "index": i, "embedding": [float(x) for x in v]}
                            for i, v in enumerate(vectors)
                        ],
                        "usage": {
                            "prompt_tokens": 3 * len(inputs),
                            "total_tokens": 3 * len(inputs),
                        },
                    }
                    self._send(200, payload)
                elif self.path.endswith("/chat/completions"):
                    self._chat(body)
                else:
                    self._send(404, {"error": {"message": f"no route {self.path}"}})

            def _chat(self, body):
                reply = stub.next_reply(body)
                if isinstance(reply, Failure):
                    headers = {}
                    if reply.retry_after is not None:
                        headers["Retry-After"] = str(reply.retry_after)
                    error = {"message": reply.message, "type": "scripted", "code": reply.status}
                    self._send(reply.status, {"error": error}, headers)
                    return
                if isinstance(reply, Raw):
                    self._send(200, reply.payload)
                    return
                if isinstance(reply, Drop):
                    self._drop(body, reply)
                    return
                held = None
                if isinstance(reply, Held):
                    held, reply = reply, reply.text
                prompt_tokens = sum(len((m.get("content") or "").split()) for m in body["messages"])
                if isinstance(reply, ToolCalls):
                    self._tool_calls(body, reply, prompt_tokens)
                    return
                usage = {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": len(reply.split()),
                    "total_tokens": prompt_tokens + len(reply.split()),
                }
                base = {"id": "chatcmpl-stub", "created": 1700000000, "model": body["model"]}
                if not body.get("stream"):
                    message = {"role": "assistant", "content": reply}
                    choice = {"index": 0, "message": message, "finish_reason": "stop"}
                    payload = {**base, "object": "chat.completion", "choices": [choice]}
                    self._send(200, {**payload, "usage": usage})
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                chunk = {**base, "object": "chat.completion.chunk"}
                pieces = re.findall(r"\S+\s*|\s+", reply)
                for index, piece in enumerate(pieces):
                    if held is not None and index == held.after:
                        held.released.wait(held.timeout)
                    delta = {"index": 0, "delta": {"content": piece}, "finish_reason": None}
                    self._event({**chunk, "choices": [delta]})
                self._event(
                    {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
                )
                self._event({**chunk, "choices": [], "usage": usage})
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()

            def _tool_calls(self, body, reply, prompt_tokens):
                with stub.lock:
                    first = stub.tool_call_ids + 1
                    stub.tool_call_ids += len(reply.calls)
                calls = [
                    {
                        "id": f"call_stub_{first + index}",
                        "type": "function",
                        "function": {
                            "name": name,
                            "arguments": args if isinstance(args, str) else json.dumps(args),
                        },
                    }
                    for index, (name, args) in enumerate(reply.calls)
                ]
                message = {"role": "assistant", "content": reply.text, "tool_calls": calls}
                choice = {"index": 0, "message": message, "finish_reason": "tool_calls"}
                completion_tokens = sum(len(c["function"]["arguments"].split()) for c in calls)
                self._send(
                    200,
                    {
                        "id": "chatcmpl-stub",
                        "created": 1700000000,
                        "model": body["model"],
                        "object": "chat.completion",
                        "choices": [choice],
                        "usage": {
                            "prompt_tokens": prompt_tokens,
                            "completion_tokens": completion_tokens,
                            "total_tokens": prompt_tokens + completion_tokens,
                        },
                    },
                )

            def _drop(self, body, reply):
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                chunk = {
                    "id": "chatcmpl-stub",
                    "created": 1700000000,
                    "model": body["model"],
                    "object": "chat.completion.chunk",
                }
                for piece in re.findall(r"\S+\s*|\s+", reply.text)[: reply.after]:
                    delta = {"index": 0, "delta": {"content": piece}, "finish_reason": None}
                    self._event({**chunk, "choices": [delta]})
                if reply.reset:
                    import socket
                    import struct

                    self.connection.setsockopt(
                        socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                    )
                self.close_connection = True

            def _event(self, payload):
                self.wfile.write(b"data: " + json.dumps(payload).encode() + b"\n\n")
                self.wfile.flush()

            def _send(self, status, payload, headers=None):
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def next_reply(self, body):
        prompt = body["messages"][-1].get("content") or ""
        with self.lock:
            # Scripted failures come first, so a rate limit can hit any call.
            if self.chat and isinstance(self.chat[0], Failure):
                return self.chat.pop(0)
            for needle, reply in self.rules.items():
                if needle in prompt:
                    return reply
            if self.chat:
                return self.chat.pop(0)
            return self.default

    @property
    def chat_requests(self) -> list[dict]:
        return [r for r in self.requests if r["path"].endswith("/chat/completions")]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
