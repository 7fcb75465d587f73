"""Evaluation: test cases, runs, retrieval metrics, answer judging and BEIR import."""

from __future__ import annotations

from .beir import import_beir
from .cases import Generated, create_test_case, generate_test_cases
from .metrics import (
    KS,
    METRIC_NAMES,
    aggregate,
    bootstrap_interval,
    case_metrics,
    ndcg,
    paired_difference,
)
from .runs import NoTestCases, compare_runs, run_evaluation

__all__ = [
    "KS",
    "METRIC_NAMES",
    "Generated",
    "NoTestCases",
    "aggregate",
    "bootstrap_interval",
    "case_metrics",
    "compare_runs",
    "create_test_case",
    "generate_test_cases",
    "import_beir",
    "ndcg",
    "paired_difference",
    "run_evaluation",
]
