"""The rollout workers' co-training state in a training checkpoint: one safetensors and one JSON file per worker."""

from __future__ import annotations

import json
from pathlib import Path

from fastrl.json_values import read_json
from fastrl.models.checkpoint import read_safetensors
from fastrl.rl.worker_files import worker_slots
from fastrl.rollout.worker_cotrain import CotrainState
from fastrl.tensor_files import save_tensors


def save_cotrain_states(states: list[CotrainState], directory: Path) -> int:
    """``worker_<i>.safetensors`` and ``worker_<i>.json`` for each worker slot i (nothing when ``states`` is empty);
    returns the number of slots written (what the checkpoint records as ``cotrain_workers``)."""
    if not states:
        return 0
    directory.mkdir(parents=True)
    for i, state in enumerate(states):
        tensors = {k: v.contiguous() for k, v in state.tensors.items()}
        save_tensors(tensors, directory / f"worker_{i}.safetensors")
        (directory / f"worker_{i}.json").write_text(json.dumps(state.meta) + "\n")
    return len(states)


def read_cotrain_states(directory: Path, workers: int | None = None) -> list[CotrainState]:
    """What ``save_cotrain_states`` wrote, in slot order: the ``workers`` slots the checkpoint recorded (None, a
    checkpoint written before it recorded them: the slots found; [] when ``directory`` does not exist). ValueError
    naming the file when one is missing or unreadable."""
    count = worker_slots(directory, workers, ("worker_{}.json", "worker_{}.safetensors"), "co-training state")
    states = []
    for i in range(count):
        meta_file, tensor_file = directory / f"worker_{i}.json", directory / f"worker_{i}.safetensors"
        meta = read_json(meta_file)
        if not isinstance(meta, dict) or not {"buffer", "trainer"} <= set(meta):
            raise ValueError(f"{meta_file}: expected an object with 'buffer' and 'trainer'")
        states.append(CotrainState(read_safetensors(tensor_file), meta))
    return states
