"""The code's shape: modules import one another in layers, at their top, with no circle, and touch
the BPF maps through bpf(2) only.

How right is told from wrong: the sources are parsed (ast), not imported. Every Python file the
repository tracks is checked (every folder: pepctl, haproxy, linkem, replay, congestion, netns,
bench, demo, trex-profiles, tests):
- no import inside a function (it would hide a circle, and a missing module until that line runs);
- no cycle in the graph of module-level imports between the repository's own modules;
- layers: a lower layer never imports a higher one. pepctl, haproxy and the tools' own Python
  (linkem, replay, congestion) are the appliance and its parts; netns, the lab, runs them; bench measures
  with the lab; demo shows all of it; tests may use anything;
- no module imports another's private name (a leading underscore), within a package or across;
- names.py derives names from plain values and imports nothing of the config;
- pepctl/config/: no module of more than 500 lines;
- no source runs `bpftool map` (the text path beside bpf(2)) or pepctl through a shell.
"""

from __future__ import annotations

import ast
import os
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Lowest first; a module may import its own layer and those below. Folders not listed are standalone
# (trex-profiles: TRex's own format, loaded by TRex).
LAYERS = [("pepctl", "haproxy", "linkem", "replay", "congestion"), ("netns",), ("bench",), ("demo",), ("tests",)]
LAYER = {folder: i for i, folders in enumerate(LAYERS) for folder in folders}
CONFIG_MODULE_MAX_LINES = 500


def sources() -> dict[str, str]:
    """Module name -> path, for every Python file git tracks (and new ones it does not ignore)."""
    files = subprocess.run(["git", "-C", REPO, "ls-files", "-co", "--exclude-standard", "*.py"], capture_output=True,
                           text=True, check=True).stdout.split()
    out = {}
    for path in sorted(files):
        parts = path[:-3].split("/")
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = os.path.join(REPO, path)
    return out


SOURCES = sources()


def tree(path: str) -> ast.Module:
    with open(path) as f:
        return ast.parse(f.read(), path)


def package_of(mod: str) -> str:
    """The package a module's relative imports start from."""
    return mod if SOURCES[mod].endswith("__init__.py") else mod.rpartition(".")[0]


def imported(mod: str, node: ast.AST) -> list[tuple[str, list[str]]]:
    """(module, names) of each module-level import of mod, relative ones resolved."""
    out = []
    for n in node.body:
        if isinstance(n, ast.ImportFrom):
            base = n.module or ""
            if n.level:
                parts = package_of(mod).split(".")
                parts = parts[:len(parts) - (n.level - 1)]
                base = ".".join(parts + ([base] if base else []))
            out.append((base, [a.name for a in n.names]))
        elif isinstance(n, ast.Import):
            out += [(a.name, []) for a in n.names]
    return out


def imports_of(mod: str, node: ast.AST) -> set[str]:
    """The repository's modules a module imports at its top level (from a package: its submodule
    when the name is one)."""
    out = set()
    for base, names in imported(mod, node):
        subs = {f"{base}.{name}" for name in names} & SOURCES.keys()
        out |= subs or {base}
        if len(subs) < len(names):
            out.add(base)
    return {m for m in out if m in SOURCES and m != mod}


GRAPH = {m: imports_of(m, tree(p)) for m, p in SOURCES.items()}


def test_every_folder_is_checked():
    folders = {m.split(".")[0] for m in SOURCES}
    assert {"pepctl", "haproxy", "netns", "bench", "demo", "tests", "linkem", "replay"} <= folders, folders
    assert "pepctl.config.entry" in SOURCES and "tests.unit.test_structure" in SOURCES


@pytest.mark.parametrize("mod", sorted(SOURCES))
def test_no_import_inside_a_function(mod):
    t = tree(SOURCES[mod])
    hidden = [f"line {n.lineno}" for fn in ast.walk(t) if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef)
              for n in ast.walk(fn) if isinstance(n, ast.Import | ast.ImportFrom)]
    assert not hidden, f"{SOURCES[mod]}: imports inside functions at {', '.join(hidden)}: import at the top"


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for dep in sorted(graph.get(m, ())):
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
            if cycle:
                return cycle
    return None


def test_no_import_cycle():
    cycle = find_cycle(GRAPH)
    assert cycle is None, f"import cycle: {' -> '.join(cycle)}"


def test_the_cycle_check_can_fail():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


@pytest.mark.parametrize("mod", sorted(SOURCES))
def test_layers(mod):
    mine = LAYER.get(mod.split(".")[0])
    upward = sorted(dep for dep in GRAPH[mod] if mine is None or LAYER.get(dep.split(".")[0], -1) > mine)
    upward = [dep for dep in upward if dep.split(".")[0] != mod.split(".")[0]]
    assert not upward, f"{SOURCES[mod]} imports {', '.join(upward)}, of a higher layer (or {mod} is standalone): " \
                       f"layers, lowest first: {LAYERS}; move what both need down"


@pytest.mark.parametrize("mod", sorted(SOURCES))
def test_no_private_name_imported(mod):
    private = [f"{base}.{name}" for base, names in imported(mod, tree(SOURCES[mod]))
               if base.split(".")[0] in LAYER for name in names if name.startswith("_") and not name.startswith("__")]
    assert not private, f"{SOURCES[mod]} imports private names {', '.join(private)}: make them public where they " \
                        "are, or move them"


def test_names_know_nothing_of_the_config():
    got = [m for m in GRAPH["pepctl.names"] if m.startswith("pepctl.config")]
    assert not got, f"pepctl/names.py imports {got}: names are derived from plain values"


def test_config_modules_are_small():
    big = {m: n for m, path in SOURCES.items() if m.startswith("pepctl.config")
           for n in [sum(1 for _ in open(path))] if n > CONFIG_MODULE_MAX_LINES}
    assert not big, f"config modules over {CONFIG_MODULE_MAX_LINES} lines: {big}: split them along their seams"


@pytest.mark.parametrize("mod", sorted(SOURCES))
def test_maps_only_through_bpf_syscall(mod):
    if mod == "tests.unit.test_structure":
        return
    with open(SOURCES[mod]) as f:
        text = f.read()
    for word in ('"bpftool", "map"', "bpftool map", '"map", "update"', '"map", "lookup"', '"map", "dump"'):
        assert word not in text, f"{SOURCES[mod]} uses {word!r}: read and write maps through pepctl/bpfsys.py"
    assert '"bypass", "sync"' not in text, f"{SOURCES[mod]} runs pepctl through a shell to do what a function can"
