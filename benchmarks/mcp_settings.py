"""benchmarks/settings.py for benchmarks/mcp_overhead.py and the rag_mcp processes it starts: the MCP
server may read the benchmark's collection; DJANGO_RAG_BENCHMARK_EMBEDDER picks the embedder."""

import os

from benchmarks.settings import *  # noqa: F403
from benchmarks.settings import DJANGO_RAG

DJANGO_RAG = {**DJANGO_RAG, "MCP": {"COLLECTIONS": ["mcp-bench"], "TOOLS": ["search"]}}
if os.environ.get("DJANGO_RAG_BENCHMARK_EMBEDDER"):
    DJANGO_RAG["EMBEDDER"] = os.environ["DJANGO_RAG_BENCHMARK_EMBEDDER"]
# --conn-max-age of benchmarks/mcp_overhead.py: keep database connections between tool calls.
if os.environ.get("DJANGO_RAG_BENCHMARK_CONN_MAX_AGE"):
    DATABASES["default"]["CONN_MAX_AGE"] = int(os.environ["DJANGO_RAG_BENCHMARK_CONN_MAX_AGE"])  # noqa: F405
