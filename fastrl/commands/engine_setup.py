"""Building an engine from command configs: policy model, drafter and strategy selector."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from fastrl.adaptive.bandit_config import BanditConfig
from fastrl.adaptive.ema_config import EmaConfig
from fastrl.adaptive.factory import build_selector
from fastrl.assets_path import assets_dir, bundled_drafter_dir, bundled_model_dir
from fastrl.engine.calibration import calibrate_engine
from fastrl.engine.config import EngineConfig
from fastrl.engine.engine import Engine
from fastrl.engine.machine import available_bytes
from fastrl.models.checkpoint import load_model, read_config
from fastrl.models.config import ModelConfig
from fastrl.models.decoder import CausalLM
from fastrl.models.kv_cache import KvShape
from fastrl.models.named import is_named_model, named_model_dir, shipped_drafter_dir
from fastrl.models.tokenizer import load_tokenizer
from fastrl.speculative.draft_vocab import wider_than
from fastrl.speculative.drafter import EagleDrafter
from fastrl.speculative.drafter_checkpoint import load_drafter
from fastrl.strategy.selector import StrategySelector


def resolve_model_dir(model: str, key: str = "model") -> Path:
    """The checkpoint directory a `model=` key names: empty = the bundled model, a named model (`smollm2`) = its
    converted checkpoint in the cache (converted on first use), else a directory. ValueError naming ``key`` when it
    does not exist or has no readable config.json; ImportError naming the pip extra when a named model's package is
    missing."""
    if is_named_model(model):
        try:
            return named_model_dir(model)
        except ImportError as err:
            raise ImportError(f"{key}={model}: {err}") from None
    directory = Path(model) if model else bundled_model_dir()
    if directory.is_file():
        raise ValueError(f"{key}={model} is a file; give a checkpoint directory (config.json, model.safetensors)")
    if not directory.is_dir():
        raise ValueError(f"{key}={model}: checkpoint directory {directory} does not exist")
    try:
        read_config(directory)
    except ValueError as err:
        raise ValueError(f"{key}={model}: {err}") from None
    return directory


def request_context(config: ModelConfig, prompt_lengths: list[int], max_new_tokens: int) -> int:
    """The context a decode run needs: its longest prompt plus max_new_tokens (and the token that is fed last),
    at most the model's; the KV cache is sized to it instead of the model's whole context."""
    longest = max(prompt_lengths, default=1)
    return max(2, min(config.max_position_embeddings, longest + max_new_tokens + 1))


def check_kv_memory(
    key: str, config: ModelConfig, slots: int, dtype: torch.dtype, device: str, length: int | None = None
) -> None:
    """ValueError naming ``key`` (the batch size) when a KV cache of ``slots`` slots of ``length`` entries (None:
    the model's whole context) cannot fit the memory available now (RAM, or the CUDA device's free memory)."""
    length = config.max_position_embeddings if length is None else length
    shape = KvShape(config.num_hidden_layers, config.num_key_value_heads, config.head_dim)
    bytes_per_slot = shape.entry_bytes(dtype) * length
    need = bytes_per_slot * slots
    available = available_bytes(device)
    if available is not None and need > available:
        fits = max(1, available // max(1, bytes_per_slot))
        raise ValueError(
            f"{key}={slots} needs a {need / 2**30:.1f} GiB KV cache, but {available / 2**30:.1f} GiB is available "
            f"on {device}; use {key}={fits} or less"
        )


def resolve_drafter(drafter: str, model_dir: Path, policy: CausalLM, needed: bool) -> EagleDrafter | None:
    """Load the drafter a `drafter=` key names; empty means the shipped one when the model is the bundled one or a
    named model with a drafter under fastrl/assets (`model=smollm2`)."""
    if drafter:
        try:
            return load_drafter(drafter, policy)[0]
        except ValueError as err:
            raise ValueError(f"drafter={drafter}: {err}") from None
    if not needed:
        return None
    shipped = drafter_dir(drafter, model_dir)
    if shipped is not None:
        return load_drafter(shipped, policy)[0]
    raise ValueError(f"a speculative strategy needs a drafter for {model_dir}: pass drafter=DIR")


def drafter_dir(drafter: str, model_dir: Path) -> Path | None:
    """The directory a `drafter=` key names: itself, or when empty the drafter shipped for ``model_dir`` (the
    bundled model's, a named model's under fastrl/assets); None when the model has none. Commands guard it as an
    input whether or not the run loads it."""
    if drafter:
        return Path(drafter)
    if model_dir.resolve() == bundled_model_dir().resolve() and bundled_drafter_dir().is_dir():
        return bundled_drafter_dir()
    return shipped_drafter_dir(model_dir, assets_dir())


def model_inputs(model_dir: Path, drafter: str) -> dict[str, str]:
    """The model and drafter directories a run reads, as ``guard_outputs`` inputs (no output may land on them)."""
    return {"model": str(model_dir), "drafter": str(drafter_dir(drafter, model_dir) or "")}


def load_speculative_models(model: str, drafter: str, device: str = "cpu") -> tuple[CausalLM, EagleDrafter, Any]:
    """The policy (in eval mode), its drafter and its tokenizer, as `model=` and `drafter=` keys name them (see
    ``resolve_model_dir``, ``resolve_drafter``; the drafter is required), on ``device``: what the benchmarks and
    recipes that time one model with and without speculation load."""
    model_dir = resolve_model_dir(model)
    policy = load_model(model_dir).to(device).eval()
    loaded = resolve_drafter(drafter, model_dir, policy, needed=True)
    assert loaded is not None  # needed=True: a drafter or a ValueError
    return policy, loaded.to(device), load_tokenizer(model_dir)


def check_draft_width(strategy: str, selector: StrategySelector, drafter: EagleDrafter, drafter_key: str) -> None:
    """ValueError naming the key that chose them when strategies draft more candidates a step than the drafter's
    draft vocabulary holds (the engine's own refusal named no key: the bandit's default arms hold ``8_4_32``)."""
    if drafter.draft_vocab is None:
        return
    width = drafter.draft_vocab.numel()
    wide = [str(s) for s in wider_than(selector.strategies, width)]
    if wide:
        key = {"bandit": "bandit.strategies", "ema": "ema"}.get(strategy, "strategy")
        where = f"drafter={drafter_key}" if drafter_key else "the shipped drafter"
        raise ValueError(
            f"{key}: {wide} draft more candidates a step than the {width} tokens of {where}'s draft vocabulary; "
            f"name strategies of topk <= {width}"
        )


def build_engine(
    policy: CausalLM,
    model_dir: Path,
    strategy: str,
    drafter: str,
    config: EngineConfig,
    bandit: BanditConfig | None = None,
    ema: EmaConfig | str | None = None,
    estimate_speedup: bool = True,
) -> Engine:
    """An engine whose rounds follow the strategy selector `strategy` (disable | S_K_N | bandit | ema);
    `estimate_speedup`: a fixed strategy or the EMA tiers also get a calibrated plain-time meter, so their rounds
    carry a plain-decoding estimate as the bandit's do (``calibrate_engine``)."""
    strategy_selector: StrategySelector = build_selector(strategy, bandit=bandit, ema=ema)
    needed = any(s.uses_drafter for s in strategy_selector.strategies)
    draft_model = resolve_drafter(drafter, model_dir, policy, needed)
    if needed and draft_model is not None:
        check_draft_width(strategy, strategy_selector, draft_model, drafter)
    engine = Engine(policy, config, drafter=draft_model if needed else None, selector=strategy_selector)
    calibrate_engine(engine, meter=estimate_speedup)  # round costs (cached per model, device and dtype)
    return engine
