"""Drafter checkpoints: a small directory (drafter_config.json + drafter.safetensors, and draft_vocab.safetensors
when the drafter has a reduced draft vocabulary) naming the policy it serves; ``train-drafter`` adds metrics.json
(what it measured, the selector's acceptance prior among it).

A fused drafter (EAGLE-3's input: `FusedEagleDrafter`) records `"extra_layers": [i, j, ...]` (the policy decoder
layers whose outputs it reads before the final-norm state) and holds `fuse.weight` [H, m*H], m = len + 1; absent or
[] means the final-norm state alone (every format_version 1 checkpoint)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fastrl.adaptive.depth_acceptance import geometric_hazard, is_chain
from fastrl.json_values import is_int
from fastrl.models.checkpoint import check_weights, file_problem, non_finite_names, read_safetensors
from fastrl.models.config import ModelConfig
from fastrl.models.decoder import CausalLM
from fastrl.speculative.drafter import EagleDrafter
from fastrl.speculative.fused_drafter import FusedEagleDrafter, check_extra_layers
from fastrl.strategy.strategy import Strategy
from fastrl.tensor_files import save_tensors

CONFIG_FILE = "drafter_config.json"
WEIGHTS_FILE = "drafter.safetensors"
DRAFT_VOCAB_FILE = "draft_vocab.safetensors"
METRICS_FILE = "metrics.json"
"""What ``train-drafter`` measured (held-out accept lengths among it), beside the checkpoint."""
SAVE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
FORMAT = "fastrl-eagle-drafter"
FORMAT_VERSION = 2  # 2: extra_layers (fused drafters); 1 is read as extra_layers = []


@dataclass
class DrafterInfo:
    """What a drafter checkpoint says about itself: the policy it was trained for and its weight version."""

    policy_name: str
    policy_hidden_size: int
    policy_vocab_size: int
    version: int
    layer_config: ModelConfig
    draft_vocab_size: int | None = None
    extra_layers: tuple[int, ...] = ()
    prior_hazard: float | None = None
    """Held-out greedy-chain hazard from the checkpoint's ``metrics.json`` (``chain_prior_hazard``), if any."""

    def build(self) -> EagleDrafter:
        """A drafter of this checkpoint's kind and geometry (random weights): fused when it has extra layers."""
        if self.extra_layers:
            return FusedEagleDrafter(self.layer_config, self.extra_layers)
        return EagleDrafter(self.layer_config)


def save_drafter(
    drafter: EagleDrafter, path: str | Path, policy_name: str, version: int = 0, dtype: str = "float32"
) -> None:
    """Write the drafter's weights (as `dtype`: float32, bfloat16 or float16), its draft vocabulary if it has one,
    and a config naming the policy (`policy_name`) and the weight `version`. ValueError, and nothing written, when a
    weight is NaN or infinite (as `dtype`: float16 overflows past 65504)."""
    if dtype not in SAVE_DTYPES:
        raise ValueError(f"save_drafter: dtype must be one of {sorted(SAVE_DTYPES)}, got {dtype!r}")
    directory = Path(path)
    tensors = cast_weights(drafter.state_dict(), dtype, f"save_drafter {directory}")  # a diverged one is never written
    directory.mkdir(parents=True, exist_ok=True)
    c = drafter.config
    meta: dict[str, Any] = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "policy": {"name": policy_name, "hidden_size": c.hidden_size, "vocab_size": c.vocab_size},
        "version": int(version),
        "layer": c.to_hf_dict(),
        "extra_layers": list(drafter.extra_layers),
    }
    vocab = drafter.draft_vocab
    meta["draft_vocab_size"] = None if vocab is None else int(vocab.numel())
    save_tensors(tensors, directory / WEIGHTS_FILE, metadata={"format": "pt"})
    if vocab is not None:
        save_tensors({"ids": vocab.detach().to("cpu").contiguous()}, directory / DRAFT_VOCAB_FILE)
    else:
        (directory / DRAFT_VOCAB_FILE).unlink(missing_ok=True)
    (directory / CONFIG_FILE).write_text(json.dumps(meta, indent=2) + "\n")


