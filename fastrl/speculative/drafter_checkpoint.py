"""Drafter checkpoints: a small directory (drafter_config.json + drafter.safetensors) naming the policy it serves."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from fastrl.models.checkpoint import check_weights, read_safetensors
from fastrl.models.config import ModelConfig
from fastrl.models.decoder import CausalLM
from fastrl.speculative.drafter import EagleDrafter

CONFIG_FILE = "drafter_config.json"
WEIGHTS_FILE = "drafter.safetensors"
FORMAT = "fastrl-eagle-drafter"
FORMAT_VERSION = 1


@dataclass
class DrafterInfo:
    """What a drafter checkpoint says about itself: the policy it was trained for and its weight version."""

    policy_name: str
    policy_hidden_size: int
    policy_vocab_size: int
    version: int
    layer_config: ModelConfig


def save_drafter(drafter: EagleDrafter, path: str | Path, policy_name: str, version: int = 0) -> None:
    """Write the drafter's weights and a config naming the policy (`policy_name`) and the weight `version`."""
    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    c = drafter.config
    meta: dict[str, Any] = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "policy": {"name": policy_name, "hidden_size": c.hidden_size, "vocab_size": c.vocab_size},
        "version": int(version),
        "layer": c.to_hf_dict(),
    }
    tensors = {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in drafter.state_dict().items()}
    save_file(tensors, str(directory / WEIGHTS_FILE), metadata={"format": "pt"})
    (directory / CONFIG_FILE).write_text(json.dumps(meta, indent=2) + "\n")


def read_drafter_info(path: str | Path) -> DrafterInfo:
    """Parse a drafter directory's config; ValueError naming the file when it is missing or malformed."""
    file = Path(path) / CONFIG_FILE
    if not file.is_file():
        raise ValueError(f"{path} is not a drafter checkpoint: {CONFIG_FILE} is missing")
    try:
        meta = json.loads(file.read_text())
        if not isinstance(meta, dict):
            raise ValueError("not a JSON object")
        if meta.get("format") != FORMAT:
            raise ValueError(f"format is {meta.get('format')!r}, expected {FORMAT!r}")
        policy = meta["policy"]
        return DrafterInfo(
            policy_name=str(policy["name"]),
            policy_hidden_size=int(policy["hidden_size"]),
            policy_vocab_size=int(policy["vocab_size"]),
            version=int(meta["version"]),
            layer_config=ModelConfig.from_hf_dict(meta["layer"]),
        )
    except (KeyError, TypeError, ValueError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{file}: malformed drafter config ({exc})") from None


def check_drafter_fit(path: str | Path, info: DrafterInfo, pc: ModelConfig) -> None:
    """ValueError naming both when a drafter's hidden size, vocabulary or head geometry does not fit the policy."""
    problems = []
    if info.policy_hidden_size != pc.hidden_size:
        problems.append(f"hidden size {info.policy_hidden_size} != policy's {pc.hidden_size}")
    if info.policy_vocab_size != pc.vocab_size:
        problems.append(f"vocabulary {info.policy_vocab_size} != policy's {pc.vocab_size}")
    lc = info.layer_config
    if (lc.num_attention_heads, lc.num_key_value_heads, lc.head_dim) != (
        pc.num_attention_heads,
        pc.num_key_value_heads,
        pc.head_dim,
    ):
        problems.append("attention head geometry differs from the policy's")
    if problems:
        raise ValueError(
            f"drafter {path} (trained for {info.policy_name!r}) does not fit this policy: " + "; ".join(problems)
        )


def read_drafter_weights(path: str | Path) -> dict[str, torch.Tensor]:
    """The drafter's stored tensors; ValueError naming the file when it is missing, truncated, not floating point
    or not finite."""
    weights = Path(path) / WEIGHTS_FILE
    if not weights.is_file():
        raise ValueError(f"{path}: {WEIGHTS_FILE} is missing")
    tensors = read_safetensors(weights)
    check_weights(tensors, weights)
    return tensors


def check_drafter_files(path: str | Path, policy_config: ModelConfig) -> DrafterInfo:
    """Everything ``load_drafter`` checks, without a policy model: config, fit, weights readable and finite."""
    if not Path(path).is_dir():
        raise ValueError(f"drafter directory {path} does not exist")
    info = read_drafter_info(path)
    check_drafter_fit(path, info, policy_config)
    read_drafter_weights(path)
    return info


def load_drafter(
    path: str | Path, policy: CausalLM, device: torch.device | str = "cpu"
) -> tuple[EagleDrafter, DrafterInfo]:
    """Load a drafter for `policy`; a drafter whose hidden size, vocabulary or head geometry does not fit the
    policy is a ValueError naming both."""
    if not Path(path).is_dir():
        raise ValueError(f"drafter directory {path} does not exist")
    info = read_drafter_info(path)
    check_drafter_fit(path, info, policy.config)
    drafter = EagleDrafter(info.layer_config)
    weights = Path(path) / WEIGHTS_FILE
    tensors = read_drafter_weights(path)
    expected = drafter.state_dict()
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    shapes = [k for k in expected if k in tensors and tensors[k].shape != expected[k].shape]
    if missing or unexpected or shapes:
        raise ValueError(f"{weights}: missing {missing}, unexpected {unexpected}, mis-shaped {shapes}")
    drafter.load_state_dict(tensors)
    dtype = policy.lm_head.weight.dtype
    return drafter.to(device=device, dtype=dtype).eval(), info
