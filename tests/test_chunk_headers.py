"""CHUNK_HEADERS: title and heading path in the embedding input and the full-text vector, never
in the stored text; re-embedding, re-indexing and the model switch keep them."""

import os

import numpy as np
import pytest
from django.db import connection
from django.test import override_settings

import django_rag as rag
from django_rag import maintenance
from django_rag.ingestion.chunkers import TextChunk
from django_rag.ingestion.headers import add_headers, header_text, heading_marks
from django_rag.models import Chunk
from django_rag.retrieval.fulltext import index_chunks
from django_rag.store import schema
from django_rag.store.headers import MAX_HEADER_CHARS, with_header
from django_rag.testing import HashingEmbedder

pytestmark = pytest.mark.django_db

ON = {"EMBEDDER": "hashing", "CHUNK_HEADERS": True}
# scripts/test-textsearch.sh: full-text search runs on the pg_textsearch index of the text.
PG_TEXTSEARCH = os.environ.get("DJANGO_RAG_TEST_FULLTEXT_BACKEND") == "pg_textsearch"
OFF = {"EMBEDDER": "hashing", "CHUNK_HEADERS": False}

GUIDE = """# Tomatoes

Tomatoes like sun.

## Watering

Give them water at dawn, never at noon; the leaves burn.

```python
# not a heading: a comment in code
print("hi")
```

## Pruning

Remove the side shoots every week.

# Cucumbers

Cucumbers climb anything near them.
"""


class RecordingEmbedder(HashingEmbedder):
    def __init__(self, **options):
        super().__init__(**options)
        self.inputs: list[str] = []

    def _embed(self, texts):
        self.inputs.extend(texts)
        return super()._embed(texts)


def test_heading_paths_skip_code_and_replace_siblings():
    offsets, paths = heading_marks(GUIDE)
    assert paths == [
        ("Tomatoes",),
        ("Tomatoes", "Watering"),
        ("Tomatoes", "Pruning"),
        ("Cucumbers",),
    ]
    assert [GUIDE[o : o + 2] for o in offsets] == ["# ", "##", "##", "# "]


def test_header_text_drops_a_heading_that_repeats_the_title_and_is_bounded():
    assert header_text("Guide", ["Guide", "Install"]) == "Guide\nInstall"
    assert header_text("", ["A", "B"]) == "A > B"
    assert header_text("T", []) == "T"
    assert header_text("", []) == ""
    assert len(header_text("x" * 1000, ["y"])) == MAX_HEADER_CHARS


def test_add_headers_keeps_a_chunkers_own_header_and_plain_text_gets_the_title():
    chunks = [TextChunk("Give them water", GUIDE.index("Give"), None, 3)]
    own = TextChunk("x", 0, 1, 1, metadata={"header": "mine"})
    add_headers([*chunks, own], title="Garden", text=GUIDE, format="markdown")
    assert chunks[0].metadata["header"] == "Garden\nTomatoes > Watering"
    assert own.metadata["header"] == "mine"
    plain = [TextChunk("Give them water", GUIDE.index("Give"), None, 3)]
    add_headers(plain, title="Garden", text=GUIDE, format="text")
    assert plain[0].metadata["header"] == "Garden"


def ingest_guide(embedder=None):
    return rag.ingest(
        GUIDE,
        format="markdown",
        title="Kitchen garden handbook",
        collection="garden",
        chunk_size=20,
        chunk_overlap=0,
        embedder=embedder,
    )


