"""Run directories of `fastrl train`: a new one per run (time plus a short id), never reused except by ``resume=``,
removed again when a run ends before its first step; ``resume=`` takes a checkpoint or a run directory.

A run directory holds ``.hydra/`` (the composed config and the command line's overrides), ``train.log``,
``metrics.jsonl``, ``checkpoints/step_XXXXXX/`` (or ``checkpoints.path`` naming an ``rl.checkpoint_dir`` elsewhere),
``report.png``, ``wandb/`` and ``wandb_run_id``. ``resume=RUN_DIR`` continues that
run in place from its latest checkpoint, with the overrides it was started with (``.hydra/overrides.yaml``) and
the ones given now on top.
"""

from __future__ import annotations

import json
import math
import re
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path

import yaml
from omegaconf import OmegaConf

from fastrl.atomic_files import write_atomic
from fastrl.commands.output_guard import GuardedOutputs, check_creatable, guard_outputs
from fastrl.json_values import is_real
from fastrl.rl.checkpoint import STATE_FILE

RUN_ID_RESOLVER = "fastrl_run_id"  # ${fastrl_run_id:} in hydra.run.dir: 6 hex digits, one per composed config
CHECKPOINTS = "checkpoints"
CHECKPOINTS_RECORD = "checkpoints.path"  # a run's rl.checkpoint_dir, absolute, when it is not checkpoints/
WANDB_DIR = "wandb"  # W&B's own files of the run (offline-run-*)
WANDB_ID_FILE = "wandb_run_id"  # the W&B run id of the run, made at its start and read back by resume=RUN_DIR
CHECKPOINT_NAME = re.compile(r"step_\d+")  # checkpoints/step_000012: the run after 12 steps
METRICS_FILE = "metrics.jsonl"
NOT_A_RECORD = "not a line of metrics: not a JSON object"
REPLACED_METRICS_FILE = "metrics.replaced.jsonl"  # steps an interrupted run logged after its last checkpoint
OVERRIDES_FILE = Path(".hydra") / "overrides.yaml"
RUN_DIR_KEY = "hydra.run.dir"
CHECKPOINT_DIR_KEY = "rl.checkpoint_dir"


def register_run_id() -> None:
    """Make ``${fastrl_run_id:}`` available to configs (idempotent)."""
    if not OmegaConf.has_resolver(RUN_ID_RESOLVER):
        OmegaConf.register_new_resolver(RUN_ID_RESOLVER, lambda: secrets.token_hex(3), use_cache=True)


@dataclass
class RunPlan:
    """Where a `fastrl train` run writes and what it resumes.

    overrides: the command line's overrides, completed (a resumed run directory's own overrides first, ``resume=``
    made the checkpoint, ``hydra.run.dir`` the run directory). in_place: the run continues an existing run
    directory (nothing of it is ever removed). existed: the run directory given existed before (empty). locked:
    the command holds the run directory's lock already (taken before Hydra writes into a continued run). started:
    the job holds its run directory's lock and runs (a job refused the lock removes nothing: the directory is the
    other command's). checked:
    set by the run once its checks passed (before that, a failure is a refusal that leaves a continued run as it
    was).
    """

    overrides: list[str]
    in_place: bool = False
    existed: bool = False
    resumed_from: str = ""
    locked: bool = False
    started: bool = False
    checked: bool = False

    @property
    def run_dir(self) -> Path | None:
        """The run directory the overrides name (None: Hydra makes a new one)."""
        given = [value for key, value in map(_split, self.overrides) if key == RUN_DIR_KEY]
        return Path(given[-1]) if given else None


def plan_run(overrides: list[str], check_dirs: bool = True) -> RunPlan:
    """Check and complete a run's overrides: ``resume=`` a run directory or a checkpoint, ``hydra.run.dir=`` an
    unused directory (not checked without ``check_dirs``: a command that only prints its config). ValueError
    naming the key as typed."""
    values = dict(_split(o) for o in overrides)
    resume = values.get("resume", "")
    run_dir = values.get(RUN_DIR_KEY, "")
    checkpoint_path = ""
    if resume:
        checkpoint, resumed_run = resolve_resume(resume)
        checkpoint_path = str(checkpoint)
        if resumed_run is not None and (not run_dir or Path(run_dir).resolve() == resumed_run.resolve()):
            given = set(values) | {"resume", RUN_DIR_KEY}
            earlier = [o for o in read_overrides(resumed_run) if not _replaced(_split(o)[0], given)]
            # the run's own rl.checkpoint_dir as it recorded it (absolute), whatever the working directory now
            if (resumed_run / CHECKPOINTS_RECORD).is_file():
                kept = f"{CHECKPOINT_DIR_KEY}={checkpoints_dir(resumed_run)}"
                earlier = [kept if _split(o)[0] == CHECKPOINT_DIR_KEY else o for o in earlier]
            rest = [o for o in overrides if _split(o)[0] not in ("resume", RUN_DIR_KEY)]
            completed = [*earlier, *rest, f"resume={checkpoint}", f"{RUN_DIR_KEY}={resumed_run}"]
            return RunPlan(completed, in_place=True, resumed_from=checkpoint_path)
        overrides = [f"resume={checkpoint}" if _split(o)[0] == "resume" else o for o in overrides]
    existed = bool(run_dir) and Path(run_dir).exists()
    if existed and check_dirs:
        check_unused(Path(run_dir))
    if run_dir and check_dirs:
        check_creatable(RUN_DIR_KEY, run_dir)
    return RunPlan(list(overrides), existed=existed, resumed_from=checkpoint_path)


