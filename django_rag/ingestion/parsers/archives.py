"""Reading ZIP-based files (DOCX, XLSX, PPTX, ODT, EPUB...) without inflating a bomb.

A ZIP's central directory declares each member's sizes, and nothing makes it tell the truth:
Python's :mod:`zipfile` asked for a whole member inflates up to 2 GiB of it in one call before
cutting it to the declared size (and passes the CRC check when the CRC is that of the cut
bytes). So archives are measured by what they inflate:

* :func:`verified_zip` first checks the directory (``MAX_ZIP_MEMBERS``, the declared total
  against ``MAX_ZIP_UNCOMPRESSED_BYTES``, ``MAX_ZIP_RATIO``: cheap refusals of honest bombs),
  then inflates every member once, in 64 KiB steps, counting the bytes that come out. A member
  is stopped one byte past its declared size (:class:`DocumentTooLarge`: the archive lies) or
  past what is left of the parse's budget (``MAX_ZIP_UNCOMPRESSED_BYTES``, shared by every
  archive one parse opens: an email's attachments, an attached email's); its CRC is checked.
  The verified members are written, uncompressed (``ZIP_STORED``), into a new in-memory ZIP.
* That re-packed archive is the only one anything else reads: :func:`open_zip` opens it for
  our parsers, and python-docx, openpyxl and python-pptx are handed it instead of the upload.
  Reading a stored member returns the bytes that were written, no more, so no library can
  inflate anything: memory is bounded by what was counted, whatever any header says.

A parser for such a format opens its input through :func:`open_zip` and reads members with
:func:`read_member`::

    class OdtParser(Parser):
        def parse(self, data, *, filename):
            with open_zip(data, filename=filename) as archive:
                xml = read_member(archive, "content.xml", filename=filename)
            ...
"""

from __future__ import annotations

import contextlib
import contextvars
import io
import struct
import zipfile
import zlib
from collections.abc import Iterator

from ...exceptions import CorruptFile, DocumentTooLarge
from .base import budget_setting

_END_OF_DIRECTORY = b"PK\x05\x06"
_SMALLEST_ENTRY = 46  # bytes of a central directory entry with an empty name
# Members smaller than this are not checked for their ratio: however well they compress,
# they cannot cost much (and tiny XML parts often compress 100 times).
RATIO_CHECKED_FROM = 1024 * 1024


def _too_large(filename: str, what: str, setting: str, **details) -> DocumentTooLarge:
    return DocumentTooLarge(
        f"{filename} {what}, more than {setting} allows, so nothing was extracted (it looks "
        f"like a compression bomb). If the file is genuine, raise DJANGO_RAG['{setting}'].",
        filename=filename,
        setting=setting,
        **details,
    )


# Inflated in steps of this many bytes at most: zlib is never asked for more at once.
_STEP = 64 * 1024
_LOCAL_HEADER = struct.Struct("<4s2B4HL2L2H")  # zipfile's structFileHeader: 30 bytes
_LOCAL_SIGNATURE = b"PK\x03\x04"


class InflationBudget:
    """The bytes archives may still inflate during one parse (``MAX_ZIP_UNCOMPRESSED_BYTES``;
    ``limit`` None: no limit), and how many they have inflated so far."""

    def __init__(self, limit: int | None):
        self.limit = limit
        self.inflated = 0

    def left(self) -> int | None:
        return None if self.limit is None else self.limit - self.inflated


_BUDGET: contextvars.ContextVar[InflationBudget | None] = contextvars.ContextVar(
    "django_rag_inflation_budget", default=None
)


@contextlib.contextmanager
def inflation_budget() -> Iterator[InflationBudget]:
    """The budget of the parse under way, else a new one held until the block ends: every
    archive opened inside it, at any depth (an email's attachments, an attached email's
    attachments), inflates from the same ``MAX_ZIP_UNCOMPRESSED_BYTES``. ``parse_bytes``
    holds one around each parse."""
    current = _BUDGET.get()
    if current is not None:
        yield current
        return
    budget = InflationBudget(budget_setting("MAX_ZIP_UNCOMPRESSED_BYTES"))
    token = _BUDGET.set(budget)
    try:
        yield budget
    finally:
        _BUDGET.reset(token)


