"""A small OpenAI-compatible HTTP server on 127.0.0.1 for integration tests through litellm."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from django_rag.testing import HashingEmbedder


class StubOpenAI:
    def __init__(self, dimensions: int = 384):
        self.embedder = HashingEmbedder(dimensions=dimensions)
        self.requests: list[dict] = []
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
                if self.path.endswith("/embeddings"):
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
                else:
                    self._send(404, {"error": {"message": f"no route {self.path}"}})

            def _send(self, status, payload):
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
