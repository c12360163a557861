"""Run directories of `fastrl train`: a new one per run (time plus a short id), never reused except by ``resume=``,
removed again when a run ends before its first step; ``resume=`` takes a checkpoint or a run directory.

A run directory holds ``.hydra/`` (the composed config and the command line's overrides), ``train.log``,
``metrics.jsonl``, ``checkpoints/step_XXXXXX/``, ``report.png`` and ``wandb/``. ``resume=RUN_DIR`` continues that
run in place from its latest checkpoint, with the overrides it was started with (``.hydra/overrides.yaml``) and
the ones given now on top.
"""

from __future__ import annotations

import json
import re
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf

from fastrl.commands.output_guard import check_creatable
from fastrl.rl.checkpoint import STATE_FILE

RUN_ID_RESOLVER = "fastrl_run_id"  # ${fastrl_run_id:} in hydra.run.dir: 6 hex digits, one per composed config
CHECKPOINTS = "checkpoints"
CHECKPOINT_NAME = re.compile(r"step_\d+")  # checkpoints/step_000012: the run after 12 steps
METRICS_FILE = "metrics.jsonl"
REPLACED_METRICS_FILE = "metrics.replaced.jsonl"  # steps an interrupted run logged after its last checkpoint
OVERRIDES_FILE = Path(".hydra") / "overrides.yaml"
RUN_DIR_KEY = "hydra.run.dir"


def register_run_id() -> None:
    """Make ``${fastrl_run_id:}`` available to configs (idempotent)."""
    if not OmegaConf.has_resolver(RUN_ID_RESOLVER):
        OmegaConf.register_new_resolver(RUN_ID_RESOLVER, lambda: secrets.token_hex(3), use_cache=True)


@dataclass
class RunPlan:
    """Where a `fastrl train` run writes and what it resumes.

    overrides: the command line's overrides, completed (a resumed run directory's own overrides first, ``resume=``
    made the checkpoint, ``hydra.run.dir`` the run directory). in_place: the run continues an existing run
    directory (nothing of it is ever removed). existed: the run directory given existed before (empty).
    """

    overrides: list[str]
    in_place: bool = False
    existed: bool = False
    resumed_from: str = ""


def plan_run(overrides: list[str]) -> RunPlan:
    """Check and complete a run's overrides: ``resume=`` a run directory or a checkpoint, ``hydra.run.dir=`` an
    unused directory. ValueError naming the key as typed."""
    values = dict(_split(o) for o in overrides)
    resume = values.get("resume", "")
    run_dir = values.get(RUN_DIR_KEY, "")
    checkpoint_path = ""
    if resume:
        checkpoint, resumed_run = resolve_resume(resume)
        checkpoint_path = str(checkpoint)
        if resumed_run is not None and run_dir in ("", str(resumed_run)):
            skip = set(values) | {"resume", RUN_DIR_KEY}
            earlier = [o for o in read_overrides(resumed_run) if _split(o)[0] not in skip]
            rest = [o for o in overrides if _split(o)[0] not in ("resume", RUN_DIR_KEY)]
            completed = [*earlier, *rest, f"resume={checkpoint}", f"{RUN_DIR_KEY}={resumed_run}"]
            return RunPlan(completed, in_place=True, resumed_from=checkpoint_path)
        overrides = [f"resume={checkpoint}" if _split(o)[0] == "resume" else o for o in overrides]
    existed = bool(run_dir) and Path(run_dir).exists()
    if existed:
        check_unused(Path(run_dir))
    if run_dir:
        check_creatable(RUN_DIR_KEY, run_dir)
    return RunPlan(list(overrides), existed=existed, resumed_from=checkpoint_path)


def resolve_resume(path: str) -> tuple[Path, Path | None]:
    """(the checkpoint to resume, the run directory it continues or None) for ``resume=path``: a checkpoint
    directory, or a run directory (its latest checkpoint)."""
    where = Path(path)
    if (where / STATE_FILE).is_file():
        return where, None
    if not where.is_dir():
        raise ValueError(f"resume={path}: no such directory (give a run directory or one of its checkpoints)")
    if not (where / CHECKPOINTS).is_dir():
        raise ValueError(
            f"resume={path} is neither a checkpoint ({STATE_FILE} is missing) nor a run directory "
            f"({CHECKPOINTS}/ is missing)"
        )
    latest = latest_checkpoint(where)
    if latest is None:
        raise ValueError(
            f"resume={path}: the run saved no checkpoint yet ({where / CHECKPOINTS} is empty); "
            "start it again without resume="
        )
    return latest, where


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The checkpoint of ``run_dir`` with the most steps (``checkpoints/step_XXXXXX`` holding trainer_state.json; a
    ``step_XXXXXX.tmp`` being written, or left by a run killed while writing it, is none)."""
    found = [
        p
        for p in (run_dir / CHECKPOINTS).glob("step_*")
        if CHECKPOINT_NAME.fullmatch(p.name) and (p / STATE_FILE).is_file()
    ]
    return max(found, key=lambda p: p.name, default=None)


def read_overrides(run_dir: Path) -> list[str]:
    """The overrides a run was started with (its .hydra/overrides.yaml; [] when absent)."""
    file = run_dir / OVERRIDES_FILE
    if not file.is_file():
        return []
    values = OmegaConf.to_container(OmegaConf.load(file))
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise ValueError(f"resume={run_dir}: {file} is not a list of overrides")
    return list(values)


def check_unused(run_dir: Path) -> None:
    """ValueError when ``run_dir`` is not an empty directory: a run never writes into another run's directory."""
    if not run_dir.is_dir():
        raise ValueError(f"{RUN_DIR_KEY}={run_dir} is not a directory")
    if any(run_dir.iterdir()):
        raise ValueError(
            f"{RUN_DIR_KEY}={run_dir} holds an earlier run; a new run needs a new directory (leave {RUN_DIR_KEY} "
            f"out for a fresh one), or continue that run with resume={run_dir}"
        )


def forget_run(run_dir: Path, plan: RunPlan) -> None:
    """Remove what a run that ended before its first step wrote (its whole directory, unless it continues an
    earlier run; a directory that existed before is emptied, not removed)."""
    if plan.in_place or not run_dir.is_dir():
        return
    if plan.existed:
        for child in run_dir.iterdir():
            shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
    else:
        shutil.rmtree(run_dir)


def keep_metrics_before(run_dir: Path, step: int) -> int:
    """Continuing ``run_dir`` at ``step``: metrics.jsonl keeps the steps before it; the lines of later steps (run
    after the last checkpoint, and run again now) move to metrics.replaced.jsonl. Returns how many moved."""
    file = run_dir / METRICS_FILE
    if not file.is_file():
        return 0
    keep, moved = [], []
    for line in file.read_text().splitlines():
        if line.strip():
            (keep if json.loads(line).get("step", 0) < step else moved).append(line)
    if moved:
        with (run_dir / REPLACED_METRICS_FILE).open("a") as f:
            f.write("\n".join(moved) + "\n")
        file.write_text("".join(x + "\n" for x in keep))
    return len(moved)


def _split(override: str) -> tuple[str, str]:
    key, _, value = override.partition("=")
    return key.lstrip("+~"), value