def _checked_directory(data: bytes, filename: str, budget: InflationBudget) -> zipfile.ZipFile:
    """``data`` opened as a ZIP once its central directory is within the budgets (what it
    declares: cheap refusals of the honest bombs; nothing is inflated here)."""
    max_members = budget_setting("MAX_ZIP_MEMBERS")
    max_ratio = budget_setting("MAX_ZIP_RATIO", integer=False)
    end = data.rfind(_END_OF_DIRECTORY, max(0, len(data) - 65_557))
    if end < 0 or len(data) < end + 22:
        raise CorruptFile(
            f"{filename} is not a ZIP archive (no end of central directory); check the file "
            "or its extension.",
            filename=filename,
        )
    (directory_size,) = struct.unpack("<I", data[end + 12 : end + 16])
    if max_members is not None and directory_size > max_members * (_SMALLEST_ENTRY + 1024):
        # Checked before zipfile reads the directory: each entry becomes a Python object.
        raise _too_large(
            filename,
            f"has a {directory_size:,}-byte central directory (room for more than "
            f"{max_members:,} members)",
            "MAX_ZIP_MEMBERS",
            limit=max_members,
        )
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        members = archive.infolist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, EOFError) as exc:
        raise CorruptFile(
            f"{filename} is not a readable ZIP archive ({exc}); it may be truncated or damaged.",
            filename=filename,
        ) from exc
    try:
        if max_members is not None and len(members) > max_members:
            raise _too_large(
                filename,
                f"has {len(members):,} members",
                "MAX_ZIP_MEMBERS",
                members=len(members),
                limit=max_members,
            )
        total = sum(member.file_size for member in members)
        left = budget.left()
        if left is not None and total > left:
            spent = f", {budget.inflated:,} of them spent by this parse already" * bool(
                budget.inflated
            )
            raise _too_large(
                filename,
                f"declares {total:,} bytes once inflated ({budget.limit:,} at most{spent})",
                "MAX_ZIP_UNCOMPRESSED_BYTES",
                size=total,
                limit=budget.limit,
            )
        for member in members:
            ratio = member.file_size / max(member.compress_size, 1)
            if max_ratio is not None and member.file_size >= RATIO_CHECKED_FROM:
                if ratio > max_ratio:
                    raise _too_large(
                        filename,
                        f"has a member ({member.filename[:200]!r}) that inflates "
                        f"{ratio:,.0f} times ({member.compress_size:,} to "
                        f"{member.file_size:,} bytes; {max_ratio:g} at most)",
                        "MAX_ZIP_RATIO",
                        member=member.filename[:200],
                        ratio=ratio,
                        limit=max_ratio,
                    )
    except BaseException:
        archive.close()
        raise
    return archive


def _damaged(filename: str, name: str, problem: str) -> CorruptFile:
    return CorruptFile(
        f"{filename}: its member {name[:200]!r} could not be read ({problem}); the file is "
        "damaged.",
        filename=filename,
        member=name[:200],
    )


def _inflate(
    data: bytes, info: zipfile.ZipInfo, *, filename: str, budget: InflationBudget
) -> Iterator[bytes]:
    """Member ``info``'s content, in pieces of at most 64 KiB, inflated from the compressed
    bytes the directory points at (as zipfile finds them). Stops one byte past the declared
    size or past what is left of the budget, whichever is smaller: at most that many bytes
    are ever inflated, whatever the member holds."""
    name = info.filename
    if info.flag_bits & 0x1:
        raise _damaged(filename, name, "it is encrypted")
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        raise _damaged(
            filename,
            name,
            f"compression method {info.compress_type}; only stored and deflated members are read",
        )
    at = info.header_offset
    header = data[at : at + _LOCAL_HEADER.size]
    if len(header) != _LOCAL_HEADER.size or header[:4] != _LOCAL_SIGNATURE:
        raise _damaged(filename, name, "no local header where the directory points")
    fields = _LOCAL_HEADER.unpack(header)
    start = at + _LOCAL_HEADER.size + fields[-2] + fields[-1]  # name and extra field lengths
    compressed = memoryview(data)[start : start + info.compress_size]
    if len(compressed) != info.compress_size:
        raise _damaged(filename, name, "it is cut short")
    left = budget.left()
    cap = info.file_size if left is None else min(info.file_size, left)

    def past_cap(produced: int) -> DocumentTooLarge:
        if produced > info.file_size:
            return DocumentTooLarge(
                f"{filename}: its member {name[:200]!r} inflates past the {info.file_size:,} "
                "bytes the archive declares for it, so nothing was extracted (a ZIP that "
                "understates its sizes is a compression bomb, or damaged). Re-create the file "
                "with the program that made it.",
                filename=filename,
                member=name[:200],
                declared=info.file_size,
            )
        return _too_large(
            filename,
            f"inflates to more than {budget.limit:,} bytes (member {name[:200]!r})",
            "MAX_ZIP_UNCOMPRESSED_BYTES",
            member=name[:200],
            limit=budget.limit,
        )

    if info.compress_type == zipfile.ZIP_STORED:
        if len(compressed) > cap:
            raise past_cap(len(compressed))
        for offset in range(0, len(compressed), _STEP):
            yield bytes(compressed[offset : offset + _STEP])
        return
    inflater = zlib.decompressobj(-zlib.MAX_WBITS)
    produced = position = 0
    pending: bytes | memoryview = b""
    while not inflater.eof:
        if not pending and position < len(compressed):
            pending = compressed[position : position + _STEP]
            position += _STEP
        try:
            # Never 0: zlib takes a max_length of 0 as "no limit".
            piece = inflater.decompress(pending, min(_STEP, cap - produced + 1))
        except zlib.error as exc:
            raise _damaged(filename, name, str(exc)) from exc
        pending = inflater.unconsumed_tail
        produced += len(piece)
        if produced > cap:
            raise past_cap(produced)
        if not piece and not pending and position >= len(compressed) and not inflater.eof:
            raise _damaged(filename, name, "its compressed data ends too soon")
        if piece:
            yield piece