def _replaced(key: str, given: set[str]) -> bool:
    """Whether an earlier override of ``key`` gives way to the keys given now: the same key, or a config group
    given anew (``strategy=disable`` replaces an earlier ``strategy.name=5_1_6`` too)."""
    parts = key.split(".")
    return any(".".join(parts[:n]) in given for n in range(1, len(parts) + 1))


def resolve_resume(path: str) -> tuple[Path, Path | None]:
    """(the checkpoint to resume, the run directory it continues or None) for ``resume=path``: a checkpoint
    directory, or a run directory (its latest checkpoint)."""
    where = Path(path)
    if (where / STATE_FILE).is_file():
        return where, None
    if not where.is_dir():
        what = "a file, not a directory" if where.exists() else "no such directory"
        raise ValueError(f"resume={path}: {what} (give a run directory or one of its checkpoints)")
    checkpoints = checkpoints_dir(where)
    is_run = (where / OVERRIDES_FILE).is_file() or (where / METRICS_FILE).is_file()
    if not checkpoints.is_dir() and not is_run:
        raise ValueError(
            f"resume={path} is neither a checkpoint ({STATE_FILE} is missing) nor a run directory "
            f"({checkpoints} is missing)"
        )
    latest = latest_checkpoint(where) if checkpoints.is_dir() else None
    if latest is None:
        unfinished = sorted(p.name for p in checkpoints.glob("step_*.tmp")) if checkpoints.is_dir() else []
        held = f"{checkpoints} holds only the unfinished {unfinished[-1]}" if unfinished else "it wrote none"
        raise ValueError(
            f"resume={path}: that run saved no checkpoint to continue from ({held}); start it anew in a new directory "
            f"(leave resume= and hydra.run.dir= out) with its overrides ({where / OVERRIDES_FILE})"
        )
    return latest, where


