"""Full-text query parsing and BM25 (moved to :mod:`django_rag.models.fulltext`, beside the
statistics they read; the chunk search vectors are written by :mod:`django_rag.store`)."""

from ..models.fulltext import (  # noqa: F401
    FulltextQuery,
    TermWeights,
    bm25_sql,
    parse_query,
    quote_terms,
    split_query,
    term_weights,
)
from ..store.statistics import index_chunks, search_vectors  # noqa: F401
