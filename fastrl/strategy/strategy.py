"""A speculation strategy as a value: ``steps_topk_tokens`` (e.g. ``8_4_32``), ``suffix_N``, ``S_K_N+suffix_M``
or ``disable``; a chain may stop early, ``S_1_N@P``.

``steps`` is the depth of the draft tree (drafter forward passes per round), ``topk`` the branching factor of each
expansion, and ``num_draft_tokens`` the number of tree nodes sent to verification *including the root* (SGLang's
convention), so a ``topk == 1`` chain of ``steps`` drafted tokens has ``num_draft_tokens == steps + 1``.

Tree capacity (EAGLE-2 expansion, which is what the tree builder produces): the root's ``topk`` children form
level 1; every later level expands the ``topk`` best frontier nodes by ``topk`` children each, giving ``topk**2``
candidates per level. The best ``num_draft_tokens - 1`` candidates over all levels are kept, so at most
``1 + topk + (steps - 1) * topk**2`` nodes (root included) can be verified. For ``topk == 1`` this is
``steps + 1``, and a chain must use all of it.

History drafts (``fastrl.speculative.history``) need no drafter: ``suffix_N`` drafts a tree of ``N`` nodes (root
included, like ``num_draft_tokens``; depth at most ``N - 1``) from a suffix index over the prompt, the sibling
responses and earlier responses. The hybrid ``S_K_N+suffix_M`` verifies the union of an EAGLE tree of ``N`` nodes
and a history tree of ``M`` nodes sharing the root (at most ``N + M - 1`` nodes).

A chain with a confidence stop, ``S_1_N@P`` (e.g. ``12_1_13@0.2``), drafts at most ``S`` tokens and stops once the
drafter's probability that a row's chain so far is right (the product of its drafts' probabilities), averaged over
the rows, falls below ``P`` (0 < P < 1), the last drafted token included: deep rounds where the drafter is sure,
short ones where it is not (EAGLE-2's confidence, used for the draft's length). The verifier accepts what the
policy samples whatever was drafted, so the stop changes speed, never tokens.

Grammar, whitespace around the whole string ignored: ``disable | EAGLE | suffix_M | EAGLE+suffix_M`` with
``EAGLE = S_K_N | S_1_N@P``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DISABLE_NAME = "disable"
HISTORY_PREFIX = "suffix_"
_STRATEGY_PATTERN = re.compile(r"^(-?[0-9]+)_(-?[0-9]+)_(-?[0-9]+)(?:@([^@]*))?$")
_STOP_PATTERN = re.compile(r"^[0-9]*\.?[0-9]+(?:e-?[0-9]+)?$")  # a plain decimal (ASCII digits), as 0.3 or 5e-1
_HISTORY_PATTERN = re.compile(r"^suffix_(-?[0-9]+)$")
_GRAMMAR = (
    "'steps_topk_tokens' (e.g. '8_4_32'), 'S_1_N@P' (e.g. '8_1_9@0.3'), 'suffix_N', 'S_K_N+suffix_M' or 'disable'"
)


def max_tree_tokens(steps: int, topk: int) -> int:
    """Most nodes (root included) a ``steps``-deep, ``topk``-wide EAGLE-2 tree can send to verification."""
    if steps < 1 or topk < 1:
        raise ValueError(f"max_tree_tokens needs steps >= 1 and topk >= 1, got steps={steps}, topk={topk}")
    return 1 + topk + (steps - 1) * topk * topk


@dataclass(frozen=True, order=True)
class Strategy:
    """How one decode round speculates; ``Strategy(0, 0, 0)`` (``DISABLE``) is plain decoding.

    ``steps, topk, num_draft_tokens`` describe the EAGLE tree (all zero: no drafter), ``history_nodes`` the
    history tree (0: none). Construction validates the rules below and raises ``ValueError`` naming the strategy
    and the broken rule: EAGLE fields all >= 1 or all 0 (the string ``"0_0_0"`` is still rejected),
    ``num_draft_tokens >= 2``, ``topk == 1`` implies ``num_draft_tokens == steps + 1``,
    ``num_draft_tokens <= max_tree_tokens(steps, topk)``; ``history_nodes`` is 0 or >= 2; ``stop_below`` is 0 (no
    stop) or a probability in (0, 1) on a chain (``topk == 1``).
    """

    steps: int
    topk: int
    num_draft_tokens: int
    history_nodes: int = 0
    stop_below: float = 0.0

    def __post_init__(self) -> None:
        for name in ("steps", "topk", "num_draft_tokens", "history_nodes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"strategy {self._name()!r}: {name} must be an int, got {value!r}")
        if (self.steps, self.topk, self.num_draft_tokens) != (0, 0, 0):
            _check_rules(self._name(), self.steps, self.topk, self.num_draft_tokens)
        if self.history_nodes != 0:
            _check_history(self._name(), self.history_nodes)
        if self.num_draft_tokens and self.history_nodes and self.max_tree_nodes > MAX_TREE_NODES:  # hybrid
            raise ValueError(
                f"strategy {self._name()!r}: a hybrid tree holds N + M - 1 nodes (one root), at most "
                f"{MAX_TREE_NODES}, got {self.num_draft_tokens} + {self.history_nodes} - 1 = {self.max_tree_nodes}"
            )
        if isinstance(self.stop_below, bool) or not isinstance(self.stop_below, (int, float)):
            raise ValueError(f"strategy {self._name()!r}: stop_below must be a number, got {self.stop_below!r}")
        if self.stop_below != 0:
            _check_stop(self._name(), self.steps, self.topk, self.stop_below)
        # selectors key their tables by strategy every round: hash the fields once (not a field: eq, order, repr and
        # asdict see the five fields only)
        fields = (self.steps, self.topk, self.num_draft_tokens, self.history_nodes, self.stop_below)
        object.__setattr__(self, "_hash", hash(fields))

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self) -> tuple:
        """Pickled as its fields: unpickling constructs (and checks) it again."""
        return (Strategy, (self.steps, self.topk, self.num_draft_tokens, self.history_nodes, self.stop_below))

    def _name(self) -> str:
        eagle = f"{self.steps}_{self.topk}_{self.num_draft_tokens}"
        if self.stop_below:
            eagle += f"@{float(self.stop_below)!r}"
        if self.history_nodes == 0:
            return eagle
        history = f"{HISTORY_PREFIX}{self.history_nodes}"
        return history if eagle == "0_0_0" else f"{eagle}+{history}"

    @property
    def is_disabled(self) -> bool:
        """True for plain decoding (no drafting, one token per request per round)."""
        return self.steps == 0 and self.history_nodes == 0

    @property
    def uses_drafter(self) -> bool:
        """True when the round runs the EAGLE drafter (``S_K_N``, alone or in a hybrid)."""
        return self.steps > 0

    @property
    def stops_early(self) -> bool:
        """True for ``S_1_N@P``: the chain's length is decided round by round, by the drafter's confidence."""
        return self.stop_below > 0

    def truncated(self, steps: int) -> Strategy:
        """This strategy's round after its chain stopped at ``steps`` drafted tokens: the fixed chain of that depth
        (history part kept), which is what the round verifies."""
        if not self.uses_drafter or self.topk != 1 or not 1 <= steps <= self.steps:
            raise ValueError(f"strategy {self}: cannot stop its chain at {steps} drafted tokens")
        return Strategy(steps, 1, steps + 1, self.history_nodes)

    @property
    def is_history(self) -> bool:
        """True when the round drafts from the history index (``suffix_M``, alone or in a hybrid)."""
        return self.history_nodes > 0

    @property
    def is_hybrid(self) -> bool:
        """True for ``S_K_N+suffix_M``: the union of an EAGLE and a history tree."""
        return self.uses_drafter and self.is_history

    @property
    def history_max_depth(self) -> int:
        """Deepest history node: a chain of all ``history_nodes - 1`` drafts (0 without history)."""
        return max(self.history_nodes - 1, 0)

    @property
    def max_tree_nodes(self) -> int:
        """Most nodes (root included) verified in one round: EAGLE's and history's trees share the root."""
        eagle = self.num_draft_tokens if self.uses_drafter else 1
        history = self.history_nodes if self.is_history else 1
        return eagle + history - 1

    @property
    def verify_depth(self) -> int:
        """Deepest node of the tree a round verifies: the EAGLE chain's (at most ``num_draft_tokens - 1``) or the
        history chain's; 0 for plain decoding."""
        return max(min(self.steps, self.num_draft_tokens - 1), self.history_max_depth, 0)

    @property
    def max_accept_length(self) -> int:
        """Most tokens one request can emit in a round: the tree depth plus the policy's own token."""
        return max(self.steps, self.history_max_depth) + 1

    def __str__(self) -> str:
        return DISABLE_NAME if self.is_disabled else self._name()

    @classmethod
    def parse(cls, text: str) -> Strategy:
        """Parse ``"steps_topk_tokens"``, ``"suffix_N"``, ``"S_K_N+suffix_M"`` or ``"disable"``.

        ``str(Strategy.parse(s))`` gives ``s`` back for canonical strings (no leading zeros or blanks). Letters may
        be in any case (``DISABLE``, ``SUFFIX_8``); blanks only around the whole string.
        """
        if isinstance(text, int) and not isinstance(text, bool):  # what YAML and Hydra make of an unquoted 8_4_32
            raise ValueError(
                f"strategy {text!r}: expected a string like '8_4_32', 'suffix_16' or 'disable', got the integer "
                f"{text}: YAML and Hydra read digits joined by underscores (8_4_32) as one integer (8432); quote the "
                "strategy ('8_4_32')"
            )
        if not isinstance(text, str):
            raise ValueError(f"strategy {text!r}: expected a string like '8_4_32', 'suffix_16' or 'disable'")
        body = text.strip().lower()
        if any(c.isspace() for c in body):
            raise ValueError(f"strategy {text!r}: no blanks inside a strategy; a strategy is {_GRAMMAR}")
        if body == DISABLE_NAME:
            return DISABLE
        eagle, plus, history = body.partition("+")
        if plus and "@" in eagle and not history.startswith(HISTORY_PREFIX):  # a sign after '@' (12_1_13@+0.3)
            _check_stop_text(text, eagle.partition("@")[2] + plus + history)
        if plus and eagle == HISTORY_PREFIX:
            _parse_history(text, body)  # a sign in suffix_N (suffix_+8): suffix_N's own message
        if plus:
            if eagle.startswith(HISTORY_PREFIX) or "+" in history or not history.startswith(HISTORY_PREFIX):
                raise ValueError(
                    f"strategy {text!r}: a hybrid strategy is one EAGLE part then one history part, "
                    f"'S_K_N+suffix_M' (e.g. '8_4_32+suffix_16')"
                )
            steps, topk, tokens, stop = _parse_eagle(text, eagle)
            return cls(steps, topk, tokens, _parse_history(text, history), stop)
        if body.startswith(HISTORY_PREFIX):
            return cls(0, 0, 0, history_nodes=_parse_history(text, body))
        steps, topk, tokens, stop = _parse_eagle(text, body)
        return cls(steps, topk, tokens, stop_below=stop)


