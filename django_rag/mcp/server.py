"""The MCP server: the tools of :mod:`django_rag.mcp.tools` on the official ``mcp`` SDK's
low-level :class:`mcp.server.Server`, served over stdio or streamable HTTP.

The low-level server (not ``MCPServer``'s decorated functions) is used so that a tool receives
the client's arguments exactly as sent: ``MCPServer`` drops arguments a function does not take,
and an unknown argument must be refused, not ignored.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Sequence
from typing import Any

from ..exceptions import MissingDependency
from .tools import TOOLS, McpConfig, call_tool, result_text

LOOPBACK_NAMES = ("localhost",)


def _sdk():
    try:
        import anyio
        import mcp_types
        from mcp.server import Server
    except ImportError as exc:
        raise MissingDependency("mcp", "mcp", "The MCP server (manage.py rag_mcp)") from exc
    return anyio, mcp_types, Server


def build_server(config: McpConfig | None = None):
    """The MCP server offering the tools ``MCP.TOOLS`` names, scoped by the ``MCP`` settings
    (read and checked now: a bad setting raises :class:`~django_rag.exceptions.ConfigurationError`
    before anything is served)."""
    config = config or McpConfig.from_settings()
    anyio, types, Server = _sdk()
    from django import db

    from .. import __version__

    limiter = anyio.CapacityLimiter(config.max_concurrent_calls)

    async def list_tools(ctx: Any, params: Any) -> Any:
        return types.ListToolsResult(
            tools=[
                types.Tool(
                    name=spec.name,
                    description=spec.description,
                    input_schema=spec.schema(config),
                    annotations=types.ToolAnnotations(
                        read_only_hint=spec.read_only,
                        destructive_hint=False,
                        idempotent_hint=spec.read_only,
                        open_world_hint=False,
                    ),
                )
                for spec in (TOOLS[name] for name in config.tools)
            ]
        )

    def run_in_thread(name: str, arguments: Any) -> tuple[dict[str, Any], bool]:
        # The ORM is synchronous: each call runs in a worker thread, whose connection is
        # closed afterwards as a request's would be (CONN_MAX_AGE applies).
        db.close_old_connections()
        try:
            return call_tool(name, arguments, config)
        finally:
            db.close_old_connections()

    async def call(ctx: Any, params: Any) -> Any:
        result, is_error = await anyio.to_thread.run_sync(
            run_in_thread, params.name, params.arguments, limiter=limiter
        )
        return types.CallToolResult(
            content=[types.TextContent(text=result_text(result))],
            structured_content=result,
            is_error=is_error,
        )

    return Server(
        "django-rag",
        version=__version__,
        instructions=(
            "Search this project's documents with the search tool (passages with their ids and "
            "scores) or get a cited answer with the ask tool."
        ),
        on_list_tools=list_tools,
        on_call_tool=call,
    )


def serve_stdio(server) -> None:
    """Serve ``server`` on this process's stdin and stdout until the client closes them."""
    anyio, _, _ = _sdk()
    from mcp.server.stdio import stdio_server

    async def main() -> None:
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())

    anyio.run(main)


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class StaticTokens:
    """The SDK's token verifier for ``MCP.TOKENS``: a request is let in when its bearer token
    is one of them. Every token is compared in constant time, so how long a refusal takes
    says nothing of how much of a token was right."""

    def __init__(self, tokens: Sequence[str]):
        self._tokens = [token.encode() for token in tokens]

    async def verify_token(self, token: str) -> Any:
        from mcp.server.auth.provider import AccessToken

        sent = token.encode()
        matches = [i for i, known in enumerate(self._tokens) if hmac.compare_digest(sent, known)]
        if not matches:
            return None
        # The client id names the token's place in the list, never the token.
        return AccessToken(token=token, client_id=f"MCP.TOKENS[{matches[0]}]", scopes=[])


def http_app(server, *, host: str, path: str = "/mcp", tokens: Sequence[str] = ()):
    """The ASGI app serving ``server`` over streamable HTTP at ``path``. On a loopback
    ``host`` the SDK checks the Host and Origin headers (DNS rebinding protection). With
    ``tokens``, a request without ``Authorization: Bearer`` and one of them gets the SDK's
    401 (the SDK's bearer middleware, given :class:`StaticTokens` as its verifier)."""
    if not tokens:
        return server.streamable_http_app(streamable_http_path=path, host=host)
    from mcp.server.auth.settings import AuthSettings

    # No authorization server is offered (the tokens are configured, not issued), so the
    # issuer URL is never published; the SDK only requires one.
    auth = AuthSettings(issuer_url="http://localhost", resource_server_url=None)
    return server.streamable_http_app(
        streamable_http_path=path, host=host, auth=auth, token_verifier=StaticTokens(tokens)
    )


def serve_http(
    server,
    *,
    host: str,
    port: int,
    path: str = "/mcp",
    tokens: Sequence[str] = (),
    log_level: str = "warning",
):
    """Serve ``server`` over streamable HTTP on ``host:port`` until interrupted."""
    _sdk()
    import uvicorn

    app = http_app(server, host=host, path=path, tokens=tokens)
    uvicorn.run(app, host=host, port=port, log_level=log_level)
