"""Per-strategy runtime state, built once at engine start so that switching strategy between rounds is a lookup."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from fastrl.strategy.strategy import Strategy


@dataclass
class StrategyRuntime:
    """Index templates one strategy's rounds reuse.

    node_range:  [N] 0..N-1 (tree node slots, cache offsets of the verified tree)
    level_range: [D+1] 0..D, D = the deepest level a tree of N nodes can reach
    self_bits:   [steps-1, topk, T] bool, the drafter tree-area entry of frontier node j expanded at level d + 2
                 (T = (steps-1) * topk entries)
    chain:       for topk == 1, the fixed shape of every tree: parents [1,N], depths [1,N], ancestors [1,N,N]
    shorter:     for a chain with a confidence stop, the runtime of the round after its chain stopped at d < steps
                 drafted tokens, by d (`at_depth`)
    """

    strategy: Strategy
    max_depth: int
    node_range: Tensor
    level_range: Tensor
    self_bits: Tensor
    chain: tuple[Tensor, Tensor, Tensor] | None = None
    shorter: dict[int, StrategyRuntime] = field(default_factory=dict)

    def at_depth(self, drafted: int) -> StrategyRuntime:
        """The runtime that verifies this strategy's round when its chain drafted `drafted` tokens."""
        if drafted == self.strategy.steps:
            return self
        if drafted not in self.shorter:
            raise ValueError(f"strategy {self.strategy}: no round of {drafted} drafted tokens")
        return self.shorter[drafted]

    @property
    def is_chain(self) -> bool:
        return self.chain is not None

    @property
    def verifies_chain(self) -> bool:
        """True when the verified tree is the EAGLE chain alone (no history nodes): node i is at depth i."""
        return self.chain is not None and not self.strategy.is_history

    @property
    def noise_levels(self) -> int:
        """Positions past the root whose sampler noise a round uses: the drafter's `steps` levels and the
        verifier's targets at depths 0..max_depth."""
        return max(self.strategy.steps, self.max_depth + 1)

    @property
    def tree_area(self) -> int:
        """Drafter cache entries one round's expansions use beyond the prefix."""
        return self.self_bits.shape[-1]

    @property
    def draft_reach(self) -> int:
        """How far past `base` a round's drafter writes: its expansions' last entry, or catch-up's padding (1)."""
        return max(1, self.tree_area)

    @property
    def num_nodes(self) -> int:
        """Tree nodes verified per row: EAGLE's and history's, sharing the root."""
        return self.node_range.shape[0]

    @classmethod
    def build(cls, strategy: Strategy, device: torch.device) -> StrategyRuntime:
        if strategy.is_disabled:
            raise ValueError("plain decoding needs no speculative runtime state")
        s, k, n = strategy.steps, strategy.topk, strategy.num_draft_tokens
        depth = strategy.verify_depth
        area = max(s - 1, 0) * k
        bits = torch.eye(max(area, 1), dtype=torch.bool, device=device)[:area].view(max(s - 1, 0), k, area)
        chain = None
        if k == 1:
            nodes = torch.arange(n, device=device)
            ancestors = torch.ones(n, n, dtype=torch.bool, device=device).tril()
            chain = ((nodes - 1).unsqueeze(0), nodes.unsqueeze(0), ancestors.unsqueeze(0))
        shorter = {d: cls.build(strategy.truncated(d), device) for d in range(1, s)} if strategy.stops_early else {}
        return cls(
            strategy=strategy,
            max_depth=depth,
            node_range=torch.arange(strategy.max_tree_nodes, device=device),
            level_range=torch.arange(depth + 1, device=device),
            self_bits=bits,
            chain=chain,
            shorter=shorter,
        )


def build_runtimes(strategies: list[Strategy], device: torch.device) -> dict[Strategy, StrategyRuntime]:
    """Runtime state for every speculative strategy of a policy's space."""
    return {s: StrategyRuntime.build(s, device) for s in strategies if not s.is_disabled}
