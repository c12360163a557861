"""Property-based exactness: random strategies, batch sizes, arrivals and sampling settings on every model family
give exactly plain decoding's tokens, finish reasons and log-probs.

The quick profile (default suite) runs QUICK_CASES fixed-seed cases. The long profile runs thousands:

    FASTRL_FUZZ_CASES=3000 python -m pytest -m fuzz tests/speculative/test_exactness_fuzz.py -s
"""

from __future__ import annotations

import os
from collections import Counter

import pytest

from fastrl.exactness.compare import ExactnessReport
from tests.helpers import FLOAT64_LOGPROB_TOL
from tests.speculative.exactness_cases import make_case, run_case

QUICK_CASES = 48
QUICK_SEED = 9000
# Long-profile seeds that once found a bug; each runs in the default suite. 20491: float64 engines rounded the
# RMSNorm statistics and the sampler's logits through float32 (a log-prob 1.2e-6 off after a plain row's rounding).
REGRESSION_SEEDS = (20491,)


def _kind(case) -> str:
    s = case.strategy
    return "hybrid" if s.is_hybrid else "history" if s.is_history else "eagle"


def _run(seeds: range, max_new_tokens: int, progress_every: int = 0) -> tuple[ExactnessReport, list[str]]:
    total = ExactnessReport(logprob_tol=FLOAT64_LOGPROB_TOL)
    failures = []
    kinds: Counter[str] = Counter()
    for done, seed in enumerate(seeds, 1):
        case = make_case(seed, max_new_tokens=max_new_tokens)
        kinds[_kind(case)] += 1
        kinds["reduced draft vocabulary"] += case.draft_vocab is not None
        kinds["switching every round"] += bool(case.switch_space)
        report = run_case(case)
        total.extend(report)
        if report.bugs or report.near_ties:
            failures.append(f"{case.describe()}: {report.to_dict()['items'][:2]}")
        if progress_every and done % progress_every == 0:
            print(f"  {done} cases: {total.summary()}, {len(failures)} failing cases", flush=True)
    print(f"case kinds: {dict(kinds)}")
    return total, failures


def test_quick_profile_matches_plain():
    total, failures = _run(range(QUICK_SEED, QUICK_SEED + QUICK_CASES), max_new_tokens=40)
    print(f"quick exactness profile: {QUICK_CASES} cases, {total.summary()}")
    assert not failures, "\n".join(failures)
    assert total.identical == len(total.items) > QUICK_CASES


@pytest.mark.parametrize("seed", REGRESSION_SEEDS)
def test_regression_seed_matches_plain(seed):
    case = make_case(seed, max_new_tokens=160)
    report = run_case(case)
    assert report.identical == len(report.items), f"{case.describe()}: {report.to_dict()['items'][:2]}"


@pytest.mark.fuzz
def test_long_profile_matches_plain():
    cases = int(os.environ.get("FASTRL_FUZZ_CASES", "2000"))
    start = int(os.environ.get("FASTRL_FUZZ_SEED", "0"))
    total, failures = _run(range(start, start + cases), max_new_tokens=160, progress_every=50)
    print(f"long exactness profile: {cases} cases (seeds {start}..{start + cases - 1}), {total.summary()}")
    assert not failures, "\n".join(failures[:20])
