"""The shape of the package (issue: one ladder, dependencies that point down, no import cycles).

These read the source with `ast`; each can fail when someone adds an upward import, a cycle, or a
second place that catches out-of-memory.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "lowvram_gen"


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        found[".".join(parts)] = path
    return found


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """Every project module `path` imports, at the top or inside a function."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("lowvram_gen"):
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                out.add(full if full in modules else node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("lowvram_gen"))
    return {m for m in out if m in modules}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(path, modules) - {name} for name, path in modules.items()}


def test_no_import_cycles():
    graph = _graph()
    done, cycles = set(), []

    def visit(node, trail):
        if node in trail:
            cycles.append(trail[trail.index(node):] + [node])
            return
        if node in done:
            return
        for dep in sorted(graph[node]):
            visit(dep, trail + [node])
        done.add(node)

    for node in sorted(graph):
        visit(node, [])
    assert cycles == []


def test_planning_imports_nothing_from_execution():
    """Planning (estimates, the planner, sizes) sits below the engines: it may read devices, presets,
    settings and model configs, never engines, the session, the ladder or the front ends."""
    execution = ("lowvram_gen.engines", "lowvram_gen.session", "lowvram_gen.ladder", "lowvram_gen.ui",
                 "lowvram_gen.cli", "lowvram_gen.batch", "lowvram_gen.upscale", "lowvram_gen.oom")
    upward = {m: sorted(d for d in deps if d.startswith(execution))
              for m, deps in _graph().items() if m.startswith("lowvram_gen.planning")}
    assert {m: d for m, d in upward.items() if d} == {}


def test_engines_and_lower_layers_never_import_the_session_or_front_ends():
    """A request goes down: front ends -> session -> engines -> planning/models/outputs, never back up."""
    front = ("lowvram_gen.session", "lowvram_gen.ui", "lowvram_gen.cli", "lowvram_gen.batch", "lowvram_gen.api",
             "lowvram_gen.server")  # the launcher of the web UI and the API, above both
    lower = [m for m in _graph() if not m.startswith(front) and m not in ("lowvram_gen", "lowvram_gen.__main__")]
    graph = _graph()
    assert {m: sorted(d for d in graph[m] if d.startswith(front)) for m in lower
            if any(d.startswith(front) for d in graph[m])} == {}


def test_out_of_memory_is_caught_in_one_place():
    """Only the ladder's guard catches out-of-memory (`is_oom`); engines step down after it returns."""
    callers = sorted(str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py")
                     if "is_oom(" in path.read_text() and path.name not in ("oom.py", "ladder.py"))
    assert callers == []
