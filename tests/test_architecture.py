"""The package layering, read from every module's imports (AST, nothing imported):

- ``core`` imports none of the stages (runner, ingest, report);
- ``runner`` and ``report`` never import each other;
- no import circle between modules (lazy imports inside functions count too).

A package's ``__init__`` importing ``pkg.sub`` is an edge like any other: a submodule that imports
names from its package's ``__init__`` must not be imported back by it.
"""
from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("core", "runner", "ingest", "report")


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in (REPO / pkg).rglob("*.py"):
            name = ".".join(path.relative_to(REPO).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules ``name`` imports (``from pkg import sub`` resolves to pkg.sub)."""
    is_pkg = path.name == "__init__.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_pkg else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            targets = [prefix] + [f"{prefix}.{a.name}" for a in node.names]
        for t in targets:
            while t and t not in modules:
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _stage(module: str) -> str:
    return module.split(".")[0]


def test_core_imports_no_stage():
    bad = sorted(f"{m} -> {t}" for m, ts in _graph().items() for t in ts
                 if _stage(m) == "core" and _stage(t) != "core")
    assert not bad, "core must import none of runner/ingest/report:\n" + "\n".join(bad)


def test_runner_and_report_never_import_each_other():
    bad = sorted(f"{m} -> {t}" for m, ts in _graph().items() for t in ts
                 if {_stage(m), _stage(t)} == {"runner", "report"})
    assert not bad, "runner and report share only through core (and files):\n" + "\n".join(bad)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_no_import_cycles():
    cycles = _cycles(_graph())
    assert not cycles, "import circles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_cycle_finder_finds_a_planted_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_parsers_stay_one_small_path():
    """The parser package: one parsing path per format in Python, at most 3,800 lines (every line
    routed to every grammar, one normaliser for every prefix and wrap, tables read without their
    header), no compiled scanners."""
    files = list((REPO / "ingest" / "parsers").rglob("*"))
    assert not [f for f in files if f.suffix in (".pyx", ".pxd", ".c", ".so")]
    lines = sum(len(f.read_text().splitlines()) for f in files if f.suffix == ".py")
    assert lines <= 3800, lines
