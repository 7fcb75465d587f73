"""Retrieval metrics: Recall, Precision, Hit rate at K, MRR and graded nDCG@10, and bootstrap
intervals for a mean and for a paired difference between two rankings of the same queries."""

from __future__ import annotations

import math
import random
from collections.abc import Hashable, Mapping, Sequence
from statistics import fmean
from typing import Any

KS = (1, 3, 5, 10)
METRIC_NAMES = (
    *(f"recall_at_{k}" for k in KS),
    *(f"precision_at_{k}" for k in KS),
    *(f"hit_rate_at_{k}" for k in KS),
    "mrr",
    "ndcg_at_10",
)


def ndcg(ranked: Sequence[Hashable], relevant: Mapping[Hashable, int], k: int = 10) -> float:
    """nDCG@k with linear gains (the grade), as trec_eval and BEIR compute it."""
    dcg = sum(relevant.get(item, 0) / math.log2(i + 2) for i, item in enumerate(ranked[:k]))
    ideal = sorted(relevant.values(), reverse=True)[:k]
    idcg = sum(grade / math.log2(i + 2) for i, grade in enumerate(ideal))
    return dcg / idcg if idcg else 0.0


def case_metrics(retrieved: Sequence[Hashable], relevant: Mapping[Hashable, int]) -> dict[str, Any]:
    """Metrics of one test case. ``retrieved`` is in rank order (repeats are ignored);
    ``relevant`` maps each relevant id to its grade (>= 1).

    Recall@K = relevant ids in the top K / all relevant ids; Precision@K = relevant ids in the
    top K / K (even when fewer than K were retrieved); Hit@K = any relevant id in the top K;
    reciprocal rank = 1 / rank of the first relevant id (0 when none).
    """
    ranked = list(dict.fromkeys(retrieved))
    expected = {item for item, grade in relevant.items() if grade > 0}
    first = next((i + 1 for i, item in enumerate(ranked) if item in expected), None)
    out: dict[str, Any] = {}
    for k in KS:
        found = len(set(ranked[:k]) & expected)
        out[f"recall_at_{k}"] = found / len(expected) if expected else 0.0
        out[f"precision_at_{k}"] = found / k
        out[f"hit_rate_at_{k}"] = 1.0 if found else 0.0
    out["mrr"] = 1.0 / first if first else 0.0
    out["ndcg_at_10"] = ndcg(ranked, {item: relevant[item] for item in expected})
    out["first_relevant_rank"] = first
    return out


def aggregate(cases: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Means over the cases (hit rate = share of cases with a hit); zeros when there are none."""
    summary = {name: fmean(c[name] for c in cases) if cases else 0.0 for name in METRIC_NAMES}
    summary["test_case_count"] = len(cases)
    return summary


def bootstrap_interval(
    values: Sequence[float], *, resamples: int = 2000, confidence: float = 0.95, seed: int = 13
) -> tuple[float, float, float]:
    """``(mean, low, high)``: the mean of ``values`` and a percentile bootstrap interval for it
    (queries resampled with replacement; seeded, so a report is reproducible)."""
    if not values:
        raise ValueError("bootstrap_interval needs at least one value")
    rng = random.Random(seed)
    n = len(values)
    means = sorted(fmean(rng.choices(values, k=n)) for _ in range(resamples))
    tail = (1 - confidence) / 2
    low = means[int(tail * resamples)]
    high = means[min(resamples - 1, int((1 - tail) * resamples))]
    return fmean(values), low, high


def paired_difference(
    first: Sequence[float], second: Sequence[float], **options: Any
) -> tuple[float, float, float]:
    """``second - first`` per query (the same queries, in the same order), averaged, with its
    bootstrap interval: an interval that excludes 0 is a difference beyond noise."""
    if len(first) != len(second):
        raise ValueError("paired_difference needs the same queries on both sides")
    return bootstrap_interval([b - a for a, b in zip(first, second, strict=True)], **options)
