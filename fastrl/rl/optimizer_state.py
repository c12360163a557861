"""Optimizer state to and from files without pickle: tensors in safetensors, everything else in JSON."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from fastrl.tensor_files import save_tensors

TENSORS_FILE = "optimizer.safetensors"
META_FILE = "optimizer.json"
TUPLE_KEYS = ("betas",)  # param-group entries that torch keeps as tuples (JSON turns them into lists)


def save_optimizer(optimizer: torch.optim.Optimizer, directory: str | Path) -> None:
    """Write `optimizer.state_dict()`: per-parameter tensors (exp_avg, step, ...) as ``state.<param>.<key>`` in
    optimizer.safetensors, non-tensor per-parameter values and the param groups in optimizer.json."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = optimizer.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, object]] = {}
    for param_id, entries in state["state"].items():
        for key, value in entries.items():
            if isinstance(value, torch.Tensor):
                tensors[f"state.{param_id}.{key}"] = value.detach().to("cpu").contiguous()
            else:
                scalars.setdefault(str(param_id), {})[key] = value
    meta = {"param_groups": state["param_groups"], "scalars": scalars}
    save_tensors(tensors, directory / TENSORS_FILE, metadata={"format": "pt"})
    (directory / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")


def load_optimizer(optimizer: torch.optim.Optimizer, directory: str | Path) -> None:
    """Restore what `save_optimizer` wrote into `optimizer` (built over the same parameters, in the same order).
    A file whose parameter groups do not match raises ValueError."""
    directory = Path(directory)
    for name in (TENSORS_FILE, META_FILE):
        if not (directory / name).is_file():
            raise ValueError(f"{directory} holds no optimizer state: {name} is missing")
    meta = json.loads((directory / META_FILE).read_text())
    groups = meta["param_groups"]
    for group in groups:
        for key in TUPLE_KEYS:
            if isinstance(group.get(key), list):
                group[key] = tuple(group[key])
    current = optimizer.state_dict()["param_groups"]
    if [len(g["params"]) for g in groups] != [len(g["params"]) for g in current]:
        raise ValueError(
            f"{directory / META_FILE}: parameter groups of sizes {[len(g['params']) for g in groups]} do not match "
            f"the optimizer's {[len(g['params']) for g in current]}"
        )
    state: dict[int, dict[str, object]] = {}
    for name, tensor in load_file(str(directory / TENSORS_FILE), device="cpu").items():
        _, param_id, key = name.split(".", 2)
        state.setdefault(int(param_id), {})[key] = tensor
    for param_id, entries in meta["scalars"].items():
        state.setdefault(int(param_id), {}).update(entries)
    optimizer.load_state_dict({"state": state, "param_groups": groups})
