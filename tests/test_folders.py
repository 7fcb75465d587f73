"""Folders: ``sync_folder`` / ``rag_ingest DIR --sync`` keep a collection equal to a directory,
a plain ``rag_ingest`` of an edited file replaces its document, and no walk leaves the tree it
was given (symlinks). Real files in tmp_path, real PostgreSQL, the hashing embedder."""

import os
import time
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

import django_rag as rag
from django_rag.models import Chunk, Document, SourceVersion
from django_rag.testing import HashingEmbedder

pytestmark = pytest.mark.django_db


class CountingEmbedder(HashingEmbedder):
    """Hashing vectors; remembers every text it was asked to embed."""

    def __init__(self, **options):
        super().__init__(**options)
        self.texts: list[str] = []

    def _embed(self, texts):
        self.texts.extend(texts)
        return super()._embed(texts)


def run(*args):
    out, err = StringIO(), StringIO()
    call_command(*args, stdout=out, stderr=err)
    return out.getvalue()


@pytest.fixture
def folder(tmp_path):
    root = tmp_path / "handbook"
    (root / "policies").mkdir(parents=True)
    (root / "refunds.md").write_text("# Refunds\n\nRefunds are paid within fourteen days.")
    (root / "policies" / "shipping.txt").write_text("Shipping is free over fifty euros.")
    (root / "policies" / "returns.txt").write_text("Returns are accepted for thirty days.")
    (root / "notes.xyz").write_text("no parser for this")
    return root


def files_of(root):
    """{relative path: text} of the supported files under ``root``, as the index should hold."""
    out = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and path.suffix in (".md", ".txt"):
            out[path.relative_to(root).as_posix()] = path.read_text()
    return out


def index_of(collection):
    """{source_id: content} of the collection, and the number of search hits for everything."""
    docs = Document.objects.filter(collection__name=collection)
    contents = {}
    for doc in docs:
        assert doc.source_id not in contents, f"two documents for {doc.source_id}"
        contents[doc.source_id] = doc.content
    return contents


def assert_mirrors(root, collection):
    """The collection's documents, chunks and search results are exactly the folder's files."""
    expected = files_of(root)
    stored = index_of(collection)
    assert {key: value.replace("\r", "") for key, value in stored.items()} == expected
    hits = rag.search("days euros refunds shipping returns", collection=collection, limit=50)
    assert sorted({hit.source_id for hit in hits}) == sorted(expected)
    assert Chunk.objects.filter(collection__name=collection).count() == sum(
        Document.objects.filter(collection__name=collection).values_list("chunk_count", flat=True)
    )


def test_sync_adds_replaces_skips_and_deletes_and_search_equals_the_folder(folder):
    embedder = CountingEmbedder()
    first = rag.sync_folder(folder, collection="hb", embedder=embedder)
    assert first.added == ["policies/returns.txt", "policies/shipping.txt", "refunds.md"]
    assert first.replaced == first.unchanged == first.deleted == [] and not first.failed
    assert [item.reason for item in first.skipped] == ["no parser for this file type"]
    assert_mirrors(folder, "hb")
    assert len(embedder.texts) == 3

    # Edit one, add one, delete one.
    (folder / "policies" / "shipping.txt").write_text("Shipping now takes one day, for free.")
    (folder / "warranty.md").write_text("# Warranty\n\nThe warranty lasts two years.")
    (folder / "policies" / "returns.txt").unlink()
    embedder.texts.clear()
    second = rag.sync_folder(folder, collection="hb", embedder=embedder)
    assert second.added == ["warranty.md"]
    assert second.replaced == ["policies/shipping.txt"]
    assert second.unchanged == ["refunds.md"]
    assert second.deleted == ["policies/returns.txt"]
    assert_mirrors(folder, "hb")
    # Only the edited and the new file were embedded: the unchanged one was compared by hash.
    assert len(embedder.texts) == 2
    assert any("one day" in text for text in embedder.texts)
    assert any("two years" in text for text in embedder.texts)
    # The deletion left a tombstone: an older write still queued cannot bring the file back.
    assert SourceVersion.objects.get(source_id="policies/returns.txt").deleted

    embedder.texts.clear()
    third = rag.sync_folder(folder, collection="hb", embedder=embedder)
    assert third.added == third.replaced == third.deleted == []
    assert len(third.unchanged) == 3 and embedder.texts == []


