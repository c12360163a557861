"""A speculation strategy as a value: ``steps_topk_tokens`` (e.g. ``8_4_32``) or ``disable``.

``steps`` is the depth of the draft tree (drafter forward passes per round), ``topk`` the branching factor of each
expansion, and ``num_draft_tokens`` the number of tree nodes sent to verification *including the root* (SGLang's
convention), so a ``topk == 1`` chain of ``steps`` drafted tokens has ``num_draft_tokens == steps + 1``.

Tree capacity (EAGLE-2 expansion, which is what the tree builder produces): the root's ``topk`` children form
level 1; every later level expands the ``topk`` best frontier nodes by ``topk`` children each, giving ``topk**2``
candidates per level. The best ``num_draft_tokens - 1`` candidates over all levels are kept, so at most
``1 + topk + (steps - 1) * topk**2`` nodes (root included) can be verified. For ``topk == 1`` this is
``steps + 1``, and a chain must use all of it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DISABLE_NAME = "disable"
_STRATEGY_PATTERN = re.compile(r"^(-?[0-9]+)_(-?[0-9]+)_(-?[0-9]+)$")


def max_tree_tokens(steps: int, topk: int) -> int:
    """Most nodes (root included) a ``steps``-deep, ``topk``-wide EAGLE-2 tree can send to verification."""
    if steps < 1 or topk < 1:
        raise ValueError(f"max_tree_tokens needs steps >= 1 and topk >= 1, got steps={steps}, topk={topk}")
    return 1 + topk + (steps - 1) * topk * topk


@dataclass(frozen=True, order=True)
class Strategy:
    """How one decode round speculates; ``Strategy(0, 0, 0)`` (``DISABLE``) is plain decoding.

    Construction validates the rules below and raises ``ValueError`` naming the strategy and the broken rule:
    all fields >= 1 (the all-zero ``DISABLE`` excepted; the string ``"0_0_0"`` is still rejected),
    ``num_draft_tokens >= 2``, ``topk == 1`` implies ``num_draft_tokens == steps + 1``, and
    ``num_draft_tokens <= max_tree_tokens(steps, topk)``.
    """

    steps: int
    topk: int
    num_draft_tokens: int

    def __post_init__(self) -> None:
        for name in ("steps", "topk", "num_draft_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"strategy {self._name()!r}: {name} must be an int, got {value!r}")
        if (self.steps, self.topk, self.num_draft_tokens) != (0, 0, 0):
            _check_rules(self._name(), self.steps, self.topk, self.num_draft_tokens)

    def _name(self) -> str:
        return f"{self.steps}_{self.topk}_{self.num_draft_tokens}"

    @property
    def is_disabled(self) -> bool:
        """True for plain decoding (no drafting, one token per request per round)."""
        return self.steps == 0

    @property
    def max_accept_length(self) -> int:
        """Most tokens one request can emit in a round: the tree depth plus the policy's own token."""
        return self.steps + 1

    def __str__(self) -> str:
        return DISABLE_NAME if self.is_disabled else self._name()

    @classmethod
    def parse(cls, text: str) -> Strategy:
        """Parse ``"steps_topk_tokens"`` or ``"disable"``; ``str(Strategy.parse(s))`` gives ``s`` back."""
        if not isinstance(text, str):
            raise ValueError(f"strategy {text!r}: expected a string like '8_4_32' or 'disable'")
        if text.strip().lower() == DISABLE_NAME:
            return DISABLE
        match = _STRATEGY_PATTERN.match(text.strip())
        if match is None:
            raise ValueError(
                f"strategy {text!r}: must be exactly three underscore-separated integers "
                f"'steps_topk_tokens' (e.g. '8_4_32') or 'disable'"
            )
        steps, topk, tokens = (int(group) for group in match.groups())
        _check_rules(text, steps, topk, tokens)
        return cls(steps, topk, tokens)


def _check_rules(name: str, steps: int, topk: int, tokens: int) -> None:
    """Raise ``ValueError`` naming ``name`` and the first rule that ``(steps, topk, tokens)`` breaks."""
    if min(steps, topk, tokens) < 1:
        raise ValueError(f"strategy {name!r}: steps, topk and num_draft_tokens must all be >= 1")
    if tokens < 2:
        raise ValueError(f"strategy {name!r}: num_draft_tokens must be >= 2 (the root plus at least one draft)")
    if topk == 1 and tokens != steps + 1:
        raise ValueError(
            f"strategy {name!r}: a topk=1 chain must have num_draft_tokens == steps + 1 = {steps + 1}, got {tokens}"
        )
    capacity = max_tree_tokens(steps, topk)
    if tokens > capacity:
        raise ValueError(
            f"strategy {name!r}: num_draft_tokens={tokens} exceeds the tree capacity "
            f"1 + topk + (steps - 1) * topk**2 = {capacity}"
        )


DISABLE = Strategy(0, 0, 0)


def parse_strategy_space(names: list[str]) -> list[Strategy]:
    """Parse a non-empty list of strategy strings with no duplicates (``"disable"`` allowed), keeping order."""
    if isinstance(names, str) or not names:
        raise ValueError(f"strategy space must be a non-empty list of strategy strings, got {names!r}")
    strategies: list[Strategy] = []
    for name in names:
        strategy = Strategy.parse(name)
        if strategy in strategies:
            raise ValueError(f"strategy space {list(names)!r}: duplicate strategy {str(strategy)!r}")
        strategies.append(strategy)
    return strategies
