"""docs/architecture.md's layering, kept true: a package imports only from packages to its left in the table, with
the exceptions the page names (every import, at module level or inside a function)."""

from __future__ import annotations

import ast
from pathlib import Path

FASTRL = Path(__file__).resolve().parents[1] / "fastrl"
ORDER = [
    "models",
    "sampling",
    "strategy",
    "speculative",
    "adaptive",
    "engine",
    "exactness",
    "cotrain",
    "rollout",
    "rl",
    "telemetry",
    "integrations",
    "bench",
    "commands",
]
SHARED = {
    "atomic_files",
    "json_values",
    "tensor_files",
    "assets_path",
    "interrupts",
}  # top-level modules every package uses
COMMAND_LINE = {"cli", "cli_hydra", "config_compose"}  # top-level modules of the command line: commands' layer
EXCEPTIONS = {
    ("fastrl/speculative/drafter_checkpoint.py", "fastrl.adaptive.depth_acceptance"),
    ("fastrl/cotrain/offline.py", "fastrl.rl.tasks.task"),
    ("fastrl/cotrain/offline.py", "fastrl.rl.seeding"),  # the held-out requests' seed stream, apart from the rollouts'
    ("fastrl/adaptive/sim.py", "fastrl.bench.cli_args"),  # the simulator's command line
}
MUTUAL = {"bench", "commands"}  # the top layer: the suites live in commands/, the scripts in bench/ use its setup


def _layer(name: str) -> str:
    part = name.split(".")[1]
    return "commands" if part in COMMAND_LINE else part


def _imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return [n for n in names if n.startswith("fastrl.")]


def test_every_import_goes_left_or_is_a_named_exception():
    wrong = []
    for path in sorted(FASTRL.rglob("*.py")):
        relative = str(path.relative_to(FASTRL.parent))
        here = _layer("fastrl." + ".".join(path.relative_to(FASTRL).with_suffix("").parts))
        if here == "__init__":
            continue
        for name in _imports(path):
            there = _layer(name)
            if there in SHARED or there == here or (relative, name) in EXCEPTIONS or {here, there} <= MUTUAL:
                continue
            if here in SHARED or ORDER.index(there) > ORDER.index(here):
                wrong.append(f"{relative} ({here}) imports {name} ({there})")
    assert not wrong, "\n".join(wrong)


def test_the_layers_are_the_packages():
    packages = {p.name for p in FASTRL.iterdir() if p.is_dir() and any(p.glob("*.py"))}
    modules = {p.stem for p in FASTRL.glob("*.py")} - {"__init__"}
    assert packages - {"conf", "assets"} == set(ORDER)
    assert modules == SHARED | COMMAND_LINE
