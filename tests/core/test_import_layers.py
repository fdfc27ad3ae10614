"""src/pyccl is a stack: no module imports, at any depth of its code, a
module that imports it back (dsl/, a language of its own, aside). Imports
under ``if TYPE_CHECKING:`` are annotations, not dependencies."""

import ast
import pathlib
from typing import Dict, List, Set

import pyccl

ROOT = pathlib.Path(pyccl.__file__).parent
EXEMPT = "pyccl.dsl"  # the DSL's own modules may refer to each other


def _modules() -> Dict[str, pathlib.Path]:
    mods = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return mods


def _type_checking_only(tree: ast.AST) -> Set[int]:
    """ids of the import nodes under `if TYPE_CHECKING:`."""
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING":
            for inner in node.body:
                for n in ast.walk(inner):
                    skipped.add(id(n))
    return skipped


def _imports(name: str, path: pathlib.Path, mods: Dict[str, pathlib.Path]) -> Set[str]:
    """The pyccl modules `name` imports anywhere in its code (functions too)."""
    tree = ast.parse(path.read_text())
    skipped = _type_checking_only(tree)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in mods)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package[:len(package) - (node.level - 1)] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                full = f"{base}.{alias.name}"
                # `from . import x` of a submodule (or the extension _C) depends on it, not on the package
                target = full if full in mods or full.endswith("._C") else base
                if target in mods:
                    found.add(target)
    found.discard(name)
    return found


def _cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[List[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_the_modules_form_a_stack_without_cycles():
    mods = _modules()
    graph = {name: {d for d in _imports(name, path, mods) if not d.startswith(EXEMPT)}
             for name, path in mods.items() if not name.startswith(EXEMPT)}
    described = [" -> ".join(c) + ": " + "; ".join(f"{m} imports {sorted(graph[m] & set(c))}" for m in c)
                 for c in _cycles(graph)]
    assert described == [], "\n".join(described)


def test_the_check_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
