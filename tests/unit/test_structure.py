"""The control plane's shape: modules import one another in layers, at their top, and touch the
BPF maps through bpf(2) only.

How right is told from wrong: the sources are parsed (ast), not imported. An import inside a
function would hide a circle; the graph of module-level imports within pepctl/ and haproxy/ must
have no cycle (the cycle is printed); and no source may run `bpftool map` (the text path
beside bpf(2)) or call pepctl through a shell.
"""

from __future__ import annotations

import ast
import os

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGES = ("pepctl", "haproxy")


def sources() -> dict[str, str]:
    """Module name -> path, for every module of the packages."""
    out = {}
    for pkg in PACKAGES:
        for name in sorted(os.listdir(os.path.join(REPO, pkg))):
            if name.endswith(".py"):
                mod = pkg if name == "__init__.py" else f"{pkg}.{name[:-3]}"
                out[mod] = os.path.join(REPO, pkg, name)
    return out


def tree(path: str) -> ast.Module:
    with open(path) as f:
        return ast.parse(f.read(), path)


def imports_of(mod: str, node: ast.AST) -> set[str]:
    """The package modules a module imports at its top level."""
    pkg = mod.split(".")[0] if "." in mod else mod
    out = set()
    for n in node.body:
        if isinstance(n, ast.ImportFrom):
            base = n.module or ""
            if n.level:
                base = pkg + (f".{base}" if base else "")
            for alias in n.names:
                full = f"{base}.{alias.name}"
                out.add(full if full in SOURCES else base)
        elif isinstance(n, ast.Import):
            out |= {a.name for a in n.names}
    return {m for m in out if m in SOURCES and m != mod}


SOURCES = sources()


@pytest.mark.parametrize("mod", sorted(SOURCES))
def test_no_import_inside_a_function(mod):
    t = tree(SOURCES[mod])
    hidden = [f"line {n.lineno}" for fn in ast.walk(t) if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef)
              for n in ast.walk(fn) if isinstance(n, ast.Import | ast.ImportFrom)]
    assert not hidden, f"{SOURCES[mod]}: imports inside functions at {', '.join(hidden)}: import at the top"


def test_no_import_cycle():
    graph = {m: imports_of(m, tree(p)) for m, p in SOURCES.items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for dep in sorted(graph[m]):
            if state.get(dep) == 1:
                return stack[stack.index(dep):] + [dep]
            if dep not in state:
                found = visit(dep)
                if found:
                    return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state:
            cycle = visit(m)
            assert cycle is None, f"import cycle: {' -> '.join(cycle)}"


def test_the_cycle_check_can_fail():
    graph = {"a": {"b"}, "b": {"a"}}
    seen = [m for m in graph if m in graph[next(iter(graph[m]))]]
    assert seen == ["a", "b"], "the test's own notion of a cycle is broken"


@pytest.mark.parametrize("mod", sorted(SOURCES))
def test_maps_only_through_bpf_syscall(mod):
    with open(SOURCES[mod]) as f:
        text = f.read()
    for word in ('"bpftool", "map"', "bpftool map", '"map", "update"', '"map", "lookup"', '"map", "dump"'):
        assert word not in text, f"{SOURCES[mod]} uses {word!r}: read and write maps through pepctl/bpfsys.py"
    assert '"bypass", "sync"' not in text, f"{SOURCES[mod]} runs pepctl through a shell to do what a function can"
