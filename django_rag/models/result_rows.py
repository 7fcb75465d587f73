"""Search result rows: the chunk, document and collection columns a search reads in one
statement, and the :class:`~django_rag.results.SearchResult` made from such a row."""

from __future__ import annotations

import json
from collections.abc import Sequence

from ..results import SearchResult

# Columns of a with_result_columns() row before its extra ones.
RESULT_COLUMNS = 15


def _json(value):
    return json.loads(value) if isinstance(value, str | bytes) else (value or {})


def with_result_columns(model, ranked_sql: str, extra: Sequence[str] = ()) -> str:
    """``ranked_sql`` (rows ``pk, distance``, then one column per name in ``extra``) joined
    to the chunk, document and collection columns a search result needs, in the same order;
    the ``extra`` columns come last."""
    chunk = model._meta
    document = chunk.get_field("document").related_model._meta
    collection = chunk.get_field("collection").related_model._meta

    def column(meta, alias, name):
        return f'{alias}."{meta.get_field(name).column}"'

    fields = [
        column(chunk, "c", "text"),
        column(chunk, "c", "document"),
        column(chunk, "c", "chunk_index"),
        column(collection, "col", "name"),
        column(document, "d", "source_id"),
        column(document, "d", "title"),
        column(document, "d", "original_filename"),
        column(chunk, "c", "page_start"),
        column(chunk, "c", "page_end"),
        column(chunk, "c", "start_char"),
        column(chunk, "c", "end_char"),
        column(document, "d", "metadata"),
        column(chunk, "c", "metadata"),
    ]
    fields += [f"hits.{name}" for name in extra]
    return (
        f"SELECT hits.pk, hits.distance, {', '.join(fields)} "
        f"FROM ({ranked_sql}) AS hits ({', '.join(['pk', 'distance', *extra])}) "
        f'JOIN "{chunk.db_table}" c ON c."{chunk.pk.column}" = hits.pk '
        f'JOIN "{document.db_table}" d ON d."{document.pk.column}" = '
        f"{column(chunk, 'c', 'document')} "
        f'JOIN "{collection.db_table}" col ON col."{collection.pk.column}" = '
        f"{column(chunk, 'c', 'collection')} "
        "ORDER BY hits.distance, hits.pk"
    )


def result_from_row(row, **scores) -> SearchResult:
    """A :class:`SearchResult` from a row of :func:`with_result_columns` (its second column,
    the ranking's own value, and any extra columns are not used) and the scores to give it."""
    (pk, _, text, document_id, chunk_index, collection, source_id, title, filename,
     page_start, page_end, start_char, end_char, document_metadata,
     chunk_metadata) = row[:RESULT_COLUMNS]  # fmt: skip
    return SearchResult(
        chunk_id=pk,
        text=text,
        document_id=document_id,
        chunk_index=chunk_index,
        collection=collection,
        source_id=source_id,
        title=title,
        filename=filename,
        page_start=page_start,
        page_end=page_end,
        start_char=start_char,
        end_char=end_char,
        metadata={**_json(document_metadata), **_json(chunk_metadata)},
        **scores,
    )
