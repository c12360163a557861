"""The EMA tier controller: SGLang's adaptive speculative decoding, as a ``StrategySelector``.

Tiers are chain depths ``S`` (strategy ``S_1_{S+1}``; ``0`` is ``disable``). The exact rule implemented:

1. After every round run at a tier ``S > 0``, ``ema = (1 - ema_alpha) * ema + ema_alpha * mean(accepted)``, where
   ``accepted`` is the per-request count of accepted *draft* tokens (the policy's own bonus token not counted).
   The EMA starts at ``S0 - 1`` for the initial tier ``S0`` (a neutral guess); rounds at tier 0 leave it alone.
2. Rounds are counted from the start; none of the first ``warmup_batches`` rounds changes the tier; after that,
   the tier is recomputed on every ``update_interval``-th round.
3. Recompute from the current tier index ``i`` over the ascending tiers ``T``:

   * at tier ``0`` (nothing drafted, so nothing to learn from): probe the next tier up; if the EMA is negative,
     restart it at that tier's neutral ``T[i+1] - 1``;
   * otherwise step down while ``i > 0`` and ``ema <= T[i-1] - 0.5 + down_hysteresis`` (the threshold to enter
     tier 0 is ``0.5 + down_hysteresis``: zero accepted drafts);
   * only if it did not step down, step up while ``i`` is not the top and ``ema > T[i] - 0.5 + up_hysteresis``.

   With no hysteresis this snaps the depth to about ``round(ema) + 1``: one more step than the drafts being accepted,
   so the controller keeps probing one token past what it sees. A negative ``down_hysteresis`` makes stepping down
   need a clearly lower EMA, damping oscillation.

The controller ignores the batch size (SGLang's per-batch-size slots are the bandit's job here).
"""

from __future__ import annotations

import dataclasses
import math

from fastrl.adaptive.config_changes import check_same_config
from fastrl.adaptive.ema_config import EmaConfig
from fastrl.json_values import is_int, is_real
from fastrl.strategy.round_stats import RoundStats
from fastrl.strategy.strategy import DISABLE, Strategy

STATE_VERSION = 1


def neutral_ema(steps: int) -> float:
    """The EMA's neutral start at tier ``steps``: one accepted draft fewer than the tier drafts (-1 at tier 0, where
    nothing is drafted: no estimate yet, replaced by the next tier's neutral start when the controller probes it)."""
    return float(steps - 1)


def chain_strategy(steps: int) -> Strategy:
    """The tier ``steps`` as a strategy: a topk=1 chain ``steps_1_{steps+1}``, or ``disable`` for 0."""
    return DISABLE if steps == 0 else Strategy(steps, 1, steps + 1)


class EmaSelector:
    """A ``StrategySelector`` following SGLang's EMA tier controller (rule in the module docstring)."""

    def __init__(self, config: EmaConfig | None = None) -> None:
        self.config = config or EmaConfig()
        self.config.validate()
        self._tiers = self.config.tiers()
        self._tier = self.config.initial_tier()
        self.ema_accept = neutral_ema(self._tiers[self._tier])
        self._rounds = 0

    @property
    def strategies(self) -> list[Strategy]:
        """One chain strategy per tier, ascending."""
        return [chain_strategy(s) for s in self._tiers]

    @property
    def current_steps(self) -> int:
        """Depth of the current tier."""
        return self._tiers[self._tier]

    def choose(self, batch_size: int) -> Strategy:
        """The current tier's strategy (the batch size does not matter)."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        return chain_strategy(self.current_steps)

    def observe(self, stats: RoundStats) -> None:
        """Fold the round's mean accepted drafts into the EMA; recompute the tier on schedule."""
        if self.current_steps > 0 and stats.strategy.uses_drafter:
            batch_mean = sum(stats.accepted_tokens) / stats.batch_size  # mean accepted drafts per row, uncut
            self.ema_accept = (1.0 - self.config.ema_alpha) * self.ema_accept + self.config.ema_alpha * batch_mean
        self._rounds += 1
        past_warmup = self._rounds - self.config.warmup_batches
        if past_warmup > 0 and past_warmup % self.config.update_interval == 0:
            self._recompute()

    def _recompute(self) -> None:
        tiers, i = self._tiers, self._tier
        if tiers[i] == 0:
            if i + 1 < len(tiers):
                self._tier = i + 1
                if self.ema_accept < 0:
                    self.ema_accept = neutral_ema(tiers[i + 1])
            return
        start = i
        while i > 0:
            below = tiers[i - 1]
            threshold = (0.5 if below == 0 else below - 0.5) + self.config.down_hysteresis
            if self.ema_accept <= threshold:
                i -= 1
            else:
                break
        if i == start:
            while i + 1 < len(tiers) and self.ema_accept > tiers[i] - 0.5 + self.config.up_hysteresis:
                i += 1
        self._tier = i

    def state_dict(self) -> dict:
        """Config, tier, EMA and round count."""
        return {
            "version": STATE_VERSION,
            "config": dataclasses.asdict(self.config),
            "steps": self.current_steps,
            "ema_accept": self.ema_accept,
            "rounds": self._rounds,
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore ``state_dict``; the saved config must equal this policy's."""
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"EMA state version {state.get('version')!r} != {STATE_VERSION}")
        check_same_config("EMA", EmaConfig.from_json(state["config"]), self.config)
        steps, accept, rounds = state.get("steps"), state.get("ema_accept"), state.get("rounds")
        if not is_int(steps) or steps not in self._tiers:
            raise ValueError(f"EMA state steps is {steps!r}: expected one of the tiers {self._tiers}")
        if not (is_real(accept) and (0 <= accept < math.inf or (steps == 0 and accept == neutral_ema(0)))):
            raise ValueError(
                f"EMA state ema_accept is {accept!r} at steps {steps}: expected a finite number >= 0 "
                f"(or {neutral_ema(0)}, tier 0's start, at steps 0)"
            )
        if not is_int(rounds) or rounds < 0:
            raise ValueError(f"EMA state rounds is {rounds!r}: expected an integer >= 0")
        self._tier = self._tiers.index(steps)
        self.ema_accept = float(accept)
        self._rounds = rounds
