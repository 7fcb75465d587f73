"""Size and duplication rules held by CI (docs/architecture.md, "Size rules"): no module over 500
lines and no function over 80 lines unless docs/architecture.md lists it with its reason, no
listed exception that no longer needs listing, and no exact repeat of six lines of code inside
``ingestion/`` or ``retrieval/`` (what should be one function, written twice)."""

import ast
import collections
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "django_rag"
ARCHITECTURE = PACKAGE.parent / "docs" / "architecture.md"
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80
DUPLICATE_LINES = 6


def _listed(heading: str) -> dict[str, str]:
    """The rows of the table under ``heading`` in docs/architecture.md: name -> reason."""
    text = ARCHITECTURE.read_text()
    section = text.split(heading, 1)[1].split("\n#", 1)[0]
    rows = re.findall(r"^\| `([^`]+)` \| [\d,]+ \| (.*?) \|$", section, re.M)
    return {name: why.strip() for name, why in rows}


def _sources():
    for path in sorted(PACKAGE.rglob("*.py")):
        if "migrations" not in path.parts:
            yield path.relative_to(PACKAGE).as_posix(), path.read_text()


def _oversized() -> tuple[dict[str, int], dict[str, int]]:
    modules, functions = {}, {}
    for name, text in _sources():
        lines = len(text.splitlines())
        if lines > MAX_MODULE_LINES:
            modules[name] = lines
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    functions[f"{name}::{node.name}"] = length
    return modules, functions


def test_every_module_over_500_lines_is_listed_with_its_reason():
    modules, _ = _oversized()
    listed = _listed("Modules over 500 lines")
    unlisted = {m: n for m, n in modules.items() if not listed.get(m)}
    assert not unlisted, (
        f"split these modules, or list each with why in docs/architecture.md: {unlisted}"
    )
    stale = sorted(set(listed) - set(modules))
    assert not stale, f"no longer over {MAX_MODULE_LINES} lines: remove from the list: {stale}"


def test_every_function_over_80_lines_is_listed_with_its_reason():
    _, functions = _oversized()
    listed = _listed("Functions over 80 lines")
    unlisted = {f: n for f, n in functions.items() if not listed.get(f)}
    assert not unlisted, (
        f"split these functions, or list each with why in docs/architecture.md: {unlisted}"
    )
    stale = sorted(set(listed) - set(functions))
    assert not stale, f"no longer over {MAX_FUNCTION_LINES} lines: remove from the list: {stale}"


def _code_lines(text: str) -> list[tuple[int, str]]:
    """(line number, stripped line) of the lines that carry code: no blank lines, comments,
    imports, closing brackets or docstring quotes."""
    kept = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(("#", "import ", "from ")):
            continue
        if line in (")", "]", "}", "),", "],", "},", '"""'):
            continue
        kept.append((number, line))
    return kept


def exact_repeats(packages=("ingestion", "retrieval"), size=DUPLICATE_LINES) -> list[list[str]]:
    """Places sharing ``size`` consecutive code lines, as ``file:line`` groups."""
    seen = collections.defaultdict(list)
    for name, text in _sources():
        if name.split("/", 1)[0] not in packages:
            continue
        lines = _code_lines(text)
        for start in range(len(lines) - size + 1):
            window = "\n".join(line for _, line in lines[start : start + size])
            seen[window].append(f"{name}:{lines[start][0]}")
    return [places for places in seen.values() if len(places) > 1]


def test_no_six_lines_of_code_repeat_in_ingestion_or_retrieval():
    assert exact_repeats() == []


def test_the_repeat_finder_finds_a_repeat(tmp_path, monkeypatch):
    """The check above can fail: two copies of one block are found."""
    block = "\n".join(f"value_{n} = compute({n})" for n in range(7))
    (tmp_path / "ingestion").mkdir()
    (tmp_path / "ingestion" / "a.py").write_text(block + "\n")
    (tmp_path / "ingestion" / "b.py").write_text("x = 1\n" + block + "\n")
    monkeypatch.setattr(
        "tests.test_size_rules._sources",
        lambda: (
            (p.relative_to(tmp_path).as_posix(), p.read_text())
            for p in sorted(tmp_path.rglob("*.py"))
        ),  # fmt: skip
    )
    assert exact_repeats() == [
        ["ingestion/a.py:1", "ingestion/b.py:2"],
        ["ingestion/a.py:2", "ingestion/b.py:3"],
    ]
