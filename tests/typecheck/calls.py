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

agent = rag.Agent("Compare plan A and plan B", collection="plans", mode="hybrid", fusion="rrf")
rag.Agent("Refunds?", fusion="weighted", reranker=False)
loop = rag.Loop("Refunds?", collection="handbook", max_iterations=3, mode="semantic")
rag.Agent("Refunds?", fuson="rrf")  # type: ignore[call-arg]
rag.Loop("Refunds?", modde="hybrid")  # type: ignore[call-arg]
rag.ingest("Refunds take 14 days.", collection="handbook", chunk_size=200, replace=False)
rag.ingest_file("manual.pdf", collection="handbook", on_chunk_error="abort")
rag.ingest("Refunds take 14 days.", chunk_sise=200)  # type: ignore[call-arg]
rag.ingest_file("manual.pdf", colection="handbook")  # type: ignore[call-arg]
