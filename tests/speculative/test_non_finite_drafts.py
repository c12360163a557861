"""A drafted token that the policy computes NaN for, and rejects, changes nothing: the speculative rollout equals
plain decoding, which never computes that token, token for token and finish reason for finish reason.

In attention a masked key enters the products as 0 x its value, and 0 x NaN is NaN: before the attention backends
kept such keys out, one rejected token with a NaN embedding made every node of its tree NaN and the request ended in
an error at a token plain decoding emits cleanly. Seeded random cases: every token that plain decoding neither reads
nor emits gets a NaN embedding (the drafter reads the same embedding, so its drafts of those tokens are NaN too,
and it still proposes many), random strategies
(chains, trees, stopping chains; verify forwards through the C++ kernel and through scaled_dot_product_attention),
greedy and sampled requests, batch sizes 1-3, fixed or switching at random with plain rounds.
"""

from __future__ import annotations

import copy
import random

import pytest
import torch

from fastrl.adaptive.fixed import FixedSelector
from fastrl.engine.config import EngineConfig
from fastrl.engine.engine import Engine, GenerateInput
from fastrl.sampling.params import SamplingParams
from fastrl.strategy.strategy import DISABLE, Strategy
from tests.speculative.exactness_cases import SwitchingSelector, models

STRATEGIES = ["1_1_2", "3_1_4", "2_2_4", "6_1_7", "4_3_9", "12_1_13@0.3", "8_1_9"]


def _generate(policy, drafter, strategy: str, inputs: list[GenerateInput], batch: int, kernel: bool, seed=None):
    """Tokens, finish reasons and errors of ``inputs``; with ``seed``, rounds switch at random between ``strategy``
    and plain ones (a plain round's rows then attend past shorter rows' stale, rejected tree nodes)."""
    config = EngineConfig(max_batch_size=batch, dtype="float64", attention_kernel=kernel)
    selector = FixedSelector(Strategy.parse(strategy))
    if seed is not None:
        selector = SwitchingSelector((Strategy.parse(strategy), DISABLE), seed)
    engine = Engine(policy, config, drafter=None if strategy == "disable" else drafter, selector=selector)
    return [(o.token_ids, o.finish_reason, o.error) for o in engine.generate(inputs)]


@pytest.mark.parametrize("seed", range(8))
def test_rejected_drafts_with_nan_values_leave_the_rollout_as_plain_decoding_makes_it(seed):
    rng = random.Random(seed)
    family = rng.choice(["llama", "qwen2"])  # untied: a NaN embedding row leaves the LM head finite
    policy, drafter = models(family)
    drafter = copy.deepcopy(drafter)
    drafter.set_draft_vocab(None)
    vocab = policy.config.vocab_size
    inputs = [
        GenerateInput(
            [rng.randrange(3, vocab) for _ in range(rng.randint(2, 12))],
            SamplingParams(
                max_new_tokens=rng.randint(8, 24), temperature=rng.choice([0.0, 1.0]), seed=i, ignore_eos=True
            ),
        )
        for i in range(rng.randint(1, 3))
    ]
    batch = rng.randint(1, 3)
    clean = _generate(policy, None, "disable", inputs, batch, True)
    used = {t for i in inputs for t in i.prompt_ids} | {t for tokens, _, _ in clean for t in tokens}
    unused = [t for t in range(vocab) if t not in used]
    poisoned = copy.deepcopy(policy)
    with torch.no_grad():
        poisoned.model.embed_tokens.weight[unused] = float("nan")
    plain = _generate(poisoned, None, "disable", inputs, batch, True)
    assert plain == clean  # plain decoding never reads a poisoned token
    for strategy in rng.sample(STRATEGIES, 3):
        for kernel in (True, False):
            assert _generate(poisoned, drafter, strategy, inputs, batch, kernel) == plain, (strategy, kernel)
            switching = _generate(poisoned, drafter, strategy, inputs, batch, kernel, seed)
            assert switching == plain, (strategy, kernel, "switching")