def test_headers_reach_the_embedding_and_index_but_not_the_stored_text():
    embedder = RecordingEmbedder()
    with override_settings(DJANGO_RAG=ON):
        document = ingest_guide(embedder)
    chunks = list(Chunk.objects.filter(document=document).order_by("chunk_index"))
    assert len(chunks) >= 4
    for chunk in chunks:
        # Stored text and offsets unchanged.
        assert chunk.text == document.content[chunk.start_char : chunk.end_char]
        assert "handbook" not in chunk.text
        assert chunk.metadata["header"].startswith("Kitchen garden handbook")
    # Chunks starting under "## Watering" carry its path.
    content = document.content
    under = [
        c
        for c in chunks
        if content.index("## Watering") <= c.start_char < content.index("## Pruning")
    ]
    assert under
    for watering in under:
        assert watering.metadata["header"] == "Kitchen garden handbook\nTomatoes > Watering"
    # What the embedder read: header, blank line, text.
    assert with_header(watering.text, watering.metadata["header"]) in embedder.inputs
    expected = HashingEmbedder().embed_documents(
        [with_header(watering.text, watering.metadata["header"])]
    )[0]
    assert np.allclose(watering.embedding, expected, atol=1e-6)
    if PG_TEXTSEARCH:
        return  # that backend indexes the text column itself (docs/ingestion.md)
    # The full-text vector holds the header's words: every chunk is found by the title.
    hits = rag.search("handbook", mode="fulltext", collection="garden", limit=50)
    assert len(hits) == len(chunks)
    pruning = rag.search("pruning shoots", mode="fulltext", collection="garden", limit=1)
    assert "side shoots" in pruning[0].text and "handbook" not in pruning[0].text
    # ... and only the stored text comes back, windows included.
    [hit] = rag.search("dawn", mode="fulltext", collection="garden", context_window=1)
    assert "handbook" not in hit.context


def test_headers_are_on_by_default_and_off_changes_nothing():
    from django_rag.ingestion.headers import headers_enabled

    assert headers_enabled()  # the default (docs/benchmarks.md: measured)
    embedder = RecordingEmbedder()
    with override_settings(DJANGO_RAG=OFF):
        document = ingest_guide(embedder)
        chunks = list(Chunk.objects.filter(document=document))
        assert all("header" not in chunk.metadata for chunk in chunks)
        assert sorted(embedder.inputs) == sorted(chunk.text for chunk in chunks)
        if not PG_TEXTSEARCH:
            assert rag.search("handbook", mode="fulltext", collection="garden") == []


def test_reembedding_and_reindexing_keep_the_header():
    with override_settings(DJANGO_RAG=ON):
        document = ingest_guide()
    chunk = Chunk.objects.filter(document=document).order_by("chunk_index")[1]
    expected = HashingEmbedder().embed_documents(
        [with_header(chunk.text, chunk.metadata["header"])]
    )[0]
    # Another model's vectors, then re-embedding in place (the setting is off by now: the
    # header travels with the chunk).
    old = HashingEmbedder(model_name="old-model")
    Chunk.objects.filter(document=document).update(embedding_model="old-model")
    Chunk.objects.filter(pk=chunk.pk).update(embedding=old.embed_documents(["other"])[0])
    with override_settings(DJANGO_RAG=OFF):
        assert maintenance.reembed().done == Chunk.objects.filter(document=document).count()
        chunk.refresh_from_db()
        assert np.allclose(chunk.embedding, expected, atol=1e-6)
        Chunk.objects.filter(pk=chunk.pk).update(embedding=old.embed_documents(["other"])[0])
        maintenance.reembed_documents([document.pk])
        chunk.refresh_from_db()
        assert np.allclose(chunk.embedding, expected, atol=1e-6)
        # Re-indexing (after a TEXT_SEARCH_CONFIG change) keeps the header's words.
        Chunk.objects.filter(document=document).update(search_vector=None)
        assert index_chunks(document_id=document.pk) >= 4
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM django_rag_chunk WHERE document_id = %s "
            "AND search_vector @@ to_tsquery('english', 'handbook')",
            [document.pk],
        )
        assert cursor.fetchone()[0] == Chunk.objects.filter(document=document).count()


def test_the_model_switch_embeds_the_header_too():
    with override_settings(DJANGO_RAG=ON):
        document = ingest_guide()
    schema.prepare_shadow(256, fresh=True)
    try:
        pending = dict(schema.pending_shadow(100))
    finally:
        schema.delete_orphans(drop_shadow=True)
    for chunk in Chunk.objects.filter(document=document):
        assert pending[chunk.pk] == with_header(chunk.text, chunk.metadata["header"])
