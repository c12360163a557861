"""Comparing a speculative run with a plain run of the same requests: per request, equal or a judged mismatch."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from fastrl.engine.engine import GenerateInput
from fastrl.engine.request import RequestOutput
from fastrl.exactness.mismatch import (
    Mismatch,
    analyse_mismatch,
    finite_or_none,
    logprob_tolerance,
    near_tie_bound,
    support_explains_logprobs,
)
from fastrl.models.decoder import CausalLM


@dataclass(frozen=True)
class RequestComparison:
    """One request of the two runs. mismatch: the first differing token (None when the tokens are equal);
    finish_equal: same finish reason and same error (or none in both); logprob_diff: max |plain - spec| over the
    common tokens (infinite where a run has no log-prob for one of them); logprob_tol: how far they may differ
    before equal tokens count as a bug (the request's); logprob_tie: every difference beyond it is explained by a
    top-k / top-p edge within rounding (``support_explains_logprobs``)."""

    request_id: str
    mismatch: Mismatch | None
    finish_equal: bool
    logprob_diff: float
    logprob_tol: float
    logprob_tie: bool = False

    def is_bug(self) -> bool:
        if self.mismatch is not None:
            return not self.mismatch.near_tie
        return not self.finish_equal or not (self.logprob_diff <= self.logprob_tol or self.logprob_tie)

    @property
    def near_tie(self) -> bool:
        """The tokens differ by a float tie, or equal tokens' log-probs differ beyond the tolerance by a filter edge
        that rounding moves (``logprob_tie``)."""
        if self.mismatch is not None:
            return self.mismatch.near_tie
        return self.logprob_tie and not self.is_bug()

    def to_dict(self) -> dict:
        return {
            "request_id": self.request_id,
            "mismatch": None if self.mismatch is None else self.mismatch.to_dict(),
            "finish_equal": self.finish_equal,
            "logprob_diff": finite_or_none(self.logprob_diff),
            "logprob_tol": finite_or_none(self.logprob_tol),
            "logprob_tie": self.logprob_tie,
        }


@dataclass
class ExactnessReport:
    """Counts over compared requests: identical (tokens, finish reason and log-probs within tolerance), near-ties
    (the first difference is a float tie) and bugs (everything else). logprob_tol: the tolerance asked for, or the
    dtype's at T = 1 (each request's own is in its item)."""

    logprob_tol: float
    items: list[RequestComparison] = field(default_factory=list)

    @property
    def identical(self) -> int:
        return sum(1 for i in self.items if i.mismatch is None and not i.is_bug() and not i.near_tie)

    @property
    def near_ties(self) -> int:
        return sum(1 for i in self.items if i.near_tie)

    @property
    def bugs(self) -> list[RequestComparison]:
        return [i for i in self.items if i.is_bug()]

    @property
    def max_logprob_diff(self) -> float:
        return max((i.logprob_diff for i in self.items), default=0.0)

    def extend(self, other: ExactnessReport) -> None:
        self.items.extend(other.items)

    def summary(self) -> str:
        return (
            f"{len(self.items)} requests: {self.identical} identical, {self.near_ties} near-ties, "
            f"{len(self.bugs)} bugs; max |logprob diff| {self.max_logprob_diff:.2e}"
        )

    def to_dict(self) -> dict:
        return {
            "requests": len(self.items),
            "identical": self.identical,
            "near_ties": self.near_ties,
            "bugs": len(self.bugs),
            "max_logprob_diff": finite_or_none(self.max_logprob_diff),
            "logprob_tol": finite_or_none(self.logprob_tol),
            "items": [i.to_dict() for i in self.items if i.mismatch is not None or i.is_bug() or i.near_tie],
        }


def compare_runs(
    policy: CausalLM,
    inputs: Sequence[GenerateInput],
    plain: Sequence[RequestOutput],
    spec: Sequence[RequestOutput],
    logprob_tol: float | None = None,
) -> ExactnessReport:
    """Judge every request of a speculative run against the plain run (outputs in input order).

    `policy` runs the fresh forward of a mismatch in its own dtype, which also sets the near-tie bound and, unless
    `logprob_tol` is given, how far the log-probs of equal tokens may differ (``logprob_tolerance``: the dtype's,
    scaled by 1/T below T = 1 as sampled rows scale their logits' rounding).
    """
    if not len(inputs) == len(plain) == len(spec):
        raise ValueError(f"compare_runs: {len(inputs)} inputs, {len(plain)} plain and {len(spec)} spec outputs")
    dtype = next(policy.parameters()).dtype
    report = ExactnessReport(logprob_tol=logprob_tolerance(dtype) if logprob_tol is None else logprob_tol)
    for inp, a, b in zip(inputs, plain, spec, strict=True):
        bound = near_tie_bound(dtype, inp.params.temperature)
        tolerance = logprob_tolerance(dtype, inp.params.temperature) if logprob_tol is None else logprob_tol
        mismatch = analyse_mismatch(policy, inp.prompt_ids, a.token_ids, b.token_ids, inp.params, a.seed, bound)
        common = len(a.token_ids) if mismatch is None else mismatch.position
        diff = _max_logprob_diff(a.logprobs, b.logprobs, common)
        tie = False
        if mismatch is None and math.isfinite(diff) and diff > tolerance:  # (a mismatch is judged by its tokens)
            excess = [(j, d) for j in range(common) if (d := _logprob_diff(a.logprobs[j], b.logprobs[j])) > tolerance]
            tie = support_explains_logprobs(policy, inp.prompt_ids, a.token_ids, inp.params, bound, excess, tolerance)
        equal_finish = a.finish_reason == b.finish_reason and a.error == b.error
        report.items.append(RequestComparison(a.request_id, mismatch, equal_finish, diff, tolerance, tie))
    return report


def _max_logprob_diff(plain: Sequence[float], spec: Sequence[float], common: int) -> float:
    """max |plain - spec| over the first ``common`` tokens (the equal ones); a log-prob missing from either run for
    one of them (a list cut short) is infinitely far."""
    if len(plain) < common or len(spec) < common:
        return math.inf
    return max(map(_logprob_diff, plain[:common], spec[:common]), default=0.0)


def _logprob_diff(plain: float, spec: float) -> float:
    """|plain - spec| of one token's log-probs; two NaNs (the token of a row both runs ended on non-finite logits)
    or two equal infinities are equal, a NaN beside a number is infinitely far."""
    if plain == spec or (math.isnan(plain) and math.isnan(spec)):
        return 0.0
    diff = abs(plain - spec)
    return math.inf if math.isnan(diff) else diff
