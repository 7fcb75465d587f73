"""tests.settings for a ``rag_mcp`` child process (tests/test_mcp.py): the DJANGO_RAG keys in
the JSON of DJANGO_RAG_TEST_MCP (its MCP section, an LLM spec) merged over the suite's."""

import json
import os

from tests.settings import *  # noqa: F403
from tests.settings import DJANGO_RAG

DJANGO_RAG = {**DJANGO_RAG, **json.loads(os.environ.get("DJANGO_RAG_TEST_MCP", "{}"))}