def checkpoints_dir(run_dir: Path) -> Path:
    """Where the run in ``run_dir`` saves its checkpoints: the ``rl.checkpoint_dir`` it recorded (an absolute path,
    written by ``check_checkpoint_dir``), else ``run_dir/checkpoints``."""
    recorded = run_dir / CHECKPOINTS_RECORD
    return Path(recorded.read_text().strip()) if recorded.is_file() else run_dir / CHECKPOINTS


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The checkpoint of ``run_dir`` with the most steps (``step_XXXXXX`` under its ``checkpoints_dir``, holding
    trainer_state.json; a ``step_XXXXXX.tmp`` being written, or left by a run killed while writing it, is none)."""
    found = [
        p
        for p in checkpoints_dir(run_dir).glob("step_*")
        if CHECKPOINT_NAME.fullmatch(p.name) and (p / STATE_FILE).is_file()
    ]
    return max(found, key=lambda p: p.name, default=None)


def check_checkpoint_dir(checkpoint_dir: str, run_dir: Path, plan: RunPlan) -> Path:
    """The run's checkpoint directory (``rl.checkpoint_dir``, else ``run_dir/checkpoints``), checked before any
    work: it can be made, and unless the run continues its own run directory it holds no checkpoint (a run never
    writes over another run's). ValueError naming the key."""
    path = _checkpoints_elsewhere(checkpoint_dir, run_dir)
    if path is None:
        return run_dir / CHECKPOINTS
    check_creatable(CHECKPOINT_DIR_KEY, str(path))
    if not plan.in_place and path.is_dir():
        taken = sorted(p.name for p in path.iterdir() if CHECKPOINT_NAME.fullmatch(p.name.removesuffix(".tmp")))
        if taken:
            raise ValueError(
                f"{CHECKPOINT_DIR_KEY}={checkpoint_dir} holds another run's checkpoints ({taken[-1]}); a run never "
                "writes over them: give an empty or new directory (or continue that run with resume=)"
            )
    return path


def lock_checkpoint_dir(checkpoint_dir: str, run_dir: Path) -> GuardedOutputs | None:
    """The lock of a checkpoint directory outside the run directory, for the run's whole life (the run's own
    ``checkpoints/`` is under the run directory's lock); None for that one. Two runs given one
    ``rl.checkpoint_dir`` both found it empty before either had saved and then wrote over each other's steps."""
    path = _checkpoints_elsewhere(checkpoint_dir, run_dir)
    return None if path is None else guard_outputs({}, {}, work_dirs={CHECKPOINT_DIR_KEY: str(path)})


def _checkpoints_elsewhere(checkpoint_dir: str, run_dir: Path) -> Path | None:
    """``rl.checkpoint_dir`` as an absolute path, or None where it is (or defaults to) ``run_dir/checkpoints``."""
    own = run_dir / CHECKPOINTS
    path = Path(checkpoint_dir).absolute() if checkpoint_dir else own
    return None if path.resolve() == own.resolve() else path


def record_checkpoints_dir(run_dir: Path, checkpoints: Path) -> None:
    """Note in ``run_dir`` where its checkpoints go when that is not ``run_dir/checkpoints`` (``checkpoints_dir``
    reads it back, whatever the working directory of a later command)."""
    if checkpoints != run_dir / CHECKPOINTS:
        write_atomic(run_dir / CHECKPOINTS_RECORD, f"{checkpoints}\n")


def read_overrides(run_dir: Path) -> list[str]:
    """The overrides a run was started with (its .hydra/overrides.yaml; [] when absent)."""
    file = run_dir / OVERRIDES_FILE
    if not file.is_file():
        return []
    try:
        values = OmegaConf.to_container(OmegaConf.load(file))
    except (yaml.YAMLError, UnicodeDecodeError, OSError) as err:
        raise ValueError(f"resume={run_dir}: {file} is damaged ({type(err).__name__}: {err})") from None
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise ValueError(f"resume={run_dir}: {file} is not a list of overrides")
    return list(values)


def check_unused(run_dir: Path) -> None:
    """ValueError when ``run_dir`` is not an empty directory: a run never writes into another run's directory. The
    W&B files alone of a run that ended before its first step count as empty (W&B's service writes them after the
    run removed its directory)."""
    if not run_dir.is_dir():
        raise ValueError(f"{RUN_DIR_KEY}={run_dir} is not a directory")
    held = sorted(p.name for p in run_dir.iterdir())
    if not held or held == [WANDB_DIR]:
        return
    fresh = f"a new run needs a new or empty directory (leave {RUN_DIR_KEY} out for a fresh one)"
    if (run_dir / OVERRIDES_FILE).is_file() or _holds_results(run_dir):
        how = (
            f"or continue that run with resume={run_dir}" if latest_checkpoint(run_dir) else "(it saved no checkpoint)"
        )
        raise ValueError(f"{RUN_DIR_KEY}={run_dir} holds an earlier run; {fresh} {how}")
    shown = ", ".join(held[:3]) + (f" and {len(held) - 3} more" if len(held) > 3 else "")
    raise ValueError(f"{RUN_DIR_KEY}={run_dir} is not empty (it holds {shown}); {fresh}")


def check_resolved_unused(run_dir: Path) -> None:
    """For a run directory Hydra resolved from an interpolation (``hydra.run.dir=runs/${oc.env:EXP}``: unknown
    before Hydra runs), ValueError when it holds an earlier run's metrics or checkpoints: the new run would have
    trained into it and written over them (Hydra's own record and log of this command are already in it)."""
    if _holds_results(run_dir):
        raise ValueError(
            f"{RUN_DIR_KEY} resolved to {run_dir}, which holds an earlier run; a new run needs a new directory, or "
            f"continue that run with resume={run_dir}"
        )


def _holds_results(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a run's metrics or checkpoints."""
    return (run_dir / METRICS_FILE).is_file() or checkpoints_dir(run_dir).is_dir()


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
    after the last checkpoint, and run again now) move to metrics.replaced.jsonl. Returns how many moved.

    Both files are rewritten through a rename, metrics.replaced.jsonl first, so every line is in one of them at
    every instant; a command killed between the two renames finds the moved lines already at the end of
    metrics.replaced.jsonl when run again, and does not add them twice."""
    keep, moved = [], []
    for line, logged in read_metrics_lines(run_dir):
        # a last line cut short by a kill while it was written (None) belongs to a step not checkpointed
        (keep if logged is not None and logged.get("step", 0) < step else moved).append(line)
    if moved:
        replaced = run_dir / REPLACED_METRICS_FILE
        earlier = replaced.read_text().splitlines() if replaced.is_file() else []
        if earlier[-len(moved) :] != moved:
            write_atomic(replaced, "".join(x + "\n" for x in [*earlier, *moved]))
        write_atomic(run_dir / METRICS_FILE, "".join(x + "\n" for x in keep))
    return len(moved)


def read_metrics_lines(run_dir: Path) -> list[tuple[str, dict | None]]:
    """Each non-blank line of the run's metrics.jsonl with its parsed step record; None for a last line cut short
    (a run killed while writing it). ValueError naming the file and line when an earlier line is not a record:
    checked before a continued run changes anything."""
    file = run_dir / METRICS_FILE
    if not file.is_file():
        return []
    parsed = _parse_metrics(file)
    for number, _, logged, why in parsed[:-1]:
        if logged is None:
            raise ValueError(f"{file}:{number}: {why}")
    return [(line, logged) for _, line, logged, _ in parsed]


def _parse_metrics(file: Path) -> list[tuple[int, str, dict | None, str]]:
    """(line number, line, step record or None, why it is None) for each non-blank line of a metrics.jsonl."""
    parsed = []
    for number, line in enumerate(file.read_text(encoding="utf-8", errors="replace").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            logged = json.loads(line)
        except json.JSONDecodeError as err:
            parsed.append((number, line, None, f"not a line of metrics: not JSON ({err.msg}; a line cut short?)"))
            continue
        record = isinstance(logged, dict)
        parsed.append((number, line, logged if record else None, "" if record else NOT_A_RECORD))
    return parsed


def metrics_steps(run_dir: Path, keys: tuple[str, ...]) -> list[dict]:
    """The step records of a run's metrics.jsonl, for a reader of its figures that needs ``keys`` as numbers in every
    step (the recipes' plots and tables); a null, the run's record of a metric that was not finite, reads as NaN (a
    gap in a plot, NaN in a mean). ValueError naming the file, and the line where one is to blame: missing, a line
    that is not a record (a truncated last one too), a key missing or not a number, no step."""
    file = run_dir / METRICS_FILE
    if not file.is_file():
        raise ValueError(f"{file} is missing: is {run_dir} a `fastrl train` run directory?")
    steps = []
    for number, _, logged, why in _parse_metrics(file):
        if logged is None:
            raise ValueError(f"{file}:{number}: {why}")
        for key in keys:
            if key not in logged:
                raise ValueError(f"{file}:{number}: no {key!r} (not a `fastrl train` metrics line?)")
            value = logged[key]
            if value is None:  # a metric that was not finite (NaN, inf: the run writes null and warns)
                logged[key] = math.nan
            elif not is_real(value) or not math.isfinite(value):
                raise ValueError(f"{file}:{number}: {key!r} must be a number (or null), got {value!r}")
        steps.append(logged)
    if not steps:
        raise ValueError(f"{file} holds no steps")
    return steps


def _split(override: str) -> tuple[str, str]:
    key, _, value = override.partition("=")
    return key.lstrip("+~"), value


def run_record(run_dir: Path, log_file: str) -> dict[Path, bytes]:
    """The files of ``run_dir/.hydra`` (a run's composed config and overrides) and its log, to put back with
    ``restore_files`` when a command that continues the run is refused (Hydra rewrites the first and the command
    logs its line before it can check anything)."""
    folder = run_dir / OVERRIDES_FILE.parent
    files = sorted(folder.glob("*.yaml")) if folder.is_dir() else []
    files += [run_dir / log_file] if (run_dir / log_file).is_file() else []
    return {p: p.read_bytes() for p in files}


def restore_files(files: dict[Path, bytes]) -> None:
    """Write back what ``run_record`` read."""
    for path, data in files.items():
        path.write_bytes(data)


def wandb_run_id(run_dir: Path) -> str:
    """The W&B run id of the run in ``run_dir``: made (random) at the run's first start and kept in the directory,
    so ``resume=RUN_DIR`` logs into the same W&B run and a new run never does."""
    file = run_dir / WANDB_ID_FILE
    if file.is_file():
        return file.read_text().strip()
    run_id = secrets.token_hex(8)
    write_atomic(file, f"{run_id}\n")
    return run_id


def lock_run(run_dir: Path, key: str = RUN_DIR_KEY) -> GuardedOutputs:
    """The run directory's lock (released by the result's ``release`` or its ``with`` block): a second command in
    the same run is refused, naming the first's pid and ``key``, the key the user gave the directory with
    (``resume`` for a run continued in place)."""
    return guard_outputs({}, {}, work_dirs={key: str(run_dir)})