def test_dry_run_lists_the_changes_and_writes_nothing(folder):
    rag.sync_folder(folder, collection="dry")
    (folder / "refunds.md").write_text("# Refunds\n\nRefunds now take three days.")
    (folder / "new.txt").write_text("A brand new page about gift cards.")
    (folder / "policies" / "returns.txt").unlink()
    before = (
        list(Document.objects.order_by("pk").values_list("pk", "version", "content")),
        Chunk.objects.count(),
        SourceVersion.objects.count(),
    )
    embedder = CountingEmbedder()
    report = rag.sync_folder(folder, collection="dry", dry_run=True, embedder=embedder)
    assert (report.added, report.replaced, report.unchanged, report.deleted) == (
        ["new.txt"],
        ["refunds.md"],
        ["policies/shipping.txt"],
        ["policies/returns.txt"],
    )
    assert embedder.texts == []
    after = (
        list(Document.objects.order_by("pk").values_list("pk", "version", "content")),
        Chunk.objects.count(),
        SourceVersion.objects.count(),
    )
    assert after == before

    output = run("rag_ingest", str(folder), "--sync", "--dry-run", "--collection", "dry")
    assert "would add new.txt" in output and "would replace refunds.md" in output
    assert "would delete policies/returns.txt" in output and "unchanged policies/shipping.txt" in (
        output
    )
    assert output.splitlines()[-1].startswith("Dry run, nothing written:")
    assert "1 would add, 1 would replace, 1 unchanged, 1 would delete" in output
    assert (
        list(Document.objects.order_by("pk").values_list("pk", "version", "content")) == (before[0])
    )


def test_the_sync_command_mirrors_the_folder(folder):
    output = run("rag_ingest", str(folder), "--sync", "--collection", "cmd")
    assert "add refunds.md" in output and "3 added, 0 replaced, 0 unchanged, 0 deleted" in output
    (folder / "refunds.md").write_text("# Refunds\n\nRefunds now take three days.")
    (folder / "policies" / "shipping.txt").unlink()
    output = run("rag_ingest", str(folder), "--sync", "--collection", "cmd")
    assert "1 added" not in output
    assert "0 added, 1 replaced, 1 unchanged, 1 deleted" in output
    assert_mirrors(folder, "cmd")


def test_sync_with_a_prefix_leaves_the_other_documents_of_the_collection(folder):
    rag.ingest("Written through the API.", collection="mixed", source_id="api-note")
    rag.sync_folder(folder, collection="mixed", prefix="hb/")
    (folder / "refunds.md").unlink()
    report = rag.sync_folder(folder, collection="mixed", prefix="hb/")
    assert report.deleted == ["hb/refunds.md"]
    assert set(index_of("mixed")) == {
        "api-note",
        "hb/policies/returns.txt",
        "hb/policies/shipping.txt",
    }


def test_a_file_that_fails_to_parse_keeps_its_document(folder):
    rag.sync_folder(folder, collection="keep")
    (folder / "refunds.md").write_bytes(b"caf\xe9 is not UTF-8")
    report = rag.sync_folder(folder, collection="keep")
    assert list(report.failed) == ["refunds.md"] and report.deleted == []
    assert "fourteen" in index_of("keep")["refunds.md"]
    with pytest.raises(CommandError) as info:
        run("rag_ingest", str(folder), "--sync", "--collection", "keep")
    assert info.value.returncode == 1 and "refunds.md" in str(info.value)


def test_sync_argument_errors(folder):
    with pytest.raises(CommandError, match="one DIRECTORY"):
        run("rag_ingest", str(folder / "refunds.md"), "--sync")
    with pytest.raises(CommandError, match="one DIRECTORY"):
        run("rag_ingest", str(folder), str(folder / "policies"), "--sync")
    with pytest.raises(CommandError, match="--dry-run goes with --sync"):
        run("rag_ingest", str(folder), "--dry-run")
    with pytest.raises(CommandError, match="--keep-versions does not go with --sync"):
        run("rag_ingest", str(folder), "--sync", "--keep-versions")
    assert not Document.objects.exists()


# --- a plain rag_ingest of an edited file replaces it --------------------------------------


def test_re_ingesting_an_edited_file_replaces_its_document(folder, monkeypatch):
    """The getting-started command, run again after an edit, leaves one document per file
    (it used to keep both versions: search returned the old and new text as #1 and #2)."""
    monkeypatch.chdir(folder.parent)
    run("rag_ingest", "handbook/", "handbook/refunds.md", "--collection", "handbook")
    (folder / "refunds.md").write_text("# Refunds\n\nRefunds now take three days.")
    output = run("rag_ingest", "handbook/", "--collection", "handbook")
    assert "1 ingested" in output and "2 unchanged" in output
    assert_mirrors(folder, "handbook")
    hits = rag.search("refunds days", collection="handbook", limit=10)
    assert [hit.text for hit in hits if hit.source_id == "refunds.md"] == [
        "# Refunds\n\nRefunds now take three days."
    ]
    # The same directory named another way is the same identity.
    again = run("rag_ingest", str(folder) + "/", "--collection", "handbook")
    assert "3 unchanged" in again
    assert Document.objects.filter(collection__name="handbook").count() == 3