def verified_zip(data: bytes, *, filename: str) -> bytes:
    """``data`` re-packed: every member inflated once through the counting reader, its CRC
    checked, and stored uncompressed in a new ZIP, which is what libraries are handed.

    Raises :class:`CorruptFile` for a file that is not a readable ZIP (or has a damaged,
    encrypted or twice-named member) and :class:`DocumentTooLarge` for one over
    ``MAX_ZIP_MEMBERS``, ``MAX_ZIP_UNCOMPRESSED_BYTES`` (declared, then inflated, shared by
    the whole parse) or ``MAX_ZIP_RATIO``, or with a member inflating past its declared size.
    Reading a member of the result inflates nothing: it returns the bytes that were counted.
    """
    with inflation_budget() as budget:
        source = _checked_directory(data, filename, budget)
        buffer = io.BytesIO()
        with source, zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as target:
            names: set[str] = set()
            for info in source.infolist():
                if info.filename in names:
                    # Readers disagree on which of the two counts: a way to smuggle content.
                    raise _damaged(filename, info.filename, "the archive names it twice")
                names.add(info.filename)
                entry = zipfile.ZipInfo(info.filename, info.date_time)
                entry.external_attr = info.external_attr
                entry.file_size = info.file_size  # an upper bound: chooses ZIP64 if needed
                crc = 0
                with target.open(entry, "w") as sink:
                    for piece in _inflate(data, info, filename=filename, budget=budget):
                        budget.inflated += len(piece)
                        crc = zlib.crc32(piece, crc)
                        sink.write(piece)
                if crc != info.CRC:
                    raise _damaged(filename, info.filename, "its CRC-32 does not match")
        return buffer.getvalue()


def open_zip(data: bytes, *, filename: str) -> zipfile.ZipFile:
    """Open ``data`` as a ZIP once every member has been inflated within the budgets
    (:func:`verified_zip`): the archive returned is the verified copy, whose members are stored,
    so reading one inflates nothing.

    Raises :class:`CorruptFile` for a file that is not a readable ZIP and
    :class:`DocumentTooLarge` for one over ``MAX_ZIP_MEMBERS``, ``MAX_ZIP_UNCOMPRESSED_BYTES``
    or ``MAX_ZIP_RATIO``, or with a member that inflates past its declared size.
    """
    return zipfile.ZipFile(io.BytesIO(verified_zip(data, filename=filename)))


def read_member(archive: zipfile.ZipFile, name: str, *, filename: str) -> bytes:
    """The bytes of member ``name`` of an archive :func:`open_zip` returned (stored, counted:
    reading it inflates nothing); :class:`CorruptFile` when it is missing or damaged."""
    try:
        with archive.open(name) as member:
            return member.read()
    except KeyError as exc:
        raise CorruptFile(
            f"{filename} has no {name!r}: it is not the kind of file its extension says.",
            filename=filename,
            member=name,
        ) from exc
    except (zipfile.BadZipFile, NotImplementedError, ValueError, EOFError, OSError) as exc:
        raise CorruptFile(
            f"{filename}: its member {name!r} could not be read ({exc}); the file is damaged.",
            filename=filename,
            member=name,
        ) from exc