def cast_weights(tensors: dict[str, torch.Tensor], dtype: str, where: str) -> dict[str, torch.Tensor]:
    """``tensors`` on the CPU as ``dtype`` (a ``SAVE_DTYPES`` name), contiguous, for a file that will be loaded:
    ValueError naming ``where`` and the tensors when one is not floating point, is NaN or infinite, or overflows to
    infinity as ``dtype`` (float16 past 65504)."""
    check_weights(tensors, where)
    cast = {k: v.detach().to("cpu", SAVE_DTYPES[dtype]).contiguous() for k, v in tensors.items()}
    overflowed = non_finite_names(cast)
    if overflowed:
        largest = torch.finfo(SAVE_DTYPES[dtype]).max
        raise ValueError(
            f"{where}: weights hold NaN or infinity as {dtype} in {overflowed[:5]}: they overflow past {largest:g}, "
            f"the largest {dtype} value; write them as float32 or bfloat16"
        )
    return cast


def check_drafter_dir(path: str | Path) -> None:
    """ValueError naming ``path`` unless it is a directory: one that does not exist, or something else."""
    directory = Path(path)
    if directory.is_dir():
        return
    if not directory.exists():
        raise ValueError(f"drafter directory {path} does not exist")
    kind = "a file" if directory.is_file() else "not a directory"
    raise ValueError(f"drafter directory {path} is {kind}: give the directory holding {CONFIG_FILE}")


