"""Training checkpoints: everything a GRPO run needs to continue exactly, as files that load without pickle.

Layout of a checkpoint directory:

    trainer_state.json        step (steps completed), policy version, the GRPOConfig, Python RNG state
    rng.safetensors           torch RNG states (CPU, and CUDA devices when present)
    policy/                   the policy, HF format (fastrl.models.save_model: config.json + model.safetensors)
    reference/                the frozen KL reference (only when kl_coef > 0), same format
    optimizer.safetensors     AdamW per-parameter tensors; optimizer.json: param groups and scalars
    drafter/                  the backend's drafter (fastrl.spec.drafter_checkpoint layout, with its version);
                              absent when the backend runs without a drafter
    rollout_policy.json       the backend's strategy-policy state (bandit windows, ...)

Saving writes to a sibling temporary directory and renames it into place, so a crash never leaves a
half-written checkpoint under the final name.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from fastrl.models.checkpoint import load_model, save_model
from fastrl.models.decoder import CausalLM
from fastrl.rl.optimizer_state import load_optimizer, save_optimizer
from fastrl.rl.seeding import GlobalRngState
from fastrl.rollout.backend import RolloutBackend
from fastrl.spec.drafter import EagleDrafter
from fastrl.spec.drafter_checkpoint import WEIGHTS_FILE as DRAFTER_WEIGHTS
from fastrl.spec.drafter_checkpoint import read_drafter_info, save_drafter

FORMAT = "fastrl-grpo-checkpoint"
FORMAT_VERSION = 1
STATE_FILE = "trainer_state.json"
RNG_FILE = "rng.safetensors"
POLICY_DIR = "policy"
REFERENCE_DIR = "reference"
DRAFTER_DIR = "drafter"
ROLLOUT_POLICY_FILE = "rollout_policy.json"


@dataclass
class TrainerState:
    """The trainer's own counters and settings: `step` = steps completed (the next step to run),
    `policy_version` = the version of the saved policy weights, `config` = the GRPOConfig as a dict."""

    step: int
    policy_version: int
    config: dict


def save_training_checkpoint(
    path: str | Path,
    state: TrainerState,
    policy: CausalLM,
    optimizer: torch.optim.Optimizer,
    backend: RolloutBackend,
    reference: CausalLM | None = None,
) -> Path:
    """Write a checkpoint of the whole run to `path` (replacing one already there); returns the path."""
    final = Path(path)
    tmp = final.with_name(final.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    rng = GlobalRngState.capture()
    meta = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "step": state.step,
        "policy_version": state.policy_version,
        "config": state.config,
        "python_rng": rng.python,
    }
    (tmp / STATE_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    rng_tensors = {"torch_cpu": rng.torch_cpu}
    rng_tensors.update({f"torch_cuda.{i}": s for i, s in enumerate(rng.torch_cuda)})
    save_file(rng_tensors, str(tmp / RNG_FILE))
    save_model(policy, tmp / POLICY_DIR)
    if reference is not None:
        save_model(reference, tmp / REFERENCE_DIR)
    save_optimizer(optimizer, tmp)
    _save_drafter(backend, policy, tmp / DRAFTER_DIR)
    (tmp / ROLLOUT_POLICY_FILE).write_text(json.dumps(backend.policy_state(), indent=2) + "\n")
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
    """Restore a checkpoint in place: policy (and reference) weights, optimizer, the backend's drafter and
    strategy-policy state, the global RNG states. The caller pushes the policy weights to the backend."""
    directory = Path(path)
    meta = read_trainer_state(directory)
    _copy_weights(directory / POLICY_DIR, policy)
    if reference is not None:
        if not (directory / REFERENCE_DIR).is_dir():
            raise ValueError(
                f"{directory} has no {REFERENCE_DIR}/ (saved with kl_coef = 0); cannot restore the KL reference"
            )
        _copy_weights(directory / REFERENCE_DIR, reference)
    load_optimizer(optimizer, directory)
    if (directory / DRAFTER_DIR).is_dir():
        info = read_drafter_info(directory / DRAFTER_DIR)
        backend.load_drafter_state(info.version, load_file(str(directory / DRAFTER_DIR / DRAFTER_WEIGHTS)))
    backend.load_policy_state(json.loads((directory / ROLLOUT_POLICY_FILE).read_text()))
    tensors = load_file(str(directory / RNG_FILE))
    cuda = [tensors[f"torch_cuda.{i}"] for i in range(sum(k.startswith("torch_cuda.") for k in tensors))]
    GlobalRngState(python=meta["python_rng"], torch_cpu=tensors["torch_cpu"], torch_cuda=cuda).restore()
    return TrainerState(step=int(meta["step"]), policy_version=int(meta["policy_version"]), config=meta["config"])


def read_trainer_state(path: str | Path) -> dict:
    """The parsed trainer_state.json; ValueError naming the file when it is missing or not a GRPO checkpoint."""
    file = Path(path) / STATE_FILE
    if not file.is_file():
        raise ValueError(f"{path} is not a GRPO checkpoint: {STATE_FILE} is missing")
    meta = json.loads(file.read_text())
    if meta.get("format") != FORMAT:
        raise ValueError(f"{file}: format is {meta.get('format')!r}, expected {FORMAT!r}")
    return meta


def _save_drafter(backend: RolloutBackend, policy: CausalLM, directory: Path) -> None:
    """The backend's drafter in the drafter-checkpoint layout (loadable by `load_drafter`), if it has one."""
    version, tensors = backend.drafter_state()
    if not tensors:
        return
    drafter = EagleDrafter(policy.config)
    drafter.load_state_dict({k: v.to("cpu", torch.float32) for k, v in tensors.items()}, strict=True)
    save_drafter(drafter, directory, policy_name=POLICY_DIR, version=version)


def _copy_weights(directory: Path, model: CausalLM) -> None:
    """Load the HF checkpoint at `directory` into `model` in place (parameters keep their identity, so an
    optimizer built over them stays valid)."""
    loaded = load_model(directory, dtype=next(model.parameters()).dtype)
    model.load_state_dict(loaded.state_dict())