def test_keep_versions_keeps_both_and_unchanged_files_are_not_embedded(folder, monkeypatch):
    calls = []
    original = HashingEmbedder._embed

    def counting(self, texts):
        calls.extend(texts)
        return original(self, texts)

    monkeypatch.setattr(HashingEmbedder, "_embed", counting)
    path = folder / "policies" / "shipping.txt"
    run("rag_ingest", str(path), "--collection", "kv")
    calls.clear()
    run("rag_ingest", str(path), "--collection", "kv")  # unchanged: not embedded again
    assert calls == []
    path.write_text("Shipping now takes one day.")
    run("rag_ingest", str(path), "--collection", "kv", "--keep-versions")
    assert sorted(index_of_all("kv")) == [
        "Shipping is free over fifty euros.",
        "Shipping now takes one day.",
    ]
    with pytest.raises(CommandError, match="not allowed with argument"):
        run("rag_ingest", str(path), "--replace", "--keep-versions")


def index_of_all(collection):
    return list(
        Document.objects.filter(collection__name=collection).values_list("content", flat=True)
    )


def test_two_files_under_one_source_id_are_refused(tmp_path):
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "README.md").write_text(f"# Readme {name}\n\nText of {name}.")
    with pytest.raises(CommandError, match="'README.md'"):
        run("rag_ingest", str(tmp_path / "a"), str(tmp_path / "b"), "--collection", "two")
    assert not Document.objects.exists()
    run("rag_ingest", str(tmp_path / "a"), str(tmp_path / "b"), "--keep-versions")
    assert Document.objects.count() == 2


# --- symlinks never lead out of the tree ----------------------------------------------------


@pytest.fixture
def linked(tmp_path):
    """A tree with a link to a file outside it, a link to a directory outside it, a loop, a
    link to a directory inside it, a link to a file inside it and a dangling link."""
    secret = tmp_path / "outside"
    secret.mkdir()
    (secret / "passwd.txt").write_text("root:x:0:0:secret outside the tree")
    (secret / "deep").mkdir()
    (secret / "deep" / "more.txt").write_text("more secret text outside the tree")
    root = tmp_path / "tree"
    (root / "a").mkdir(parents=True)
    (root / "a" / "page.txt").write_text("A page inside the tree.")
    os.symlink(secret / "passwd.txt", root / "a" / "passwd.txt")
    os.symlink("/etc/passwd", root / "a" / "etc.txt")
    os.symlink(secret, root / "out")
    os.symlink(root, root / "a" / "loop")
    os.symlink(root / "a", root / "again")
    os.symlink(root / "a" / "page.txt", root / "latest.txt")
    os.symlink(root / "missing.txt", root / "dangling.txt")
    return root


def test_walk_folder_skips_links_that_leave_the_tree_and_loops(linked):
    from django_rag.ingestion.folders import walk_folder

    files, skipped = walk_folder(linked)
    assert [item.relative for item in files] == ["a/page.txt"]
    reasons = {item.path.relative_to(linked).as_posix(): item.reason for item in skipped}
    assert set(reasons) == {
        "a/passwd.txt",
        "a/etc.txt",
        "out",
        "a/loop",
        "again",
        "latest.txt",
        "dangling.txt",
    }
    assert reasons["a/passwd.txt"].startswith("symlink leaving")
    assert reasons["a/etc.txt"].startswith("symlink leaving")
    assert reasons["out"].startswith("symlink leaving")
    assert reasons["a/loop"].startswith("symlink to a directory inside")
    assert reasons["latest.txt"].startswith("symlink to a file inside")
    assert reasons["dangling.txt"] == "symlink that is dangling or loops"


def test_rag_ingest_does_not_follow_links_out_of_the_tree_and_reports_them(linked):
    output = run("rag_ingest", str(linked), "--collection", "links")
    contents = index_of("links")
    assert set(contents) == {"a/page.txt"}
    assert not any("secret" in text or "root:" in text for text in contents.values())
    assert f"skipped {linked / 'a' / 'passwd.txt'}: symlink leaving" in output
    assert f"skipped {linked / 'out'}: symlink leaving" in output
    assert "link(s) skipped" in output.splitlines()[-1]


def test_a_glob_does_not_follow_links_out_of_its_directory(linked):
    # glob.glob("**") follows links: through the two links back into the tree it made 2**40
    # paths (the run never ended). The walk follows none.
    started = time.process_time()
    output = run("rag_ingest", str(linked / "**" / "*.txt"), "--collection", "glob")
    assert time.process_time() - started < 20
    stored = index_of_all("glob")
    assert not any("secret" in text or "root:" in text for text in stored)
    assert "A page inside the tree." in stored
    assert "symlink leaving" in output


