"""The text around a hit: a window of the chunks next to it in its document.

A hit is one chunk cut from its neighbours: the sentence before it or the heading above it is
lost to whoever reads it (a person, or the LLM that answers from it). With
``context_window=k`` every hit comes back with ``context``: the text of chunks
``chunk_index - k`` .. ``chunk_index + k`` of the same document (fewer at the document's start
or end).

Windows of one document that overlap (two hits close together, or a hit that is a neighbour of
another) are merged into one result, the best-ranked of them, so no text is returned twice;
the others' ids are listed in its ``merged_chunk_ids`` and they leave the list (a search may
then return fewer than ``limit`` results). Windows that only touch stay apart.

The neighbours of every hit are read in one query. Where the chunks carry character offsets
(the built-in chunker's always do), the window is cut from the document's text between the
first chunk's start and the last chunk's end, so the overlap between consecutive chunks is
not repeated; otherwise the chunks' texts are joined with a blank line.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.db import connections

from ..models import Chunk, Document
from ..results import SearchResult

#: The widest window (chunks each side): 2 x 10 + 1 chunks of text per hit at most.
MAX_CONTEXT_WINDOW = 10


def _spans(results: Sequence[SearchResult], window: int) -> list[tuple[int, int, int, list[int]]]:
    """Merged windows ``(document_id, first, last, ranks)``, ranks in rank order.

    Each hit's window is ``[index - window, index + window]``; windows of one document that
    overlap are merged (sorted by their start, a sweep: linear after the sort)."""
    by_document: dict[int, list[tuple[int, int, int]]] = {}
    for rank, result in enumerate(results):
        if result.document_id is None or result.chunk_index is None:
            continue
        index = result.chunk_index
        by_document.setdefault(result.document_id, []).append(
            (max(0, index - window), index + window, rank)
        )
    spans = []
    for document_id, windows in by_document.items():
        windows.sort()
        first, last, ranks = windows[0][0], windows[0][1], [windows[0][2]]
        for start, end, rank in windows[1:]:
            if start <= last:  # overlapping: one window
                last = max(last, end)
                ranks.append(rank)
            else:
                spans.append((document_id, first, last, sorted(ranks)))
                first, last, ranks = start, end, [rank]
        spans.append((document_id, first, last, sorted(ranks)))
    return spans


def _window_texts(
    spans: Sequence[tuple[int, int, int, list[int]]], using: str
) -> dict[int, tuple[str, int, int]]:
    """``{span number: (text, first chunk index, last chunk index)}``, in one query."""
    if not spans:
        return {}
    chunk_table = connections[using].ops.quote_name(Chunk._meta.db_table)
    document_table = connections[using].ops.quote_name(Document._meta.db_table)
    sql = f"""
        WITH windows AS (
            SELECT s.n, min(c.chunk_index) AS first_index, max(c.chunk_index) AS last_index,
                   min(c.start_char) AS first_char, max(c.end_char) AS last_char,
                   count(*) = count(c.start_char) AND count(*) = count(c.end_char) AS offsets,
                   s.document_id
            FROM unnest(%s::integer[], %s::bigint[], %s::integer[], %s::integer[])
                 AS s(n, document_id, lo, hi)
            JOIN {chunk_table} c
              ON c.document_id = s.document_id AND c.chunk_index BETWEEN s.lo AND s.hi
            GROUP BY s.n, s.document_id
        )
        SELECT w.n, w.first_index, w.last_index,
               CASE WHEN w.offsets AND w.last_char >= w.first_char
                    THEN substring(d.content FROM w.first_char + 1 FOR w.last_char - w.first_char)
                    ELSE (SELECT string_agg(c.text, E'\\n\\n' ORDER BY c.chunk_index)
                          FROM {chunk_table} c
                          WHERE c.document_id = w.document_id
                            AND c.chunk_index BETWEEN w.first_index AND w.last_index)
               END
        FROM windows w JOIN {document_table} d ON d.id = w.document_id
    """
    params = [
        list(range(len(spans))),
        [span[0] for span in spans],
        [span[1] for span in spans],
        [span[2] for span in spans],
    ]
    with connections[using].cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    return {n: (text or "", first, last) for n, first, last, text in rows}


def with_context(
    results: list[SearchResult], window: int, *, using: str = "default"
) -> list[SearchResult]:
    """``results`` with ``context`` set to each hit's window of ``window`` chunks each side,
    overlapping windows of one document merged into the best-ranked hit (see the module's
    docstring). The order of the results is kept; ``window`` 0 returns them unchanged."""
    if window <= 0 or not results:
        return results
    spans = _spans(results, window)
    texts = _window_texts(spans, using)
    folded: set[int] = set()
    for number, (_document_id, _first, _last, ranks) in enumerate(spans):
        found = texts.get(number)
        if found is None:  # the document was deleted meanwhile: the hit keeps its own text
            continue
        text, first, last = found
        leader = results[ranks[0]]
        leader.context = text
        leader.context_first = first
        leader.context_last = last
        leader.merged_chunk_ids = [results[rank].chunk_id for rank in ranks[1:]]
        folded.update(ranks[1:])
    return [result for rank, result in enumerate(results) if rank not in folded]
