"""Seams you can see: the package's modules meet through public names, and never in a cycle.

Two rules over the source of ``django_rag`` (read with ``ast``, nothing is imported):

- a module uses another module's ``_private`` name (``from .x import _name``, or
  ``x._name`` on an imported module) only when :data:`ALLOWED` lists it with a reason;
- the import graph has no cycle, counting every import: at module level, inside functions
  and under ``if TYPE_CHECKING:`` (``lint-imports`` skips the last; a cycle there still
  says two modules lean on each other).

docs/architecture.md ("Seams") states the rules and the exceptions.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "django_rag"

# (importing module, module the name lives in, name): why the seam is crossed.
ALLOWED: dict[tuple[str, str, str], str] = {}


def modules(root: Path, package: str) -> dict[str, tuple[Path, bool]]:
    """Every module under ``root``: dotted name -> (file, is a package's ``__init__``)."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = [package, *path.relative_to(root).with_suffix("").parts]
        is_package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def _owner(name: str, known: dict) -> str | None:
    """The module ``name`` is or lives in (the longest known prefix)."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def scan(root: Path, package: str) -> tuple[dict[str, set[str]], list[tuple[str, str, str]]]:
    """The import graph (module -> modules it imports, every import counted) and the uses of
    another module's private names: (importing module, owning module, name)."""
    known = modules(root, package)
    graph: dict[str, set[str]] = {name: set() for name in known}
    private: list[tuple[str, str, str]] = []
    for module, (path, is_package) in known.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        bound: dict[str, str] = {}  # local name -> module it refers to
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    target = _owner(alias.name, known)
                    if target:
                        graph[module].add(target)
                        if alias.asname:
                            bound[alias.asname] = target
                        else:
                            bound[alias.name.split(".")[0]] = alias.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom):
                source = _absolute(module, is_package, node)
                if _owner(source, known) is None:
                    continue
                for alias in node.names:
                    submodule = f"{source}.{alias.name}"
                    if submodule in known:
                        graph[module].add(submodule)
                        bound[alias.asname or alias.name] = submodule
                        continue
                    owner = _owner(source, known)
                    graph[module].add(owner)
                    if _is_private(alias.name):
                        private.append((module, owner, alias.name))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and _is_private(node.attr):
                dotted = _dotted(node.value)
                if dotted is None or dotted[0] not in bound:
                    continue
                target = ".".join([bound[dotted[0]], *dotted[1:]])
                if target in known:
                    private.append((module, target, node.attr))
        graph[module].discard(module)
    return graph, [use for use in private if use[0] != use[1]]


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _dotted(node: ast.expr) -> list[str] | None:
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return None if head is None else [*head, node.attr]
    return None


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for target in edges:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


@pytest.fixture(scope="module")
def package_scan():
    return scan(PACKAGE, "django_rag")


def test_private_names_stay_in_their_module(package_scan):
    _, private = package_scan
    unlisted = sorted({use for use in private if use not in ALLOWED})
    assert not unlisted, (
        "these modules use another module's private name; make the name public (drop the "
        "underscore), move the code to the module that uses it, or list it in ALLOWED with "
        "a reason:\n" + "\n".join(f"  {m} uses {owner}.{name}" for m, owner, name in unlisted)
    )


def test_allowed_private_uses_are_still_needed(package_scan):
    _, private = package_scan
    stale = sorted(set(ALLOWED) - set(private))
    assert not stale, "remove these from ALLOWED, nothing uses them any more:\n" + "\n".join(
        f"  {entry}" for entry in stale
    )


def test_no_import_cycles(package_scan):
    graph, _ = package_scan
    assert cycles(graph) == []


def test_the_rules_catch_what_they_forbid(tmp_path):
    # A package with each thing the rules forbid, so the checks above can fail.
    root = tmp_path / "pkg"
    (root / "sub").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "sub" / "__init__.py").write_text("from .. import c\n")
    (root / "a.py").write_text("from .b import _hidden, shown\n")
    (root / "b.py").write_text("def f():\n    from . import a\n_hidden = shown = 1\n")
    (root / "c.py").write_text(
        "import pkg\nimport pkg.b as alias\nfrom . import b\nfrom .sub import x\n"
        "alias._one\nb._two\npkg.b._three\nb.shown\nb.__doc__\n"
    )
    (root / "sub" / "x.py").write_text("")

    graph, private = scan(root, "pkg")

    assert sorted(private) == [
        ("pkg.a", "pkg.b", "_hidden"),
        ("pkg.c", "pkg.b", "_one"),
        ("pkg.c", "pkg.b", "_three"),
        ("pkg.c", "pkg.b", "_two"),
    ]
    assert graph["pkg.c"] == {"pkg", "pkg.b", "pkg.sub.x"}
    assert graph["pkg.sub"] == {"pkg.c"}
    assert cycles(graph) == [["pkg.a", "pkg.b"]]  # through the import inside f()

    (root / "b.py").write_text("_hidden = shown = 1\n")
    assert cycles(scan(root, "pkg")[0]) == []
    (root / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .c import Thing\n"
    )
    (root / "c.py").write_text("from . import a\n")
    assert cycles(scan(root, "pkg")[0]) == [["pkg.a", "pkg.c"]]