def _parse_eagle(text: str, part: str) -> tuple[int, int, int, float]:
    """``(steps, topk, tokens, stop_below)`` of the EAGLE part ``part`` of strategy ``text``, validated."""
    match = _STRATEGY_PATTERN.match(part)
    if match is None:
        raise ValueError(
            f"strategy {text!r}: the EAGLE part must be exactly three underscore-separated integers, optionally "
            f"followed by '@P' on a chain; a strategy is {_GRAMMAR}"
        )
    steps, topk, tokens = (_integer(text, group) for group in match.groups()[:3])
    _check_rules(text, steps, topk, tokens)
    stop = 0.0
    if match.group(4) is not None:
        _check_stop_text(text, match.group(4))
        stop = float(match.group(4))
        _check_stop(text, steps, topk, stop)
    return steps, topk, tokens, stop


def _check_stop_text(text: str, stop: str) -> None:
    """Raise ``ValueError`` naming strategy ``text`` unless ``stop`` (what follows '@') is a plain decimal."""
    if _STOP_PATTERN.match(stop) is None:
        raise ValueError(
            f"strategy {text!r}: the stop after '@' must be a probability in (0, 1) written as a decimal (e.g. "
            f"'0.3'), got {stop!r}"
        )


def _check_stop(name: str, steps: int, topk: int, stop: float) -> None:
    """Raise ``ValueError`` naming ``name`` when a confidence stop ``stop`` is not allowed on ``steps_topk``."""
    if topk != 1 or steps < 1:
        raise ValueError(f"strategy {name!r}: a confidence stop '@P' applies to a chain (topk=1), got topk={topk}")
    if not 0.0 < stop < 1.0:  # also rejects nan
        raise ValueError(f"strategy {name!r}: the stop after '@' must be a probability in (0, 1), got {stop!r}")


