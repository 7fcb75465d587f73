"""The MCP server of ``manage.py rag_mcp``: search and ask (and, when the project allows it,
ingest of text) as Model Context Protocol tools, scoped by ``DJANGO_RAG["MCP"]``.

:mod:`.tools` holds the tools as plain functions (no SDK needed); :mod:`.server` serves them
with the official ``mcp`` SDK (the ``mcp`` extra). docs/mcp.md is the user's guide.
"""
