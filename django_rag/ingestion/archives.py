"""Reading ZIP-based files without inflating a bomb: see
:mod:`django_rag.ingestion.parsers.archives` (kept here so existing imports keep working)."""

from .parsers.archives import (
    RATIO_CHECKED_FROM,
    InflationBudget,
    inflation_budget,
    open_zip,
    read_member,
    verified_zip,
)

__all__ = [
    "RATIO_CHECKED_FROM",
    "InflationBudget",
    "inflation_budget",
    "open_zip",
    "read_member",
    "verified_zip",
]