def _parse_history(text: str, part: str) -> int:
    """Node count of the history part ``part`` (``suffix_N``) of strategy ``text``, validated."""
    match = _HISTORY_PATTERN.match(part)
    if match is None:
        raise ValueError(f"strategy {text!r}: the history part must be 'suffix_N' with N an integer (e.g. 'suffix_16')")
    nodes = _integer(text, match.group(1))
    _check_history(text, nodes)
    return nodes


MAX_DIGITS = 9
"""Most significant digits of a strategy's number: past every bound below, and short of Python's limit on parsing an
int from a string (4,300 digits), which a longer one would meet."""


def _integer(text: str, digits: str) -> int:
    """The int of ``digits`` (ASCII, maybe signed, maybe with leading zeros), one number of strategy ``text``;
    ValueError naming ``text`` (shortened) when it has more than ``MAX_DIGITS`` significant digits."""
    sign, body = ("-", digits[1:]) if digits.startswith("-") else ("", digits)
    body = body.lstrip("0") or "0"
    if len(body) > MAX_DIGITS:
        shown = text if len(text) <= 60 else f"{text[:40]}...{text[-12:]}"
        raise ValueError(
            f"strategy {shown!r}: a number of {len(body)} digits; steps <= {MAX_STEPS}, topk <= {MAX_TOPK}, "
            f"num_draft_tokens and suffix_N <= {MAX_TREE_NODES}"
        )
    return int(sign + body)


