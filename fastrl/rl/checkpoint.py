"""Training checkpoints: everything a GRPO run needs to continue exactly, as files that load without pickle.

Layout of a checkpoint directory:

    trainer_state.json        step (steps completed), policy version, the GRPOConfig, Python RNG state, and what the
                              checkpoint holds: has_drafter, cotrain_workers and history_workers (the worker slots
                              whose files cotrain/ and history/ hold; 0: none)
    rng.safetensors           torch RNG states (CPU, and CUDA devices when present)
    policy/                   the policy, HF format (fastrl.models.save_model: config.json + model.safetensors)
    reference/                the frozen KL reference (only when kl_coef > 0), same format
    optimizer.safetensors     AdamW per-parameter tensors; optimizer.json: param groups and scalars
    drafter/                  the backend's drafter (fastrl.speculative.drafter_checkpoint layout, with its version
                              and its reduced draft vocabulary when it has one);
                              absent when the backend runs without a drafter
    rollout_selector.json     the backend's strategy-selector state (bandit windows, ...)
    cotrain/                  each rollout worker's co-training state, worker_<i>.safetensors (feature buffer,
                              drafter optimiser) + worker_<i>.json (buffer layout, step counters); absent without
                              co-training
    history/                  each rollout worker's history index (prompts and kept responses), worker_<i>.safetensors
                              (fastrl.rl.history_checkpoint); absent when no strategy drafts from history

Saving writes to a sibling temporary directory and renames it into place, so a crash never leaves a
half-written checkpoint under the final name.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fastrl.json_values import read_json
from fastrl.models.checkpoint import load_model, read_safetensors, save_model
from fastrl.models.config import ModelConfig
from fastrl.models.decoder import CausalLM
from fastrl.rl.cotrain_checkpoint import read_cotrain_states, save_cotrain_states
from fastrl.rl.history_checkpoint import read_history_states, save_history_states
from fastrl.rl.optimizer_state import META_FILE as OPTIMIZER_META
from fastrl.rl.optimizer_state import TENSORS_FILE as OPTIMIZER_TENSORS
from fastrl.rl.optimizer_state import load_optimizer, save_optimizer
from fastrl.rl.seeding import GlobalRngState
from fastrl.rollout.backend import RolloutBackend
from fastrl.rollout.types import DRAFT_VOCAB_KEY, EXTRA_LAYERS_KEY
from fastrl.speculative.drafter import EagleDrafter
from fastrl.speculative.drafter_checkpoint import (
    read_draft_vocab,
    read_drafter_info,
    read_drafter_weights,
    save_drafter,
)
from fastrl.speculative.fused_drafter import FusedEagleDrafter
from fastrl.tensor_files import save_tensors

FORMAT = "fastrl-grpo-checkpoint"
FORMAT_VERSION = 1
STATE_FILE = "trainer_state.json"
RNG_FILE = "rng.safetensors"
POLICY_DIR = "policy"
REFERENCE_DIR = "reference"
DRAFTER_DIR = "drafter"
ROLLOUT_SELECTOR_FILE = "rollout_selector.json"
COTRAIN_DIR = "cotrain"
HISTORY_DIR = "history"
# trainer_state.json's counts of the worker slots cotrain/ and history/ hold (absent from checkpoints written before
# they were recorded: those folders are then read as found)
COTRAIN_WORKERS = "cotrain_workers"
HISTORY_WORKERS = "history_workers"


@dataclass
class TrainerState:
    """The trainer's own counters and settings: `step` = steps completed (the next step to run),
    `policy_version` = the version of the saved policy weights, `config` = the GRPOConfig as a dict, `task` = the
    task's settings as a dict (None: a task without a dataclass ``config``, or a checkpoint written before they
    were kept), `settings` = the caller's other settings that change what the run computes (`GRPOTrainer.settings`;
    None: none given, or a checkpoint written before they were kept)."""

    step: int
    policy_version: int
    config: dict
    task: dict | None = None
    settings: dict | None = None


def save_training_checkpoint(
    path: str | Path,
    state: TrainerState,
    policy: CausalLM,
    optimizer: torch.optim.Optimizer,
    backend: RolloutBackend,
    reference: CausalLM | None = None,
    tokenizer: Any = None,
    drafter_config: ModelConfig | None = None,
) -> Path:
    """Write a checkpoint of the whole run to `path` (replacing one already there); returns the path. An HF
    ``tokenizer`` is saved beside the policy, so `policy/` is a checkpoint every command takes as `model=`.
    ``drafter_config`` is the layer config of the drafter the backend runs (its checkpoint's), None for a fresh
    drafter (the policy's, as the workers build it)."""
    final = Path(path)
    tmp = final.with_name(final.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    try:  # a save that fails (a full disk) or is stopped leaves no half-written directory to hold the space
        rng = GlobalRngState.capture()
        meta = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "step": state.step,
            "policy_version": state.policy_version,
            "config": state.config,
            "task": state.task,
            "settings": state.settings,
            "python_rng": rng.python,
            "has_drafter": bool(backend.drafter_state()[1]),
        }
        rng_tensors = {"torch_cpu": rng.torch_cpu}
        rng_tensors.update({f"torch_cuda.{i}": s for i, s in enumerate(rng.torch_cuda)})
        save_tensors(rng_tensors, tmp / RNG_FILE)
        save_model(policy, tmp / POLICY_DIR)
        if hasattr(tokenizer, "save_pretrained"):
            tokenizer.save_pretrained(tmp / POLICY_DIR)
        if reference is not None:
            save_model(reference, tmp / REFERENCE_DIR)
        save_optimizer(optimizer, tmp)
        _save_drafter(backend, drafter_config or policy.config, tmp / DRAFTER_DIR)
        (tmp / ROLLOUT_SELECTOR_FILE).write_text(json.dumps(backend.selector_state(), indent=2) + "\n")
        meta[COTRAIN_WORKERS] = save_cotrain_states(backend.cotrain_state(), tmp / COTRAIN_DIR)
        meta[HISTORY_WORKERS] = save_history_states(backend.history_state(), tmp / HISTORY_DIR)
        # last: a checkpoint is one only once its state file is there (a run killed while writing leaves none)
        (tmp / STATE_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    return final


def load_training_checkpoint(
    path: str | Path,
    policy: CausalLM,
    optimizer: torch.optim.Optimizer,
    backend: RolloutBackend,
    reference: CausalLM | None = None,
) -> TrainerState:
    """Restore a checkpoint in place: policy (and reference) weights, optimizer, the backend's drafter,
    strategy-selector and co-training state, its workers' history indexes, the global RNG states. The caller pushes
    the policy weights to the backend. Every file is checked before anything is restored: a missing, truncated or
    malformed one is a ValueError naming it (a worker file counts as missing against the slots trainer_state.json
    recorded)."""
    directory = Path(path)
    meta = read_trainer_state(directory)
    rollout_selector, rng_tensors = _read_small_files(directory)
    try:
        backend.check_selector_state(rollout_selector)
    except ValueError as err:
        raise ValueError(f"{directory / ROLLOUT_SELECTOR_FILE}: {err}") from None
    drafter = _read_drafter(directory, meta, backend)
    cotrain = read_cotrain_states(directory / COTRAIN_DIR, meta.get(COTRAIN_WORKERS))
    history = read_history_states(directory / HISTORY_DIR, policy.config.vocab_size, meta.get(HISTORY_WORKERS))
    _copy_weights(directory / POLICY_DIR, policy)
    if reference is not None:
        if not (directory / REFERENCE_DIR).is_dir():
            raise ValueError(
                f"{directory} has no {REFERENCE_DIR}/ (saved with kl_coef = 0); cannot restore the KL reference"
            )
        _copy_weights(directory / REFERENCE_DIR, reference)
    load_optimizer(optimizer, directory)
    if drafter is not None:
        backend.load_drafter_state(*drafter)
    backend.load_selector_state(rollout_selector)
    if cotrain:
        backend.load_cotrain_state(cotrain)
    if history:
        backend.load_history_state(history)
    tensors = rng_tensors
    cuda = [tensors[f"torch_cuda.{i}"] for i in range(sum(k.startswith("torch_cuda.") for k in tensors))]
    GlobalRngState(python=meta["python_rng"], torch_cpu=tensors["torch_cpu"], torch_cuda=cuda).restore()
    task = meta.get("task") if isinstance(meta.get("task"), dict) else None
    settings = meta.get("settings") if isinstance(meta.get("settings"), dict) else None
    return TrainerState(int(meta["step"]), int(meta["policy_version"]), meta["config"], task, settings)


def read_trainer_state(path: str | Path) -> dict:
    """The parsed trainer_state.json; ValueError naming the file when it is missing, not valid JSON, not a GRPO
    checkpoint, or holds a step, version or worker count that is not an integer >= 0."""
    if not Path(path).is_dir():
        raise ValueError(f"resume: checkpoint directory {path} does not exist")
    file = Path(path) / STATE_FILE
    if not file.is_file():
        raise ValueError(f"{path} is not a GRPO checkpoint: {STATE_FILE} is missing")
    meta = read_json(file)
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        found = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
        raise ValueError(f"{file}: format is {found!r}, expected {FORMAT!r}")
    for key in ("step", "policy_version", *(k for k in (COTRAIN_WORKERS, HISTORY_WORKERS) if k in meta)):
        value = meta.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{file}: {key!r} must be an integer >= 0, got {value!r}")
    if not isinstance(meta.get("config"), dict):
        raise ValueError(f"{file}: 'config' must be a JSON object (the run's GRPOConfig)")
    if not isinstance(meta.get("settings", {}), dict | None):
        raise ValueError(f"{file}: 'settings' must be a JSON object or null (the run's settings by key)")
    if not isinstance(meta.get("python_rng"), list):
        raise ValueError(f"{file}: 'python_rng' is missing or malformed")
    return meta


def check_training_checkpoint(path: str | Path) -> None:
    """Refuse a checkpoint whose small files are damaged before anything is built for the run: trainer_state.json,
    rollout_selector.json and rng.safetensors are read and checked as ``load_training_checkpoint`` reads them, with
    its messages (a ValueError naming the file). What needs the backend or the policy (the selector state's fit,
    the drafter, the workers' files) and the optimizer's tensors (large) are checked when the checkpoint loads."""
    directory = Path(path)
    read_trainer_state(directory)
    _read_selector_and_rng(directory)


def _read_small_files(directory: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """rollout_selector.json and rng.safetensors, read and checked; optimizer files checked for readability."""
    rollout_selector, rng = _read_selector_and_rng(directory)
    if (directory / OPTIMIZER_TENSORS).is_file():
        read_safetensors(directory / OPTIMIZER_TENSORS)
    if (directory / OPTIMIZER_META).is_file():
        read_json(directory / OPTIMIZER_META)
    return rollout_selector, rng


def _read_selector_and_rng(directory: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """rollout_selector.json (a JSON object) and rng.safetensors (with 'torch_cpu'), read and checked."""
    rollout_selector = read_json(directory / ROLLOUT_SELECTOR_FILE)
    if not isinstance(rollout_selector, dict):
        raise ValueError(f"{directory / ROLLOUT_SELECTOR_FILE} must hold a JSON object")
    if not (directory / RNG_FILE).is_file():
        raise ValueError(f"{directory / RNG_FILE} is missing")
    rng = read_safetensors(directory / RNG_FILE)
    if "torch_cpu" not in rng:
        raise ValueError(f"{directory / RNG_FILE} lacks the tensor 'torch_cpu'")
    return rollout_selector, rng


def _read_drafter(directory: Path, meta: dict, backend: RolloutBackend) -> tuple[int, dict[str, torch.Tensor]] | None:
    """The saved drafter (version, weights), None when the run had none; ValueError when drafter/ is missing but
    the checkpoint (or, for older checkpoints, the backend) has a drafter."""
    folder = directory / DRAFTER_DIR
    if not folder.is_dir():
        expected = meta["has_drafter"] if "has_drafter" in meta else bool(backend.drafter_state()[1])
        if expected:
            raise ValueError(f"{directory}: {DRAFTER_DIR}/ is missing, but the run has a drafter to restore")
        return None
    info = read_drafter_info(folder)
    state = read_drafter_weights(folder)
    vocab = read_draft_vocab(folder, info)
    if vocab is not None:
        state[DRAFT_VOCAB_KEY] = vocab
    if info.extra_layers:
        state[EXTRA_LAYERS_KEY] = torch.tensor(info.extra_layers, dtype=torch.long)
    return info.version, state


def _save_drafter(backend: RolloutBackend, config: ModelConfig, directory: Path) -> None:
    """The backend's drafter, whose layer config is ``config``, in the drafter-checkpoint layout (loadable by
    `load_drafter`), if it has one."""
    version, tensors = backend.drafter_state()
    if not tensors:
        return
    layers = tuple(tensors[EXTRA_LAYERS_KEY].tolist()) if EXTRA_LAYERS_KEY in tensors else ()
    drafter = FusedEagleDrafter(config, layers) if layers else EagleDrafter(config)
    ids = (DRAFT_VOCAB_KEY, EXTRA_LAYERS_KEY)
    weights = {k: v.to("cpu", torch.float32) for k, v in tensors.items() if k not in ids}
    drafter.load_state_dict(weights, strict=True)
    if DRAFT_VOCAB_KEY in tensors:
        drafter.set_draft_vocab(tensors[DRAFT_VOCAB_KEY])
    save_drafter(drafter, directory, policy_name=POLICY_DIR, version=version)


def _copy_weights(directory: Path, model: CausalLM) -> None:
    """Load the HF checkpoint at `directory` into `model` in place (parameters keep their identity, so an
    optimizer built over them stays valid)."""
    loaded = load_model(directory, dtype=next(model.parameters()).dtype)
    model.load_state_dict(loaded.state_dict())
