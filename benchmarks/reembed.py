"""Re-embedding throughput against the plain encoder, measured in the same run.

Uses the SciFact chunks stored by benchmarks/beir.py (run it first) and re-embeds every chunk
with `maintenance.reembed(all=True)`: the zero-downtime path (shadow column, HNSW build, swap).

    python benchmarks/reembed.py [--sample 2000] [--batch-size 64]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402

from django_rag import maintenance  # noqa: E402
from django_rag.embeddings import get_embedder  # noqa: E402
from django_rag.models import Chunk  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sample", type=int, default=2000, help="chunks for the encoder run")
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()
    call_command("migrate", verbosity=0)
    total = Chunk.objects.count()
    if not total:
        sys.exit("No chunks: run benchmarks/beir.py first.")
    embedder = get_embedder()
    texts = list(Chunk.objects.order_by("?").values_list("text", flat=True)[: args.sample])
    embedder.embed_documents(texts[:32])  # load the model
    start = time.perf_counter()
    embedder.model.encode(texts, batch_size=32, normalize_embeddings=True, show_progress_bar=False)
    encoder = len(texts) / (time.perf_counter() - start)
    start = time.perf_counter()
    job = maintenance.reembed(all=True, batch_size=args.batch_size)
    seconds = time.perf_counter() - start
    rate = job.done / seconds
    print(f"chunks: {total}, re-embedded: {job.done} in {seconds:.1f} s")
    print(f"plain encoder: {encoder:.1f} chunks/s (sample {len(texts)}, batch 32)")
    print(f"re-embed (all=True, batch {args.batch_size}): {rate:.1f} chunks/s")
    print(f"ratio: {rate / encoder:.2f}")


if __name__ == "__main__":
    main()