MAX_STEPS = 64
"""Most drafting levels of a tree or chain (each is a drafter forward in every round)."""
MAX_TOPK = 64
"""Most branches a drafted node expands."""
MAX_TREE_NODES = 1024
"""Most nodes of an EAGLE or history tree, root included: a verify row attends over its tree with a nodes x nodes
mask, and the tree's ancestor matrix is nodes x nodes (a suffix_100000 asked 80 GB for it)."""


def _check_history(name: str, nodes: int) -> None:
    """Raise ``ValueError`` naming ``name`` when a history tree of ``nodes`` nodes is not allowed."""
    if nodes < 2:
        raise ValueError(f"strategy {name!r}: suffix_N needs N >= 2 (the root plus at least one draft), got {nodes}")
    if nodes > MAX_TREE_NODES:
        raise ValueError(f"strategy {name!r}: suffix_N takes N <= {MAX_TREE_NODES} tree nodes, got {nodes}")


def _check_rules(name: str, steps: int, topk: int, tokens: int) -> None:
    """Raise ``ValueError`` naming ``name`` and the first rule that ``(steps, topk, tokens)`` breaks."""
    if min(steps, topk, tokens) < 1:
        raise ValueError(f"strategy {name!r}: steps, topk and num_draft_tokens must all be >= 1")
    if tokens < 2:
        raise ValueError(f"strategy {name!r}: num_draft_tokens must be >= 2 (the root plus at least one draft)")
    if steps > MAX_STEPS or topk > MAX_TOPK or tokens > MAX_TREE_NODES:
        raise ValueError(
            f"strategy {name!r}: steps <= {MAX_STEPS}, topk <= {MAX_TOPK} and num_draft_tokens <= {MAX_TREE_NODES} "
            "(each level is a drafter forward every round, and a verify row's mask is nodes x nodes)"
        )
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


def check_strategy_names(key: str, names: list[str], selectors: tuple[str, ...] = ()) -> None:
    """A config's list of strategy strings: non-empty, every name a strategy (``Strategy.parse``) or one of
    ``selectors`` (one ending in ':' is a prefix, as ``bandit:KEY=VALUE``); one ValueError naming ``key``."""
    if not names:
        raise ValueError(f"{key} must name at least one strategy")
    for name in names:
        if name in selectors or any(name.startswith(p) for p in selectors if p.endswith(":")):
            continue
        strategy_entry(key, name)


def strategy_entry(key: str, value: object) -> Strategy:
    """The strategy an entry ``key`` holds (a config's name, a saved state's arm, a calibration row's): ValueError
    naming ``key`` unless ``value`` parses (``Strategy.parse`` refuses what is not a string)."""
    try:
        return Strategy.parse(value)  # type: ignore[arg-type]
    except ValueError as err:
        raise ValueError(f"{key}: {err}") from None
