"""Load and save HF-format checkpoints (config.json + safetensors, single-file or sharded); never pickle."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor

from fastrl.models.config import ModelConfig
from fastrl.models.decoder import CausalLM

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def read_config(path: str | Path) -> ModelConfig:
    """The ModelConfig of an HF checkpoint directory (its config.json)."""
    directory = Path(path)
    file = directory / CONFIG_FILE
    if not file.is_file():
        raise ValueError(f"checkpoint directory {directory} has no {CONFIG_FILE}")
    try:
        d = json.loads(file.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{file} is not valid JSON: {err}") from None
    return ModelConfig.from_hf_dict(d)


def weight_files(directory: Path) -> dict[Path, list[str] | None]:
    """Safetensors files to read -> the tensor names to take from each (None: all of them)."""
    index = directory / INDEX_FILE
    if index.is_file():
        weight_map: dict[str, str] = json.loads(index.read_text()).get("weight_map", {})
        shards: dict[Path, list[str]] = {}
        for name, shard in weight_map.items():
            shards.setdefault(directory / shard, []).append(name)
        missing = sorted(f.name for f in shards if not f.is_file())
        if missing:
            raise ValueError(f"{index} names shards missing from {directory}: {missing}")
        return dict(shards.items())
    if (directory / WEIGHTS_FILE).is_file():
        return {directory / WEIGHTS_FILE: None}
    raise ValueError(f"checkpoint directory {directory} has no {WEIGHTS_FILE} or {INDEX_FILE} (only safetensors load)")


def read_tensors(directory: Path, dtype: torch.dtype, device: torch.device | str) -> dict[str, Tensor]:
    """Every tensor of the checkpoint, cast to dtype on device, HF rotary buffers dropped."""
    tensors: dict[str, Tensor] = {}
    for file, names in weight_files(directory).items():
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in names if names is not None else f.keys():
                if not name.endswith(IGNORED_SUFFIXES):
                    tensors[name] = f.get_tensor(name).to(device=device, dtype=dtype)
    return tensors


def check_tensors(model: CausalLM, tensors: dict[str, Tensor]) -> None:
    """Raises one ValueError listing missing, unexpected and mis-shaped tensors."""
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        expected.pop("lm_head.weight", None)
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    shapes = sorted(
        f"{name}: checkpoint {tuple(t.shape)} vs model {expected[name]}"
        for name, t in tensors.items()
        if name in expected and tuple(t.shape) != expected[name]
    )
    problems = [f"missing tensors {missing}"] if missing else []
    problems += [f"unexpected tensors {unexpected}"] if unexpected else []
    problems += [f"mis-shaped tensors {shapes}"] if shapes else []
    if problems:
        raise ValueError("checkpoint does not match the config: " + "; ".join(problems))


def load_model(path: str | Path, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> CausalLM:
    """Builds a CausalLM from a local HF directory (stored weights cast to dtype), in eval mode."""
    directory = Path(path)
    if not directory.is_dir():
        raise ValueError(f"checkpoint directory {directory} does not exist")
    config = read_config(directory)
    tensors = read_tensors(directory, dtype, device)
    if config.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)  # some tied checkpoints store the copy anyway
    with torch.device("meta"):
        model = CausalLM(config)
    check_tensors(model, tensors)
    model.load_state_dict(tensors, strict=False, assign=True)
    model.tie_weights()
    return model.eval()


def save_model(model: CausalLM, path: str | Path, dtype: torch.dtype | None = None) -> None:
    """Writes config.json + model.safetensors (tied: no lm_head.weight) loadable by `load_model` and by
    transformers' AutoModelForCausalLM. `dtype` None keeps the model's dtype."""
    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    state = model.state_dict()
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight")
    dtype = dtype or model.model.embed_tokens.weight.dtype
    tensors = {name: t.detach().to(device="cpu", dtype=dtype).contiguous() for name, t in state.items()}
    config = model.config.to_hf_dict(dtype=dtype)
    save_file(tensors, str(directory / WEIGHTS_FILE), metadata={"format": "pt"})
    (directory / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
