"""Building an engine from command configs: policy model, drafter and strategy policy."""

from __future__ import annotations

from pathlib import Path

from fastrl.adaptive.bandit_config import BanditConfig
from fastrl.adaptive.ema_config import EmaConfig
from fastrl.adaptive.factory import build_policy
from fastrl.assets_path import bundled_drafter_dir, bundled_model_dir
from fastrl.engine.config import EngineConfig
from fastrl.engine.engine import Engine
from fastrl.models.decoder import CausalLM
from fastrl.spec.drafter import EagleDrafter
from fastrl.spec.drafter_checkpoint import load_drafter
from fastrl.spec.policy import StrategyPolicy


def resolve_model_dir(model: str) -> Path:
    """The checkpoint directory a `model=` key names (empty = the bundled model)."""
    return Path(model) if model else bundled_model_dir()


def resolve_drafter(drafter: str, model_dir: Path, policy: CausalLM, needed: bool) -> EagleDrafter | None:
    """Load the drafter a `drafter=` key names; empty means the shipped one when the model is the bundled one."""
    if drafter:
        return load_drafter(drafter, policy)[0]
    if not needed:
        return None
    if model_dir.resolve() == bundled_model_dir().resolve() and bundled_drafter_dir().is_dir():
        return load_drafter(bundled_drafter_dir(), policy)[0]
    raise ValueError(f"a speculative strategy needs a drafter for {model_dir}: pass drafter=DIR")


def build_engine(
    policy: CausalLM,
    model_dir: Path,
    strategy: str,
    drafter: str,
    config: EngineConfig,
    bandit: BanditConfig | None = None,
    ema: EmaConfig | str | None = None,
) -> Engine:
    """An engine whose rounds follow the strategy policy `strategy` (disable | S_K_N | bandit | ema)."""
    strategy_policy: StrategyPolicy = build_policy(strategy, bandit=bandit, ema=ema)
    needed = any(not s.is_disabled for s in strategy_policy.strategies)
    draft_model = resolve_drafter(drafter, model_dir, policy, needed)
    return Engine(policy, config, drafter=draft_model if needed else None, policy=strategy_policy)
