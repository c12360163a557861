"""Build a strategy selector from its name: ``"bandit"``, ``"ema"``, ``"disable"`` or a fixed strategy (``"S_K_N"``,
``"suffix_N"``, ``"S_K_N+suffix_M"``)."""

from __future__ import annotations

from pathlib import Path

from fastrl.adaptive.bandit import BanditSelector
from fastrl.adaptive.bandit_config import BanditConfig
from fastrl.adaptive.ema import EmaSelector
from fastrl.adaptive.ema_config import EmaConfig
from fastrl.adaptive.fixed import FixedSelector
from fastrl.strategy.selector import StrategySelector
from fastrl.strategy.strategy import Strategy

SELECTOR_NAMES = ("bandit", "ema", "disable", "S_K_N", "S_1_N@P", "suffix_N", "S_K_N+suffix_M")


def build_selector(
    name: str,
    bandit: BanditConfig | dict | None = None,
    ema: EmaConfig | dict | str | Path | None = None,
) -> StrategySelector:
    """The selector called ``name``; ``bandit`` / ``ema`` configure those selectors (a config, a dict of its keys, or
    for ``ema`` also the path of an SGLang adaptive-config JSON). Any other name must parse as a strategy."""
    if isinstance(name, str) and name.strip().lower() in ("bandit", "ema") and name not in ("bandit", "ema"):
        raise ValueError(f"strategy selector {name!r}: selector names are written {name.strip().lower()!r}")
    if name == "bandit":
        config = bandit if isinstance(bandit, BanditConfig) else BanditConfig.from_dict(bandit or {})
        return BanditSelector(config)
    if name == "ema":
        config = ema if isinstance(ema, EmaConfig) else EmaConfig.from_json(ema if ema is not None else {})
        return EmaSelector(config)
    try:
        return FixedSelector(Strategy.parse(name))
    except ValueError as err:
        raise ValueError(f"strategy selector {name!r}: expected one of {list(SELECTOR_NAMES)}; {err}") from err
