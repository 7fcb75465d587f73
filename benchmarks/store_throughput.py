"""Store and ingest throughput: the store alone (vectors given) and ingest against the encoder.

In one run, on BEIR SciFact abstracts (title + text, ``source_id`` = the BEIR id):

1. **store only**: chunks/s through the public path, ``rag.ingest_many`` and one ``rag.ingest``
   per document, with an embedder that returns precomputed vectors (synthetic unit vectors near
   real MiniLM vectors) and a chunker that returns chunks split beforehand with the MiniLM
   tokenizer, so what is timed is validation, the duplicate check and the write (rows, HNSW
   and GIN index entries, BM25 statistics by the triggers, their compaction);
   first into an empty database, then into a collection already holding ``--base`` chunks;
2. **ingest against the plain encoder**: ``rag.ingest_many`` with the real bundled MiniLM
   embedder, and ``SentenceTransformer.encode`` on the same chunk texts with the same batch
   size, in the same run (encoder, ingest, encoder again; the mean of the two encoder runs):
   the ratio ingest / encoder.

    DJANGO_RAG_BENCHMARK_DB=/tmp/django_rag_bench_store \\
        python benchmarks/store_throughput.py --docs 1200 --single-docs 300 --encoder-docs 400

``--data`` is a BEIR-format dataset (default ../shared/data/scifact). The django_rag tables of
the benchmark database are emptied (TRUNCATE) between the parts. It uses benchmarks/settings.py
(the embedded server in ``DJANGO_RAG_BENCHMARK_DB``, else ``$TMP/django_rag_benchmarks``, or
``DATABASE_URL``).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import sys
import tempfile
import time
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")

import django  # noqa: E402

django.setup()

import numpy as np  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402

import django_rag as rag  # noqa: E402
from django_rag.embeddings import Embedder, get_embedder  # noqa: E402
from django_rag.ingestion.chunkers import get_chunker  # noqa: E402
from django_rag.models import Chunk, Collection, Document  # noqa: E402
from django_rag.store import recount_statistics  # noqa: E402
from django_rag.store.statistics import compact_statistics, index_chunks  # noqa: E402

CENTRES = 256


def load_corpus(data: Path) -> list[dict]:
    return [json.loads(line) for line in (data / "corpus.jsonl").open()]


def passage(doc) -> str:
    return f"{doc['title']}\n\n{doc['text']}".strip()


def items(docs) -> list[dict]:
    return [{"text": passage(d), "source_id": d["_id"], "title": d["title"]} for d in docs]


def unit(rows: np.ndarray) -> np.ndarray:
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


class Precomputed(Embedder):
    """Precomputed vectors: for each text a real MiniLM vector (one of ``centres``, picked by a
    hash of the text) plus a little noise, normalised, computed before anything is timed."""

    model_name = "precomputed-minilm"

    def __init__(self, centres: np.ndarray, texts: list[str]):
        self.centres = centres
        self._dimensions = centres.shape[1]
        self.batch_size = 32
        self.vectors = {text: self._vector(text) for text in texts}

    def _vector(self, text: str) -> list[float]:
        seed = zlib.crc32(text.encode())
        noisy = self.centres[seed % len(self.centres)] + np.random.default_rng(seed).normal(
            0, 0.04, self._dimensions
        )
        return (noisy / np.linalg.norm(noisy)).tolist()

    def embed_documents(self, texts):
        # A text not seen before (a chunk with its header, CHUNK_HEADERS) gets its vector now.
        return [self.vectors.get(text) or self._vector(text) for text in texts]


class PreChunked:
    """A chunker callable returning chunks split beforehand with the real chunker."""

    def __init__(self, texts: list[str], embedder):
        chunker = get_chunker()
        self.chunks = {text: chunker.chunk(text, embedder=embedder) for text in texts}

    def __call__(self, text, format="text"):
        return self.chunks[text]


def wipe() -> None:
    tables = [t for t in connection.introspection.table_names() if t.startswith("django_rag_")]
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY CASCADE")


def fill(collection: str, docs, chunker: PreChunked, embedder: Precomputed, target: int) -> int:
    """Put about ``target`` chunks into ``collection`` with bulk ORM inserts (fast, not timed);
    the full-text vectors and statistics follow through index_chunks and the triggers."""
    coll, _ = Collection.objects.get_or_create(name=collection)
    total = 0
    for doc in docs:
        if total >= target:
            break
        text = passage(doc)
        chunks = chunker.chunks[text]
        document = Document.objects.create(
            collection=coll,
            source_id=f"fill-{doc['_id']}",
            content=text,
            content_hash=f"fill-{doc['_id']}",
            status=Document.Status.COMPLETED,
            chunk_count=len(chunks),
        )
        vectors = embedder.embed_documents([c.text for c in chunks])
        Chunk.objects.bulk_create(
            [
                Chunk(
                    document=document,
                    collection=coll,
                    chunk_index=i,
                    text=c.text,
                    token_count=c.token_count,
                    start_char=c.start,
                    end_char=c.end,
                    embedding=vectors[i],
                    embedding_model=embedder.model_name,
                )
                for i, c in enumerate(chunks)
            ]
        )
        total += len(chunks)
    index_chunks()
    compact_statistics()
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    return total


def check_statistics() -> str:
    stats = recount_statistics()
    return (
        "statistics match a recount" if stats["recount"] == stats["stored"] else "STATISTICS DIFFER"
    )


def timed_store(label, docs, *, many: bool, collection, chunker, embedder) -> dict:
    before = Chunk.objects.count()
    start = time.perf_counter()
    if many:
        rag.ingest_many(items(docs), collection=collection, chunker=chunker, embedder=embedder)
    else:
        for item in items(docs):
            rag.ingest(
                item.pop("text"), collection=collection, chunker=chunker, embedder=embedder, **item
            )
    seconds = time.perf_counter() - start
    chunks = Chunk.objects.count() - before
    return {"label": label, "docs": len(docs), "chunks": chunks, "seconds": seconds}


def row(result: dict, extra: str = "") -> str:
    rate = result["chunks"] / result["seconds"]
    return (
        f"| {result['label']} | {result['docs']} | {result['chunks']} | {result['seconds']:.2f} | "
        f"**{rate:,.0f}** | {extra} |"
    )


def precomputed(corpus, minilm, texts_from) -> tuple[PreChunked, Precomputed]:
    """The chunker and the embedder of the store-only runs: chunks split and vectors made
    before anything is timed (the vectors near MiniLM ones of chunks of ``texts_from``)."""
    prepared = PreChunked([passage(d) for d in corpus], minilm)
    centre_texts = [c.text for d in texts_from[:CENTRES] for c in prepared.chunks[passage(d)]]
    centres = np.asarray(
        minilm.model.encode(
            centre_texts[:CENTRES],
            batch_size=32,
            normalize_embeddings=True,
            show_progress_bar=False,
        )
    )
    return prepared, Precomputed(
        centres, [c.text for chunks in prepared.chunks.values() for c in chunks]
    )


def drop_collection(name: str) -> None:
    """Delete a collection and its documents (chunks and statistics follow)."""
    Document.objects.filter(collection__name=name).delete()
    Collection.objects.filter(name=name).delete()
    compact_statistics()


def parallel_writes(args, docs, prepared, embedder, total: int) -> dict:
    """``ingest_many`` of ``docs`` split between ``args.writers`` threads (each with its own
    connection and collection), started together: chunks/s of all of them over the wall
    time."""
    import threading

    from django.db import connections

    slices = [docs[i :: args.writers] for i in range(args.writers)]
    names = [f"writes-{os.getpid()}-writer-{i}" for i in range(args.writers)]
    barrier = threading.Barrier(args.writers + 1)
    errors = []

    def write(part, name):
        try:
            barrier.wait()
            rag.ingest_many(items(part), collection=name, chunker=prepared, embedder=embedder)
        except Exception as exc:  # reported below: a failed writer makes the figure void
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [
        threading.Thread(target=write, args=pair) for pair in zip(slices, names, strict=True)
    ]
    for thread in threads:
        thread.start()
    before = Chunk.objects.count()
    barrier.wait()
    start = time.perf_counter()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - start
    if errors:
        raise errors[0]
    chunks = Chunk.objects.count() - before
    for name in names:
        drop_collection(name)
    label = f"`ingest_many`, {args.writers} writers at once (threads), into {total:,} chunks"
    return {"label": label, "docs": len(docs), "chunks": chunks, "seconds": seconds}


def into_existing(args, corpus, minilm) -> None:
    """Issue 33 item 6: store-only writes into a table that already holds what it holds (a
    padded benchmark database), through ``ingest_many`` and ``ingest``, into a new collection
    deleted after (the deletion timed too)."""
    prepared, embedder = precomputed(corpus, minilm, corpus[-CENTRES:])
    total = Chunk.objects.count()
    print(
        f"## Store only into {total:,} chunks (precomputed vectors, "
        f"{embedder._dimensions} dims), load average "
        f"{open('/proc/loadavg').read().split()[0]} at the start\n"
    )
    print("| path | documents | chunks | seconds | chunks/s | |")
    print("|---|---|---|---|---|---|")
    # Warm-up, not timed: the first writes after the server starts read the indexes' pages.
    warm_up = f"writes-{os.getpid()}-warm-up"
    rag.ingest_many(items(corpus[-300:]), collection=warm_up, chunker=prepared, embedder=embedder)
    drop_collection(warm_up)
    runs = (
        ("`ingest_many`", True, corpus[: args.docs]),
        ("`ingest` per document", False, corpus[args.docs : args.docs + args.single_docs]),
    )
    for name, many, docs in runs:
        collection = f"writes-{os.getpid()}-{int(many)}"
        result = timed_store(
            f"{name}, into {total:,} chunks",
            docs,
            many=many,
            collection=collection,
            chunker=prepared,
            embedder=embedder,
        )
        compact_statistics()
        start = time.perf_counter()
        drop_collection(collection)
        deleted = time.perf_counter() - start
        print(row(result, f"deleted after in {deleted:.1f} s"), flush=True)
    if args.writers > 1:
        print(
            row(parallel_writes(args, corpus[: args.docs], prepared, embedder, total)), flush=True
        )
    if not args.attribute:
        return
    # What each index costs the writes: ingest_many again without it (dropped, then built
    # again, not timed).
    from benchmarks.million import GIN, HNSW
    from django_rag.conf import embedding_dimensions
    from django_rag.store.schema import _hnsw_sql

    indexes = {  # HNSW last: its pages are not cached right after it is built again
        "the GIN index": (GIN, f"CREATE INDEX {GIN} ON django_rag_chunk USING gin (search_vector)"),
        "the HNSW index": (
            HNSW,
            _hnsw_sql(
                HNSW, "embedding", embedding_dimensions(), concurrently=False, connection=connection
            ),
        ),
    }
    with connection.cursor() as cursor:
        cursor.execute("SET maintenance_work_mem = '2GB'")
        for label, (name, build) in indexes.items():
            cursor.execute(f"DROP INDEX {name}")
            collection = f"writes-{os.getpid()}-without"
            result = timed_store(
                f"`ingest_many`, into {total:,} chunks, without {label}",
                corpus[: args.docs],
                many=True,
                collection=collection,
                chunker=prepared,
                embedder=embedder,
            )
            drop_collection(collection)
            cursor.execute(build)
            print(row(result, "index built again after"), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "scifact")
    parser.add_argument("--docs", type=int, default=1200, help="documents for ingest_many")
    parser.add_argument("--single-docs", type=int, default=300, help="documents for ingest")
    parser.add_argument("--base", type=int, default=10000, help="chunks already stored (part 1)")
    parser.add_argument(
        "--encoder-docs", type=int, default=400, help="documents for part 2; 0 skips"
    )
    parser.add_argument("--skip-store", action="store_true", help="only part 2")
    parser.add_argument(
        "--into-existing",
        action="store_true",
        help="store only, into the database as it is (e.g. padded by million.py), nothing "
        "wiped; the chunks written are deleted after",
    )
    parser.add_argument(
        "--writers", type=int, default=1, help="with --into-existing: also ingest_many in N threads"
    )
    parser.add_argument(
        "--attribute",
        action="store_true",
        help="with --into-existing: ingest_many again without the HNSW index, then without the "
        "GIN index (each dropped and built again: a benchmark database only)",
    )
    args = parser.parse_args()

    call_command("migrate", verbosity=0)
    corpus = load_corpus(args.data)
    minilm = get_embedder()
    model = minilm.model  # loaded before anything is timed

    if args.into_existing:
        into_existing(args, corpus, minilm)
        return
    if not args.skip_store:
        sample = corpus[: args.docs + args.single_docs]
        rest = corpus[args.docs + args.single_docs :]
        many_docs, single_docs = sample[: args.docs], sample[args.docs :]
        prepared, embedder = precomputed(corpus, minilm, rest)
        print(
            f"## Store only (precomputed vectors near MiniLM ones, {embedder._dimensions} dims), "
            f"load average {open('/proc/loadavg').read().split()[0]} at the start\n"
        )
        print("| path | documents | chunks | seconds | chunks/s | |")
        print("|---|---|---|---|---|---|")
        results = []
        for stored in (0, args.base):
            for many, docs in ((True, many_docs), (False, single_docs)):
                wipe()
                base = fill("bench", rest, prepared, embedder, stored) if stored else 0
                name = "`ingest_many`" if many else "`ingest` per document"
                result = timed_store(
                    f"{name}, {'empty database' if not stored else f'collection holding {base:,} chunks'}",
                    docs,
                    many=many,
                    collection="bench",
                    chunker=prepared,
                    embedder=embedder,
                )
                compact_statistics()
                results.append(result)
                print(row(result, check_statistics()), flush=True)
        # Everything again: a second ingest of the same documents is all duplicates.
        result = timed_store(
            "`ingest_many`, the same documents again (all duplicates)",
            single_docs,
            many=True,
            collection="bench",
            chunker=prepared,
            embedder=embedder,
        )
        result["chunks"] = sum(len(prepared.chunks[passage(d)]) for d in single_docs)
        print(row(result, "chunks counted, not written"))
        print()

    if args.encoder_docs:
        wipe()
        docs = corpus[-args.encoder_docs :]
        # Warm the model (first batches are slower) before any timing.
        model.encode(
            [passage(d) for d in docs[:32]], batch_size=minilm.batch_size, show_progress_bar=False
        )
        chunker = get_chunker()
        texts = [c.text for d in docs for c in chunker.chunk(passage(d), embedder=minilm)]

        def encode() -> float:
            start = time.perf_counter()
            model.encode(
                texts,
                batch_size=minilm.batch_size,
                normalize_embeddings=True,
                show_progress_bar=False,
            )
            return len(texts) / (time.perf_counter() - start)

        first = encode()
        # Time spent inside the embedder's calls during ingest_many (the rest is chunking,
        # validation and the part of the writes the pipelining does not hide).
        inside = [0.0]
        embed_documents = minilm.embed_documents

        def timed_embed(batch):
            begin = time.perf_counter()
            try:
                return embed_documents(batch)
            finally:
                inside[0] += time.perf_counter() - begin

        minilm.embed_documents = timed_embed
        start = time.perf_counter()
        rag.ingest_many(items(docs), collection="encoder")
        seconds = time.perf_counter() - start
        del minilm.embed_documents
        stored = Chunk.objects.filter(collection__name="encoder").count()
        # The same documents as .txt files through the command (a directory walk).
        wipe()
        folder = Path(tempfile.mkdtemp(prefix="store_throughput_"))
        for doc in docs:
            (folder / f"{doc['_id']}.txt").write_text(passage(doc))
        start = time.perf_counter()
        call_command(
            "rag_ingest", str(folder), "--collection", "files", "--quiet", stdout=io.StringIO()
        )
        command_seconds = time.perf_counter() - start
        command_chunks = Chunk.objects.filter(collection__name="files").count()
        shutil.rmtree(folder)
        second = encode()
        assert stored == len(texts), (stored, len(texts))
        encoder = (first + second) / 2
        ingest_rate = stored / seconds
        command_rate = command_chunks / command_seconds
        print(
            f"## `ingest_many` with the bundled MiniLM against the plain encoder "
            f"({len(docs)} documents, {stored} chunks, batch size {minilm.batch_size})\n"
        )
        print("| | chunks/s |")
        print("|---|---|")
        print(
            f"| `SentenceTransformer.encode` (runs before and after: {first:.1f}, {second:.1f}) | {encoder:.1f} |"
        )
        print(
            f"| `rag.ingest_many` ({seconds:.1f} s, of which {inside[0]:.1f} s inside the "
            f"embedder's calls) | {ingest_rate:.1f} |"
        )
        print(f"| ratio | **{ingest_rate / encoder:.2f}** |")
        print(
            f"| `manage.py rag_ingest DIR` ({len(docs)} .txt files, {command_chunks} chunks, "
            f"{command_seconds:.1f} s) | {command_rate:.1f} |"
        )
        print(f"| ratio | **{command_rate / encoder:.2f}** |")
        print()
    print(f"Load average at the end: {open('/proc/loadavg').read().strip()}")


if __name__ == "__main__":
    main()
