from django.core.management.base import CommandError

from django_rag.exceptions import RagError
from django_rag.management.progress import RagCommand, note
from django_rag.mcp.server import build_server, is_loopback, serve_http, serve_stdio
from django_rag.mcp.tools import McpConfig


class Command(RagCommand):
    help = (
        "Serve search and ask as MCP tools (Model Context Protocol) over stdio (for a desktop "
        "assistant or an IDE that starts this command) or streamable HTTP. What the tools may "
        "read and write is set in DJANGO_RAG['MCP'] (docs/mcp.md)."
    )
    # stdout is the protocol's channel on stdio: handle() runs the checks with anything they
    # would print on stdout sent to stderr.
    requires_system_checks = []

    def add_arguments(self, parser):
        parser.add_argument(
            "--transport",
            choices=["stdio", "http"],
            default="stdio",
            help="stdio (default: the client starts this command) or http (streamable HTTP)",
        )
        parser.add_argument("--host", default="127.0.0.1", help="HTTP: address to listen on")
        parser.add_argument("--port", type=int, default=8765, help="HTTP: port (default 8765)")
        parser.add_argument("--path", default="/mcp", help="HTTP: the endpoint's path")
        parser.add_argument(
            "--allow-remote",
            action="store_true",
            help="HTTP: allow a non-loopback --host without DJANGO_RAG['MCP']['TOKENS'], behind "
            "a proxy that authenticates clients (docs/mcp.md)",
        )

    def handle(self, *args, transport, host, port, path, allow_remote, **options):
        if transport == "http":
            if not 0 < port < 65536:
                raise CommandError(f"--port must be from 1 to 65535, got {port}")
            if not path.startswith("/"):
                raise CommandError(f"--path must start with '/', got {path!r}")
        stdout, self.stdout = self.stdout, self.stderr
        try:
            self.check(databases=["default"])
        finally:
            self.stdout = stdout
        try:
            config = McpConfig.from_settings()
            server = build_server(config)
        except RagError as exc:
            raise CommandError(str(exc)) from exc
        if transport == "stdio":
            serve_stdio(server)
            return
        if not (is_loopback(host) or config.tokens or allow_remote):
            raise CommandError(
                f"--host {host} is not a loopback address and DJANGO_RAG['MCP']['TOKENS'] is "
                "empty: anyone who reaches the port could read the allowed collections. Set "
                "MCP.TOKENS (clients send 'Authorization: Bearer TOKEN'), or pass "
                "--allow-remote once a proxy in front of it authenticates clients."
            )
        guard = "a bearer token from MCP.TOKENS required" if config.tokens else "no token asked for"
        note(self.stderr, f"MCP server on http://{host}:{port}{path} ({guard}; Ctrl+C to stop)")
        serve_http(server, host=host, port=port, path=path, tokens=config.tokens)
