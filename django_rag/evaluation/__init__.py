"""Evaluation: test cases, runs, retrieval metrics, answer judging and BEIR import."""

from __future__ import annotations

from .beir import import_beir
from .cases import (
    Generated,
    count_test_cases,
    create_test_case,
    delete_test_case,
    generate_test_cases,
    get_test_case,
    list_test_cases,
)
from .metrics import (
    KS,
    METRIC_NAMES,
    aggregate,
    bootstrap_interval,
    case_metrics,
    ndcg,
    paired_difference,
)
from .runs import NoTestCases, compare_runs, delete_run, get_run, list_runs, run_evaluation

__all__ = [
    "KS",
    "METRIC_NAMES",
    "Generated",
    "NoTestCases",
    "aggregate",
    "bootstrap_interval",
    "case_metrics",
    "compare_runs",
    "count_test_cases",
    "create_test_case",
    "delete_run",
    "delete_test_case",
    "generate_test_cases",
    "get_run",
    "get_test_case",
    "import_beir",
    "list_runs",
    "list_test_cases",
    "ndcg",
    "paired_difference",
    "run_evaluation",
]
