"""A bandit's state in a JSON file that one `fastrl generate` run leaves for the next (``bandit_state=FILE``): the
calibration, per-depth acceptance and round times it learned, so the next run starts from them instead of exploring
again (what an RL run's rollout workers carry between rollouts).

The file also records what it was learned with (``"setting"``: the policy's and drafter's fingerprints and the
dtype): acceptance belongs to one policy and drafter, so a run with others is refused rather than started from
another model's numbers, as early as each part can be told: the dtype and the drafter (from its files) before any
work, the policy once it is loaded, before the calibration. A run keeps its own calibration (measured at its batch
sizes and arms) over the file's."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path

import torch
from torch import nn

from fastrl.adaptive.bandit import BanditSelector
from fastrl.adaptive.bandit_state_check import check_state_values, check_state_version
from fastrl.adaptive.factory import build_selector
from fastrl.atomic_files import write_atomic
from fastrl.commands.decode_config import DecodeConfig
from fastrl.commands.engine_setup import drafter_dir
from fastrl.commands.output_guard import OutputTarget
from fastrl.engine.config import ENGINE_DTYPES
from fastrl.engine.engine import Engine
from fastrl.models.checkpoint import heads_digest
from fastrl.speculative.drafter import EagleDrafter
from fastrl.speculative.drafter_checkpoint import read_draft_vocab, read_drafter_info, read_drafter_weights

SETTING_KEY = "setting"
SETTING_WORDS = {"policy": "policy", "drafter": "drafter", "dtype": "dtype"}


def tensors_fingerprint(tensors: Iterable[tuple[str, torch.Tensor]], dtype: torch.dtype | None = None) -> str:
    """A short hash of named tensors' names, shapes and first values (rounded to bfloat16, so that one checkpoint
    loaded in float32, float64 or bfloat16 gives one fingerprint; ``dtype``: each head first cast through float32 to
    it, as a module loaded in that dtype holds it): tells two checkpoints apart without reading every weight."""
    return heads_digest(_tensor_heads(tensors, dtype))


def _tensor_heads(
    tensors: Iterable[tuple[str, torch.Tensor]], dtype: torch.dtype | None
) -> list[tuple[str, tuple[int, ...], torch.Tensor]]:
    """What ``tensors_fingerprint`` hashes: each tensor's name, shape and rounded head, by name."""
    heads = []
    for name, tensor in sorted(tensors, key=lambda item: item[0]):
        head = tensor.detach().flatten()[:16]
        if dtype is not None:
            head = head.to(torch.float32).to(dtype)
        heads.append((name, tuple(tensor.shape), head.to("cpu", torch.bfloat16).to(torch.float32)))
    return heads


def drafter_tensors_fingerprint(
    tensors: Iterable[tuple[str, torch.Tensor]], draft_vocab: torch.Tensor | None, dtype: torch.dtype | None = None
) -> str:
    """``tensors_fingerprint`` of a drafter's weights and, when it drafts over a reduced draft vocabulary, of every
    token id of it, in order (exactly: the same weights over another vocabulary draft other tokens, with another
    acceptance). A drafter without one keeps the fingerprint of its weights alone, the one states were saved with
    before the vocabulary counted."""
    heads = _tensor_heads(tensors, dtype)
    if draft_vocab is not None:
        heads.append(("draft_vocab", tuple(draft_vocab.shape), draft_vocab.detach().to("cpu", torch.int64)))
    return heads_digest(heads)


def module_fingerprint(module: nn.Module) -> str:
    """``tensors_fingerprint`` of a module's state_dict (a drafter's: ``drafter_module_fingerprint``)."""
    return tensors_fingerprint(module.state_dict().items())


def drafter_module_fingerprint(drafter: EagleDrafter) -> str:
    """``drafter_tensors_fingerprint`` of a loaded drafter: its state_dict and its draft vocabulary."""
    return drafter_tensors_fingerprint(drafter.state_dict().items(), drafter.draft_vocab)


def drafter_fingerprint(directory: Path, dtype: str) -> str:
    """``drafter_module_fingerprint`` of the drafter in ``directory`` as a run in ``dtype`` loads it (its stored
    tensors into float32 parameters, then cast to the run's dtype; its draft vocabulary), from its files: no policy,
    no model."""
    tensors = read_drafter_weights(directory)
    draft_vocab = read_draft_vocab(directory, read_drafter_info(directory))
    return drafter_tensors_fingerprint(tensors.items(), draft_vocab, ENGINE_DTYPES.get(dtype, torch.float32))


def learned_setting(engine: Engine) -> dict:
    """What a bandit's acceptance and round times belong to: policy, drafter (None without one) and dtype."""
    drafter = engine.drafter
    return {
        "policy": module_fingerprint(engine.model),
        "drafter": None if drafter is None else drafter_module_fingerprint(drafter),
        "dtype": engine.config.dtype,
    }


def config_setting(cfg: DecodeConfig, model_dir: Path) -> dict:
    """The parts of ``learned_setting`` a run's config and files tell before any model is loaded: the dtype, and the
    fingerprint of the drafter the bandit's arms load (None when no arm drafts with one; left out where the run
    names none, which loading it refuses)."""
    if not any(s.uses_drafter for s in build_selector(cfg.strategy, bandit=cfg.bandit).strategies):
        return {"dtype": cfg.dtype, "drafter": None}
    drafter = drafter_dir(cfg.drafter, model_dir)
    if drafter is None:
        return {"dtype": cfg.dtype}
    try:
        return {"dtype": cfg.dtype, "drafter": drafter_fingerprint(drafter, cfg.dtype)}
    except ValueError as err:
        raise ValueError(f"drafter={drafter}: {err}") from None


