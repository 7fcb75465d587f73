"""Calls a type checker checks (tests/test_typecheck.py runs mypy on this file alone): the
README's calls type-check, and a misspelled option is an error before anything runs (each
``type: ignore[call-arg]`` below must be needed: mypy runs with ``--warn-unused-ignores``).
Never imported by the tests: mypy reads it, nothing runs it."""

import django_rag as rag
from django_rag.retrieval.options import SearchOptions

for hit in rag.search("how long do refunds take", mode="hybrid", collection="handbook"):
    print(hit.score, hit.filename, hit.page_start, hit.text)

answer = rag.ask("How long do refunds take?", collection="handbook", llm="openai/gpt-4o-mini")
reply = rag.chat("And for opened products?", collection="handbook", mode="keyword", limit=3)
rag.search("refunds", fusion="weighted", keyword_score_floor=0.1, reranker=False, graph=True)

options: SearchOptions = {"mode": "semantic", "limit": 5}
rag.search("refunds", **options)

rag.search("refunds", limt=5)  # type: ignore[call-arg]
rag.ask("Refunds?", strict_collections=True)  # type: ignore[call-arg]
rag.chat("Refunds?", reranker="cross-encoder", mod="hybrid")  # type: ignore[call-arg]
