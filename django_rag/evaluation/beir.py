"""Import a BEIR-format dataset (corpus.jsonl, queries.jsonl, qrels/<split>.tsv)."""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from pathlib import Path

from django.db import transaction

from ..exceptions import FileNotFound, InvalidInput
from ..ingestion.headers import headers_enabled
from ..ingestion.service import ingest_many
from ..models import Collection, Relevance, TestCase


def _read_jsonl(path: Path) -> list[dict]:
    rows = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except ValueError as exc:
                    raise InvalidInput(f"{path}:{number} is not valid JSON: {exc}") from exc
    return rows


def corpus_document(doc: dict) -> dict[str, str]:
    """One BEIR corpus row as :func:`~django_rag.ingestion.service.ingest` arguments, with its
    title embedded and indexed once: as the chunk header when ``CHUNK_HEADERS`` is on, else
    written before the text (a row with no text is its title)."""
    title = str(doc.get("title") or "").strip()
    text = str(doc.get("text") or "").strip()
    if not headers_enabled() or not text:
        text = f"{title}\n\n{text}".strip()
    return {"text": text, "title": title, "source_id": str(doc["_id"])}


def read_qrels(path: Path) -> dict[str, dict[str, int]]:
    """``{query id: {document id: grade}}`` for grades > 0 (a header line is allowed)."""
    qrels: dict[str, dict[str, int]] = {}
    with path.open(encoding="utf-8") as handle:
        for row in csv.reader(handle, delimiter="\t"):
            if len(row) < 3 or not row[-1].strip().lstrip("-").isdigit():
                continue  # the header, or a blank line
            query_id, doc_id, grade = row[0], row[-2], int(row[-1])
            if grade > 0:
                qrels.setdefault(query_id, {})[doc_id] = grade
    return qrels


def import_beir(
    path: str | Path,
    *,
    collection: str = "beir",
    split: str = "test",
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, int]:
    """Ingest the corpus into ``collection`` and create a document-level test case per query
    of ``split`` that has relevance judgements.

    Corpus ids become ``source_id``s. Importing again reuses the stored documents (identical
    text is not stored twice) and skips queries already imported into the collection.
    Returns counts: documents, test_cases, relevance, skipped_queries, existing_test_cases.
    """
    root = Path(path)
    files = {
        "corpus": root / "corpus.jsonl",
        "queries": root / "queries.jsonl",
        "qrels": root / "qrels" / f"{split}.tsv",
    }
    for name, file in files.items():
        if not file.is_file():
            raise FileNotFound(
                f"{file} is missing: a BEIR dataset has corpus.jsonl, queries.jsonl and "
                f"qrels/{split}.tsv ({name})."
            )
    corpus = _read_jsonl(files["corpus"])
    queries = {str(q["_id"]): q["text"] for q in _read_jsonl(files["queries"])}
    qrels = read_qrels(files["qrels"])
    documents = ingest_many(
        (corpus_document(doc) for doc in corpus),
        collection=collection,
        on_error="raise",  # a corpus that does not load whole is not the benchmark
    )
    by_source = {doc.source_id: doc.pk for doc in documents}
    target = Collection.objects.get(name=collection)
    existing = set(
        TestCase.objects.filter(collection=target, origin=TestCase.Origin.IMPORTED).values_list(
            "external_id", flat=True
        )
    )
    counts = {"documents": len(documents), "test_cases": 0, "relevance": 0}
    counts["skipped_queries"] = counts["existing_test_cases"] = 0
    todo = [qid for qid in qrels if qid in queries]
    counts["skipped_queries"] = len(qrels) - len(todo)
    with transaction.atomic():
        for done, qid in enumerate(todo, start=1):
            if qid in existing:
                counts["existing_test_cases"] += 1
                continue
            judged = {by_source[d]: g for d, g in qrels[qid].items() if d in by_source}
            if not judged:
                counts["skipped_queries"] += 1
                continue
            case = TestCase.objects.create(
                question=queries[qid],
                collection=target,
                level=TestCase.Level.DOCUMENT,
                origin=TestCase.Origin.IMPORTED,
                external_id=qid,
            )
            Relevance.objects.bulk_create(
                Relevance(test_case=case, document_id=doc_id, grade=grade)
                for doc_id, grade in judged.items()
            )
            counts["test_cases"] += 1
            counts["relevance"] += len(judged)
            if progress:
                progress(done, len(todo))
    return counts
