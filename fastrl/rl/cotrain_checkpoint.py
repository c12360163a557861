"""The rollout workers' co-training state in a training checkpoint: one safetensors and one JSON file per worker."""

from __future__ import annotations

import json
from pathlib import Path

from fastrl.json_values import read_json
from fastrl.models.checkpoint import read_safetensors
from fastrl.rollout.worker_cotrain import CotrainState
from fastrl.tensor_files import save_tensors


def save_cotrain_states(states: list[CotrainState], directory: Path) -> None:
    """``worker_<i>.safetensors`` and ``worker_<i>.json`` for each worker slot i (nothing when ``states`` is empty)."""
    if not states:
        return
    directory.mkdir(parents=True)
    for i, state in enumerate(states):
        tensors = {k: v.contiguous() for k, v in state.tensors.items()}
        save_tensors(tensors, directory / f"worker_{i}.safetensors")
        (directory / f"worker_{i}.json").write_text(json.dumps(state.meta) + "\n")


def read_cotrain_states(directory: Path) -> list[CotrainState]:
    """What ``save_cotrain_states`` wrote, in slot order ([] when ``directory`` does not exist); ValueError naming
    the file when one is missing or unreadable."""
    if not directory.is_dir():
        return []
    count = len(list(directory.glob("worker_*.json")))
    states = []
    for i in range(count):
        meta_file, tensor_file = directory / f"worker_{i}.json", directory / f"worker_{i}.safetensors"
        if not meta_file.is_file() or not tensor_file.is_file():
            raise ValueError(f"{directory}: worker_{i}.json or worker_{i}.safetensors is missing")
        meta = read_json(meta_file)
        if not isinstance(meta, dict) or not {"buffer", "trainer"} <= set(meta):
            raise ValueError(f"{meta_file}: expected an object with 'buffer' and 'trainer'")
        states.append(CotrainState(read_safetensors(tensor_file), meta))
    return states
