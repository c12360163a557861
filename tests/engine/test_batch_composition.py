"""A request's tokens do not depend on how rounds are composed: the same requests decoded alone, all at once,
arriving mid-batch in another order, plainly or speculatively with any selector, give identical tokens and
log-probs (float64, the rollout dtype on CPU). This is what keeps a Ray actor's timing out of the RL run."""

from __future__ import annotations

import random

import pytest

from fastrl.adaptive.factory import build_selector
from fastrl.engine.engine import GenerateInput
from fastrl.rl.tasks.task import ArithChainTask
from fastrl.sampling.params import SamplingParams
from fastrl.strategy.strategy import DISABLE
from tests.helpers import FLOAT64_LOGPROB_TOL
from tests.speculative.exactness_cases import Case, _bundled_tokenizer, decode


def _case(count: int = 12) -> Case:
    rng = random.Random(31)
    tokenizer = _bundled_tokenizer()
    inputs = []
    for i in range(count):
        prompt = tokenizer(ArithChainTask().sample_problem(rng).prompt)["input_ids"]
        params = SamplingParams(max_new_tokens=48, temperature=1.0, top_p=0.95 if i % 2 else 1.0, seed=500 + i)
        inputs.append(GenerateInput(prompt, params, request_id=f"q{i}"))
    return Case(31, "bundled", DISABLE, count, count, inputs, [0] * count)


def test_tokens_do_not_depend_on_batch_composition():
    case = _case()
    n = len(case.inputs)
    together = decode(case, build_selector("disable"), n, [0] * n)
    runs = {
        "plain, one at a time": decode(case, build_selector("disable"), 1, [0] * n),
        "5_1_6, bs 5, staggered": decode(case, build_selector("5_1_6"), 5, [i % 7 for i in range(n)]),
        "6_4_24, bs 3, reversed": decode(case, build_selector("6_4_24"), 3, list(range(n, 0, -1))),
        "bandit, bs 16, staggered": decode(case, build_selector("bandit"), 16, [(3 * i) % 5 for i in range(n)]),
    }
    assert sum(len(o.token_ids) for o in together) > 8 * n
    for name, outputs in runs.items():
        for ref, out in zip(together, outputs, strict=True):
            assert out.token_ids == ref.token_ids, f"{name}: request {out.request_id}"
            assert out.logprobs == pytest.approx(ref.logprobs, rel=0, abs=FLOAT64_LOGPROB_TOL), name
            assert out.finish_reason == ref.finish_reason