def check_setting(key: str, path: Path, state: dict, setting: dict, here: str = "this run") -> None:
    """ValueError naming ``key``, the file and both values of each part of ``setting`` (policy, drafter, dtype) that
    ``state`` was learned with another of; only the parts ``setting`` holds are compared (what a command cannot
    know, it leaves out), and a state written before settings were recorded is taken as it is (a damaged setting is
    refused: ``saved_setting``)."""
    saved = saved_setting(key, path, state)
    if saved is None:
        return
    differ = [k for k in SETTING_WORDS if k in setting and saved.get(k) != setting[k]]
    if differ:
        words = [f"{SETTING_WORDS[k]} ({_shown(k, saved.get(k))} there, {_shown(k, setting[k])} here)" for k in differ]
        raise ValueError(
            f"{key}={path} was learned with another "
            + " and another ".join(words)
            + f": its acceptance and round times do not fit {here}; name another file (or remove it)"
        )


def saved_setting(key: str, path: Path, state: dict) -> dict | None:
    """The setting ``state`` was learned in (None when it records none: a file written before settings were);
    ValueError naming ``key`` and the file, as any damaged bandit state, when it is not an object whose policy and
    drafter are fingerprints (strings) or null and whose dtype is a string."""
    saved = state.get(SETTING_KEY)
    if saved is None:
        return None
    problem = _setting_problem(saved)
    if problem is not None:
        raise ValueError(f"{key}={path}: a damaged bandit state ({problem}); remove the file or name another")
    return saved


def _setting_problem(saved: object) -> str | None:
    """What is wrong with a recorded setting (None when nothing is)."""
    if not isinstance(saved, dict):
        return f"{SETTING_KEY} must be an object, got {saved!r}"
    for part in SETTING_WORDS:
        value = saved.get(part)
        if part in saved and not (isinstance(value, str) or (value is None and part != "dtype")):
            kind = "a string" if part == "dtype" else "a fingerprint string or null"
            return f"{SETTING_KEY}.{part} must be {kind}, got {value!r}"
    return None


def _shown(part: str, value: object) -> str:
    if part == "dtype":
        return str(value)
    return f"weights {value}" if value else "none"


def read_state_file(key: str, path: Path) -> dict | None:
    """The state saved at ``path``; None when there is none yet (no file, or an empty one). A file that is not a
    bandit state of this version, or a path that is no regular file (a FIFO there was read as an empty state and
    replaced at the end), is a ValueError naming ``key`` (the path is left as it is)."""
    if not path.exists():
        return None
    if not path.is_file():
        kind = "a directory" if path.is_dir() else "not a regular file"
        raise ValueError(f"{key}={path} is {kind}: name a bandit state JSON file (or a new path)")
    if path.stat().st_size == 0:
        return None
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{key}={path}: not a bandit state JSON file ({err}); remove it or name another") from None
    if isinstance(state, dict) and "workers" in state and "version" not in state:
        raise ValueError(
            f"{key}={path}: the per-worker selector states of a `fastrl train` checkpoint, not one bandit's state "
            "(export-drafter reads those); give a state file that `fastrl generate bandit_state=` wrote, or a new "
            "path"
        )
    try:
        check_state_version(state)
    except ValueError as err:
        raise ValueError(f"{key}={path}: {err}; remove the file or name another") from None
    missing = [k for k in ("acceptance", "times") if k not in state]
    if missing:
        raise ValueError(f"{key}={path}: a bandit state without {missing}; remove the file or name another")
    try:  # loaded into a bandit of its own config, every arm predicted: what a run would do with it
        probe = BanditSelector(check_state_values(state))
        probe.warm_start(state)
        for arm in probe.strategies:
            for batch_size in probe.config.bs_thresholds:
                value = probe.predict(arm, batch_size)
                if value is not None and not math.isfinite(value):
                    raise ValueError(f"it predicts {value} for {arm} at batch size {batch_size}")
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, ZeroDivisionError, OverflowError) as err:
        raise ValueError(
            f"{key}={path}: a damaged bandit state ({type(err).__name__}: {err}); remove the file or name another"
        ) from None
    saved_setting(key, path, state)
    return state


def write_state_file(
    target: OutputTarget, selector: BanditSelector, setting: dict, earlier: dict | None = None
) -> None:
    """Save ``selector``'s state, with the ``setting`` it was learned in, to ``target`` through a temporary file
    renamed into place; a state holding a NaN or an infinity is a ValueError naming the file, which is left as it
    was (JSON has no such numbers, and no run could start from them). ``earlier``: the state the run started from;
    the acceptance counts and calibration of its arms this selector lacks are kept (a run with fewer arms used to
    leave only its own in the file, and the next run with the others explored them all again)."""
    state = carried_forward(selector.state_dict(), earlier) | {SETTING_KEY: setting}
    try:
        text = json.dumps(state, sort_keys=True, allow_nan=False)
    except ValueError as err:
        raise ValueError(
            f"{target.key}={target.path}: not written, the bandit's state holds a NaN or an infinity ({err})"
        ) from None
    write_atomic(target.path, text + "\n")


def carried_forward(state: dict, earlier: dict | None) -> dict:
    """``state`` with the acceptance counts and calibration points of ``earlier``'s arms that ``state`` has none
    of (a bandit warm-started from such a file takes them for the arms it has, and ignores the others)."""
    if not earlier:
        return state
    acceptance = state["acceptance"]
    kept = {arm: counts for arm, counts in earlier.get("acceptance", {}).items() if arm not in acceptance}
    calibration = state.get("calibration")
    own = {point[0] for point in calibration or []}
    points = [p for p in earlier.get("calibration") or [] if p[0] not in own]
    if calibration is not None or points:
        calibration = (calibration or []) + points
    return state | {"acceptance": acceptance | kept, "calibration": calibration}
