"""The package reads bottom-up: no module imports, at any depth and whether at the top or inside a function,
a module that imports it back. A shared definition lives in one module below all of its users."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "a2d_convert"


def imports_of(path: Path) -> set[str]:
    """The package's modules that `path` imports (relative imports, `from . import x` included)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                names.add(node.module.split(".")[0])
            else:
                names.update(alias.name for alias in node.names)
    modules = {p.stem for p in PACKAGE.glob("*.py")}
    return {name for name in names if name in modules and name != path.stem}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_package_has_no_import_cycle():
    graph = {p.stem: imports_of(p) for p in PACKAGE.glob("*.py") if p.stem != "__main__"}
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def test_the_cycle_finder_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
