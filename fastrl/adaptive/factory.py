"""Build a strategy policy from its name: ``"bandit"``, ``"ema"``, ``"disable"`` or a fixed ``"S_K_N"``."""

from __future__ import annotations

from pathlib import Path

from fastrl.adaptive.bandit import BanditPolicy
from fastrl.adaptive.bandit_config import BanditConfig
from fastrl.adaptive.ema import EmaPolicy
from fastrl.adaptive.ema_config import EmaConfig
from fastrl.adaptive.fixed import FixedPolicy
from fastrl.spec.policy import StrategyPolicy
from fastrl.spec.strategy import Strategy

POLICY_NAMES = ("bandit", "ema", "disable", "S_K_N")


def build_policy(
    name: str,
    bandit: BanditConfig | dict | None = None,
    ema: EmaConfig | dict | str | Path | None = None,
) -> StrategyPolicy:
    """The policy called ``name``; ``bandit`` / ``ema`` configure those policies (a config, a dict of its keys, or
    for ``ema`` also the path of an SGLang adaptive-config JSON). Any other name must parse as a strategy."""
    if name == "bandit":
        config = bandit if isinstance(bandit, BanditConfig) else BanditConfig.from_dict(bandit or {})
        return BanditPolicy(config)
    if name == "ema":
        config = ema if isinstance(ema, EmaConfig) else EmaConfig.from_json(ema if ema is not None else {})
        return EmaPolicy(config)
    try:
        return FixedPolicy(Strategy.parse(name))
    except ValueError as err:
        raise ValueError(f"policy {name!r}: expected one of {list(POLICY_NAMES)}; {err}") from err
