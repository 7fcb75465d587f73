"""Fakes for fast tests, for this project's suite and for users' own tests.

``HashingEmbedder`` is deterministic and offline: texts that share words get closer vectors.
Use it with ``DJANGO_RAG = {"EMBEDDER": "hashing"}`` in test settings. ``ScriptedLLM`` answers
from a script, so code that calls an LLM can be tested without one.
"""

from __future__ import annotations

# Defined in the layers that name them by alias ("hashing", "scripted"), so no alias points up
# to this package; the names users import stay here.
from ..embeddings.hashing import HashingEmbedder
from ..llm.scripted import ScriptedLLM

__all__ = ["HashingEmbedder", "ScriptedLLM"]