def read_drafter_info(path: str | Path) -> DrafterInfo:
    """Parse a drafter directory's config; ValueError naming the file when it is missing or malformed."""
    file = Path(path) / CONFIG_FILE
    problem = file_problem(file)
    if problem:
        raise ValueError(f"{path} is not a drafter checkpoint: {CONFIG_FILE} {problem}")
    try:
        meta = json.loads(file.read_text())
        if not isinstance(meta, dict):
            raise ValueError("not a JSON object")
        if meta.get("format") != FORMAT:
            raise ValueError(f"format is {meta.get('format')!r}, expected {FORMAT!r}")
        version = meta.get("format_version", 1)
        if not is_int(version) or not 1 <= version <= FORMAT_VERSION:
            raise ValueError(f"format_version is {version!r}, this fastrl reads 1 .. {FORMAT_VERSION}")
        policy = meta["policy"]
        extra = meta.get("extra_layers") or []
        if not isinstance(extra, list):
            raise ValueError(f"extra_layers must be a list of decoder layer indices, got {extra!r}")
        check_extra_layers(tuple(extra))
        if not isinstance(policy, dict) or not isinstance(meta["layer"], dict):
            raise ValueError("policy and layer must be JSON objects")
        draft_vocab = meta.get("draft_vocab_size")
        for key, value in (
            ("policy.hidden_size", policy["hidden_size"]),
            ("policy.vocab_size", policy["vocab_size"]),
            ("version", meta["version"]),
            ("draft_vocab_size", 1 if draft_vocab is None else draft_vocab),
        ):
            if not is_int(value) or value < (0 if key == "version" else 1):
                raise ValueError(f"{key} must be an integer >= {0 if key == 'version' else 1}, got {value!r}")
        layer = ModelConfig.from_hf_dict(meta["layer"])
        layer_fit = (layer.hidden_size, layer.vocab_size, layer.num_hidden_layers)
        if layer_fit != (policy["hidden_size"], policy["vocab_size"], 1):
            raise ValueError(
                f"layer has hidden size, vocabulary and layers {layer_fit}; a drafter's one layer has its policy's "
                f"{(policy['hidden_size'], policy['vocab_size'], 1)}"
            )
        info = DrafterInfo(
            policy_name=str(policy["name"]),
            policy_hidden_size=policy["hidden_size"],
            policy_vocab_size=policy["vocab_size"],
            version=meta["version"],
            layer_config=layer,
            draft_vocab_size=draft_vocab,
            extra_layers=tuple(extra),
        )
    except (KeyError, TypeError, ValueError, AttributeError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{file}: malformed drafter config ({exc})") from None
    return dataclasses.replace(info, prior_hazard=chain_prior_hazard(Path(path) / METRICS_FILE))


def chain_prior_hazard(file: Path) -> float | None:
    """Mean per-depth hazard of the fixed greedy chains whose acceptance ``train-drafter`` measured on held-out
    prompts (``metrics.json``: ``accept_lengths``, every temperature): from each record's ``mean_accepted_drafts``
    (uncut where a request finished, as the bandit's own per-depth counts are), or in a file written before that
    was kept, its ``mean_accept_length`` (which then counted the same); None without the file or such a chain.
    ValueError naming the file when it is there but malformed."""
    if not file.is_file():
        return None
    try:
        records = json.loads(file.read_text()).get("accept_lengths") or []
        hazards = []
        for record in records:
            if record.get("mean_accept_length") == 0:  # not measured (no decode round): no evidence either way
                continue
            strategy = Strategy.parse(str(record["strategy"]))
            if is_chain(strategy) and not strategy.stops_early:
                drafts = record.get("mean_accepted_drafts")
                accept = float(record["mean_accept_length"] if drafts is None else 1.0 + float(drafts))
                if not 1.0 <= accept <= strategy.steps + 1:  # NaN fails too
                    raise ValueError(
                        f"{strategy}'s mean_accept_length must be in [1, {strategy.steps + 1}], got {accept}"
                    )
                hazards.append(geometric_hazard(strategy.steps, accept))
    except (AttributeError, KeyError, TypeError, ValueError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{file}: malformed drafter metrics ({exc})") from None
    return sum(hazards) / len(hazards) if hazards else None


def check_drafter_fit(path: str | Path, info: DrafterInfo, pc: ModelConfig) -> None:
    """ValueError naming both when a drafter's hidden size, vocabulary or head geometry does not fit the policy."""
    problems = []
    if info.policy_hidden_size != pc.hidden_size:
        problems.append(f"hidden size {info.policy_hidden_size} != policy's {pc.hidden_size}")
    if info.policy_vocab_size != pc.vocab_size:
        problems.append(f"vocabulary {info.policy_vocab_size} != policy's {pc.vocab_size}")
    lc = info.layer_config
    if head_geometry(lc) != head_geometry(pc):
        problems.append(
            f"attention head geometry (num_attention_heads, num_key_value_heads, head_dim) {head_geometry(lc)} "
            f"!= policy's {head_geometry(pc)}"
        )
    if lc.model_type != pc.model_type:  # its layer mirrors the family of the policy it was trained for
        problems.append(f"its layer is a {lc.model_type} layer, the policy a {pc.model_type} model")
    if info.extra_layers and info.extra_layers[-1] >= pc.num_hidden_layers:
        problems.append(f"extra_layers {list(info.extra_layers)} outside the policy's {pc.num_hidden_layers} layers")
    if problems:
        raise ValueError(
            f"drafter {path} (trained for {info.policy_name!r}) does not fit this policy: " + "; ".join(problems)
        )


def head_geometry(config: ModelConfig) -> tuple[int, int, int]:
    """A config's attention head geometry: (num_attention_heads, num_key_value_heads, head_dim)."""
    return config.num_attention_heads, config.num_key_value_heads, config.head_dim


def read_drafter_weights(path: str | Path) -> dict[str, torch.Tensor]:
    """The drafter's stored tensors; ValueError naming the file when it is missing, truncated, not floating point
    or not finite."""
    weights = Path(path) / WEIGHTS_FILE
    problem = file_problem(weights)
    if problem:
        raise ValueError(f"{path}: {WEIGHTS_FILE} {problem}")
    tensors = read_safetensors(weights)
    check_weights(tensors, weights)
    return tensors


def check_drafter_tensors(path: str | Path, drafter: EagleDrafter, tensors: dict[str, torch.Tensor]) -> None:
    """ValueError naming the file and the keys when the stored tensors are not exactly `drafter`'s (missing,
    unexpected, or mis-shaped: e.g. a `fuse.weight` whose width does not match `extra_layers`)."""
    weights = Path(path) / WEIGHTS_FILE
    expected = drafter.state_dict()
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    shapes = [
        f"{k} {list(tensors[k].shape)} (expected {list(expected[k].shape)})"
        for k in expected
        if k in tensors and tensors[k].shape != expected[k].shape
    ]
    if missing or unexpected or shapes:
        kind = f"extra_layers {list(drafter.extra_layers)}" if drafter.extra_layers else "no extra_layers"
        raise ValueError(
            f"{weights}: missing {missing}, unexpected {unexpected}, mis-shaped {shapes} for a drafter with {kind}"
        )


def read_draft_vocab(path: str | Path, info: DrafterInfo) -> torch.Tensor | None:
    """The drafter's reduced draft vocabulary ([K] long token ids), or None when it drafts over the full one;
    ValueError naming the file when it is missing, malformed or disagrees with the config."""
    file = Path(path) / DRAFT_VOCAB_FILE
    if info.draft_vocab_size is None:
        if file.exists():  # a map the config does not name: read as the full vocabulary, it was dropped unsaid
            raise ValueError(
                f"{path}: {DRAFT_VOCAB_FILE} is there but {CONFIG_FILE} has no draft_vocab_size: the drafter's draft "
                "vocabulary is unknown; restore the config's draft_vocab_size, or delete the file to draft over the "
                "full vocabulary"
            )
        return None
    problem = file_problem(file)
    if problem:
        raise ValueError(
            f"{path}: config says draft_vocab_size={info.draft_vocab_size} but {DRAFT_VOCAB_FILE} {problem}"
        )
    ids = read_safetensors(file).get("ids")
    if ids is None or ids.dim() != 1 or ids.dtype != torch.int64 or ids.numel() != info.draft_vocab_size:
        raise ValueError(f"{file}: expected 'ids', a [{info.draft_vocab_size}] int64 tensor")
    if int(ids.min()) < 0 or int(ids.max()) >= info.policy_vocab_size or ids.unique().numel() != ids.numel():
        raise ValueError(f"{file}: ids must be distinct token ids in [0, {info.policy_vocab_size})")
    return ids


def check_drafter_files(path: str | Path, policy_config: ModelConfig) -> DrafterInfo:
    """Everything ``load_drafter`` checks, without a policy model: config, fit, weights readable and finite."""
    return read_checked_drafter(path, policy_config)[0]


def read_checked_drafter(
    path: str | Path, policy_config: ModelConfig | None = None
) -> tuple[DrafterInfo, dict[str, torch.Tensor], torch.Tensor | None]:
    """A drafter directory's config, tensors and draft vocabulary (``read_draft_vocab``), checked as
    ``load_drafter`` checks them (the fit to ``policy_config`` only when given: ``export-drafter`` has no policy):
    ValueError naming the file and what is wrong."""
    check_drafter_dir(path)
    info = read_drafter_info(path)
    if policy_config is not None:
        check_drafter_fit(path, info, policy_config)
    with torch.device("meta"):  # shapes only: no memory for the weights
        drafter = info.build()
    tensors = read_drafter_weights(path)
    check_drafter_tensors(path, drafter, tensors)
    return info, tensors, read_draft_vocab(path, info)


def load_drafter(
    path: str | Path, policy: CausalLM, device: torch.device | str = "cpu"
) -> tuple[EagleDrafter, DrafterInfo]:
    """Load a drafter for `policy` (a `FusedEagleDrafter` when the checkpoint has extra_layers); a drafter whose
    hidden size, vocabulary, head geometry or extra layers do not fit the policy is a ValueError naming both."""
    check_drafter_dir(path)
    info = read_drafter_info(path)
    check_drafter_fit(path, info, policy.config)
    drafter = info.build()
    tensors = read_drafter_weights(path)
    check_drafter_tensors(path, drafter, tensors)
    drafter.load_state_dict(tensors)
    drafter.set_draft_vocab(read_draft_vocab(path, info))
    drafter.prior_hazard = info.prior_hazard
    dtype = policy.lm_head.weight.dtype
    return drafter.to(device=device, dtype=dtype).eval(), info
