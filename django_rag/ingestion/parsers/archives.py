"""Reading ZIP-based files (DOCX, XLSX, ODT, EPUB...) without inflating a bomb.

A ZIP's central directory declares each member's compressed and uncompressed size. Python's
:mod:`zipfile` never returns more than the declared size of a member (a member inflating past
it fails its CRC check instead), so checking the declared sizes before anything is inflated
bounds what extraction produces: :func:`open_zip` refuses an archive whose members add up to
more than ``MAX_ZIP_UNCOMPRESSED_BYTES``, a large member whose size is more than
``MAX_ZIP_RATIO`` times its compressed size, or more than ``MAX_ZIP_MEMBERS`` members (counted
from the directory's size before its entries are read). A parser for such a format opens its
input through :func:`open_zip` and reads members with :func:`read_member`::

    class DocxParser(Parser):
        def parse(self, data, *, filename):
            with open_zip(data, filename=filename) as archive:
                xml = read_member(archive, "word/document.xml", filename=filename)
            ...
"""

from __future__ import annotations

import io
import struct
import zipfile

from ...exceptions import CorruptFile, DocumentTooLarge
from .base import _limit

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


def open_zip(data: bytes, *, filename: str) -> zipfile.ZipFile:
    """Open ``data`` as a ZIP once its central directory is within the budgets.

    Raises :class:`CorruptFile` for a file that is not a readable ZIP and
    :class:`DocumentTooLarge` for one over ``MAX_ZIP_MEMBERS``, ``MAX_ZIP_UNCOMPRESSED_BYTES``
    or ``MAX_ZIP_RATIO``; nothing is inflated before the checks pass.
    """
    max_members = _limit("MAX_ZIP_MEMBERS")
    max_bytes = _limit("MAX_ZIP_UNCOMPRESSED_BYTES")
    max_ratio = _limit("MAX_ZIP_RATIO", integer=False)
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
        if max_bytes is not None and total > max_bytes:
            raise _too_large(
                filename,
                f"inflates to {total:,} bytes ({max_bytes:,} at most)",
                "MAX_ZIP_UNCOMPRESSED_BYTES",
                size=total,
                limit=max_bytes,
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


def read_member(archive: zipfile.ZipFile, name: str, *, filename: str) -> bytes:
    """The bytes of member ``name`` (at most its declared size, which :func:`open_zip`
    checked); :class:`CorruptFile` when it is missing or damaged."""
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
        # A CRC mismatch (a member inflating past its declared size), an unknown method...
        raise CorruptFile(
            f"{filename}: its member {name!r} could not be read ({exc}); the file is damaged.",
            filename=filename,
            member=name,
        ) from exc