def test_sync_skips_links_and_deletes_a_document_a_link_brought_in_before(linked):
    # An index made before the fix holds the file a link pointed at.
    rag.ingest("root:x:0:0:secret", collection="synced", source_id="a/passwd.txt")
    report = rag.sync_folder(linked, collection="synced")
    assert set(index_of("synced")) == {"a/page.txt"}
    assert "a/passwd.txt" in report.deleted
    assert {item.path.name for item in report.skipped} >= {"passwd.txt", "etc.txt", "out"}


# --- the getting-started commands, as printed ----------------------------------------------


def getting_started_command(start: str) -> list[str]:
    """The arguments of the ``python manage.py rag_ingest ...`` line of getting-started.md that
    starts with ``start``."""
    import shlex
    from pathlib import Path

    page = Path(__file__).resolve().parent.parent / "docs" / "getting-started.md"
    (line,) = [line for line in page.read_text().splitlines() if line.startswith(start)]
    return shlex.split(line)[2:]  # after "python manage.py"


def test_the_getting_started_command_run_again_after_an_edit_leaves_one_document(
    tmp_path, monkeypatch
):
    from .test_parsers import make_pdf

    args = getting_started_command('python manage.py rag_ingest docs/ "notes/')
    monkeypatch.chdir(tmp_path)
    (tmp_path / "docs").mkdir()
    (tmp_path / "notes" / "2024").mkdir(parents=True)
    (tmp_path / "docs" / "refunds.md").write_text("# Refunds\n\nRefunds take fourteen days.")
    (tmp_path / "notes" / "2024" / "meeting.md").write_text("# Meeting\n\nWe met on Monday.")
    (tmp_path / "manual.pdf").write_bytes(make_pdf(["Press the red button."]))
    run(*args)
    (tmp_path / "docs" / "refunds.md").write_text("# Refunds\n\nRefunds now take three days.")
    (tmp_path / "notes" / "2024" / "meeting.md").write_text("# Meeting\n\nWe met on Friday.")
    output = run(*args)
    assert "2 ingested" in output and "1 unchanged" in output
    stored = index_of("handbook")
    assert len(stored) == 3
    assert stored["refunds.md"] == "# Refunds\n\nRefunds now take three days."
    assert stored["notes/2024/meeting.md"] == "# Meeting\n\nWe met on Friday."
    hits = rag.search("refunds meeting days", collection="handbook", limit=10)
    assert not any("fourteen" in hit.text or "Monday" in hit.text for hit in hits)

    sync = getting_started_command("python manage.py rag_ingest docs/ --sync")
    run(*sync)
    (tmp_path / "docs" / "faq.md").write_text("# FAQ\n\nAsk us anything.")
    (tmp_path / "docs" / "refunds.md").unlink()
    run(*sync)
    assert set(index_of("docs")) == {"faq.md"}
    assert len(index_of("handbook")) == 3  # the other collection is not the folder's


def test_glob_patterns_match_like_glob_without_following_links(tmp_path):
    from django_rag.ingestion.folders import glob_files

    root = tmp_path / "g"
    (root / "sub" / "deeper").mkdir(parents=True)
    (root / ".hidden").mkdir()
    for name in ("top.txt", "top.md", "sub/a.txt", "sub/deeper/b.txt", ".hidden/c.txt"):
        (root / name).write_text(name)
    os.symlink(tmp_path, root / "sub" / "up")

    def names(pattern):
        found, skipped = glob_files(str(root / pattern))
        return (
            sorted((item.path.relative_to(root).as_posix(), named) for item, named in found),
            sorted(item.path.name for item in skipped),
        )

    assert names("*.txt") == ([("top.txt", True)], [])
    assert names("**/*.txt") == (
        [("sub/a.txt", True), ("sub/deeper/b.txt", True), ("top.txt", True)],
        ["up"],
    )
    assert names("s*/*/*.txt") == ([("sub/deeper/b.txt", True)], [])
    # A directory the pattern matches stands for the files under it (as rag_ingest walks it).
    assert names("su?") == (
        [("sub/a.txt", False), ("sub/deeper/b.txt", False)],
        ["up"],
    )
    assert names(".hidden/*.txt") == ([(".hidden/c.txt", True)], [])
    assert names("**/**/**/**/**/**/**/**/nothing.txt") == ([], ["up"])


def test_sync_folder_reports_through_telemetry(folder, events):
    from django_rag.telemetry.logging import DETAILS

    rag.sync_folder(folder, collection="tel")
    (stop,) = [meta for kind, event, meta in events if event == "sync_folder" and kind == "stop"]
    assert (stop["added"], stop["deleted"], stop["collection"]) == (3, 0, "tel")
    assert DETAILS["sync_folder"](stop) == "3 added, 0 replaced, 0 unchanged, 0 deleted"
