"""The shape of the package: one ladder, dependencies that point down, no import cycles, and (issue 28, the house
step) front ends that do not import each other, networks/ below the engines, models/ below planning/, and family
decisions only through the family records.

These read the source with `ast`; each can fail when someone adds an upward import, a cycle, a second place that
catches out-of-memory, or a comparison with a family's name outside lowvram_gen/families/.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

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


# ------------------------------------------------------------------ the house step's rules (issue 28)

FRONT_ENDS = ("lowvram_gen.ui", "lowvram_gen.api", "lowvram_gen.batch", "lowvram_gen.cli")


def _front_end(module: str) -> str | None:
    return next((f for f in FRONT_ENDS if module == f or module.startswith(f + ".")), None)


def test_front_ends_do_not_import_each_other():
    """The web UI, the REST API and the batch script never import another front end, nor the server that puts
    two of them on one port (server.py); the CLI is the command's dispatcher: it may start the server and the
    batch script, never reach into ui/ or api/. What they share lives below them (jobs/, a1111/, session)."""
    may = {"lowvram_gen.cli": {"lowvram_gen.batch", "lowvram_gen.server"}}
    crossings = {}
    for module, deps in _graph().items():
        own = _front_end(module)
        if own is None:
            continue
        for dep in deps:
            other = _front_end(dep) or ("lowvram_gen.server" if dep == "lowvram_gen.server" else None)
            if other not in (None, own) and other not in may.get(own, ()):
                crossings.setdefault(module, []).append(dep)
    assert crossings == {}


def test_the_server_is_the_one_place_that_puts_the_ui_and_the_api_together():
    graph = _graph()
    assert sorted(m for m, deps in graph.items() if m.startswith("lowvram_gen.api")
                  and any(d.startswith(("lowvram_gen.ui", "lowvram_gen.cli")) for d in deps)) == []
    assert sorted(m for m, deps in graph.items() if m.startswith("lowvram_gen.ui")
                  and any(d.startswith(("lowvram_gen.api", "lowvram_gen.server")) for d in deps)) == []


def test_networks_do_not_import_engines():
    """LoRAs and embeddings act on a pipeline the engine hands them (its hooks come off through networks/hooks.py,
    which engines/sd/apply.py uses too), so networks/ sits below the engines."""
    assert {m: sorted(d for d in deps if d.startswith("lowvram_gen.engines"))
            for m, deps in _graph().items() if m.startswith("lowvram_gen.networks")
            and any(d.startswith("lowvram_gen.engines") for d in deps)} == {}


def test_models_do_not_import_planning():
    """Profiles (what the planner estimates from) are built in models/profile.py; planning reads them, never the
    reverse."""
    assert {m: sorted(d for d in deps if d.startswith("lowvram_gen.planning"))
            for m, deps in _graph().items() if m.startswith("lowvram_gen.models")
            and any(d.startswith("lowvram_gen.planning") for d in deps)} == {}


# Each module in the layer of the first prefix it matches (the longest match wins), top first. An import from a
# lower layer to a higher one is listed below with the reason it stays; anything else is a new one to fix.
LAYERS = (
    ("lowvram_gen.__main__", "lowvram_gen.cli"),
    ("lowvram_gen.server",),
    ("lowvram_gen.ui", "lowvram_gen.api", "lowvram_gen.batch"),
    ("lowvram_gen.jobs",),
    ("lowvram_gen.session", "lowvram_gen"),
    ("lowvram_gen.engines", "lowvram_gen.upscale", "lowvram_gen.ksamplers"),
    ("lowvram_gen.ladder", "lowvram_gen.oom", "lowvram_gen.preview", "lowvram_gen.networks", "lowvram_gen.prompting",
     "lowvram_gen.control", "lowvram_gen.inpaint"),
    ("lowvram_gen.planning", "lowvram_gen.presets", "lowvram_gen.failures"),
    ("lowvram_gen.models",),
    # what a job is, in our words and A1111's: plain data and parsing
    ("lowvram_gen.request", "lowvram_gen.hires", "lowvram_gen.img2img_steps", "lowvram_gen.samplers",
     "lowvram_gen.schedules", "lowvram_gen.a1111", "lowvram_gen.rng",
     "lowvram_gen.result", "lowvram_gen.settings", "lowvram_gen.control.units", "lowvram_gen.control.resize",
     "lowvram_gen.networks.tags",
     "lowvram_gen.networks.files", "lowvram_gen.prompting.parse", "lowvram_gen.prompting.styles",
     "lowvram_gen.inpaint.masks",
     "lowvram_gen.outputs", "lowvram_gen.video_out", "lowvram_gen.filename_pattern", "lowvram_gen.models.discover", "lowvram_gen.models.resolve",
     "lowvram_gen.models.tiny"),
    ("lowvram_gen.families", "lowvram_gen.hardware", "lowvram_gen.errors", "lowvram_gen.paths", "lowvram_gen.records",
     "lowvram_gen.safe_json",
     "lowvram_gen.models.quiet"),
)
UPWARD = {
    # an API ControlNet unit's model name is looked up when the body is read, so a wrong one is a 422 naming it
    ("lowvram_gen.a1111.api_body", "lowvram_gen.models.controlnet"):
        "the unit's model is resolved (not loaded) as A1111 answers a wrong name",
    # a unit's preprocessor name is checked against the detectors' table (their weights are looked for, not loaded)
    ("lowvram_gen.control.units", "lowvram_gen.control.detectors"): "a unit names a preprocessor the detectors know",
    # doctor's int8 speed probe quantizes its test layer as the models do
    ("lowvram_gen.hardware.throughput", "lowvram_gen.models.quantize"): "the int8 probe uses the models' quantizer",
}


def _layer(module: str) -> int:
    hits = [(len(p), i) for i, prefixes in enumerate(LAYERS) for p in prefixes
            if module == p or module.startswith(p + ".")]
    return max(hits)[1]


def test_imports_point_down_the_layers():
    graph = _graph()
    upward = {(m, d) for m, deps in graph.items() for d in deps if _layer(d) < _layer(m)}
    assert upward == set(UPWARD)
    assert len(UPWARD) < 7  # issue 28 counted 7 before the house step


# Words that name a family: the records' keys, short names and pipeline classes. Outside families/, code does not
# compare anything with them (`== "flux"`, `in ("sd3", ...)`, `.startswith("Flux")`, `type(p).__name__ == ...`):
# it asks the record.
def _family_words() -> tuple[set[str], set[str]]:
    from lowvram_gen import families

    names = {"flux", "sdxl", "sd3", "sd15", "sd21", "pixart", "qwen", "chroma", "sana", "lumina", "hidream", "kontext",
             "z-image"}
    classes = set()
    for record in families.all_families():
        names.update({record.key, record.group, *(a.lower() for a in record.aliases)})
        classes.update(record.pipelines, record.denoiser_classes)
    names.discard("sd")  # SD 1.x/2.x's group is also the engine's name ('sd' beside 'vqgan'), which front ends compare
    return names, classes


def _constants(node) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [s for e in node.elts for s in _constants(e)]
    return []


def _decides_by_family(node, names, classes) -> bool:
    def family_word(text: str) -> bool:
        low = text.lower()
        return low in names or text in classes or any(text.startswith(c) for c in
                                                      ("StableDiffusion", "Flux", "PixArt", "Qwen", "Sana"))

    if isinstance(node, ast.Compare):
        return any(family_word(c) for o in (node.left, *node.comparators) for c in _constants(o))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("startswith",
                                                                                                  "endswith"):
        return any(family_word(c) for a in node.args for c in _constants(a))
    return False


def test_family_decisions_go_through_the_records():
    """Adding a family is adding a record: nothing outside families/ decides by a family's name or class name."""
    names, classes = _family_words()
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = str(path.relative_to(PACKAGE))
        if rel.startswith("families/"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if _decides_by_family(node, names, classes):
                found.append(f"{rel}:{node.lineno}: {ast.unparse(node)[:100]}")
    assert found == []


@pytest.mark.parametrize("code, decides", [
    ('if type(pipe).__name__.startswith("Flux"): pass', True),
    ('if family == "sdxl": pass', True),
    ('x = name in ("FluxPipeline", "StableDiffusion3Pipeline")', True),
    ('if engine == "sd": pass', False),  # the engine's name, not a family
    ('if record.call.negative_prompt: pass', False),
])
def test_the_family_guard_sees_a_decision_by_name(code, decides):
    """The guard above must be able to fail: it flags the ways code used to decide by family."""
    names, classes = _family_words()
    assert any(_decides_by_family(node, names, classes) for node in ast.walk(ast.parse(code))) == decides
