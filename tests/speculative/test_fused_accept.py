"""A fused drafter's acceptance in the engine is the acceptance its features give offline: with the identity fuse it
drafts exactly as the last-layer drafter it starts from, and with a fuse that reads layers 0 and 2 the engine's
greedy `7_1_8` accept length at bs=1 is the engine-free chain walk's (`greedy_chain_accept_length` over
`policy_features(extra_layers=...)`), while the walk over other layers' features is measurably different."""

from __future__ import annotations

import random
from functools import cache

import pytest
import torch

from fastrl.adaptive.fixed import FixedSelector
from fastrl.assets_path import bundled_drafter_dir, bundled_model_dir
from fastrl.cotrain.accept_eval import measure_accept_length
from fastrl.cotrain.chain_accept import greedy_chain_accept_length
from fastrl.cotrain.features import policy_features
from fastrl.engine.config import EngineConfig
from fastrl.engine.engine import Engine, GenerateInput
from fastrl.models.checkpoint import load_model
from fastrl.models.tokenizer import load_tokenizer
from fastrl.rl.tasks.task import ArithChainTask
from fastrl.sampling.params import SamplingParams
from fastrl.speculative.drafter_checkpoint import load_drafter
from fastrl.speculative.fused_drafter import FusedEagleDrafter
from tests.helpers import last_layer_drafter

LAYERS = (0, 2)


@cache
def bundled():
    """The bundled policy, the shipped drafter's last-layer part and the tokenizer."""
    policy = load_model(bundled_model_dir()).eval()
    return policy, last_layer_drafter(policy), load_tokenizer(bundled_model_dir())


def fused_from_shipped(scale: float) -> FusedEagleDrafter:
    """The shipped drafter's weights; fuse = identity on the final-norm block plus, on layers 0 and 2, random
    weights of gain `scale` (0: the identity fuse)."""
    policy, shipped, _ = bundled()
    fused = FusedEagleDrafter(policy.config, LAYERS)
    fused.load_state_dict({**shipped.state_dict(), "fuse.weight": fused.fuse.weight})
    hidden = policy.config.hidden_size
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        fused.fuse.weight[:, : 2 * hidden] = torch.randn(hidden, 2 * hidden, generator=g) * scale / (2 * hidden) ** 0.5
    return fused.eval()


def prompts(count: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    tokenizer = bundled()[2]
    return [tokenizer(ArithChainTask().sample_problem(rng).prompt)["input_ids"] for _ in range(count)]


@pytest.mark.parametrize(("strategy", "temperature"), [("5_1_6", 0.0), ("4_2_8", 1.0)])
def test_identity_fuse_drafts_as_the_last_layer_drafter(strategy, temperature):
    policy, shipped, _ = bundled()
    inputs = [
        GenerateInput(p, SamplingParams(max_new_tokens=60, temperature=temperature, seed=i))
        for i, p in enumerate(prompts(4, seed=1))
    ]
    runs = []
    for drafter in (shipped, fused_from_shipped(0.0)):
        engine = Engine(policy, EngineConfig(max_batch_size=4, dtype="float64"), drafter, FixedSelector(strategy))
        runs.append(engine.generate(inputs))
    for last, fused in zip(*runs, strict=True):
        assert fused.token_ids == last.token_ids and fused.accept_lengths == last.accept_lengths
    assert sum(sum(o.accept_lengths) for o in runs[1]) > 1.5 * sum(len(o.accept_lengths) for o in runs[1])


def test_engine_accept_length_is_the_chain_walks():
    policy, _, _ = bundled()
    policy.float()
    fused = fused_from_shipped(0.06)
    held = prompts(4, seed=5)
    inputs = [GenerateInput(p, SamplingParams(max_new_tokens=1024, temperature=0.0)) for p in held]
    rollouts = Engine(policy, EngineConfig(max_batch_size=4)).generate(inputs)
    sequences = [p + o.token_ids for p, o in zip(held, rollouts, strict=True)]
    lengths = [len(p) for p in held]
    engine = measure_accept_length(policy, fused, inputs, "7_1_8", EngineConfig(max_batch_size=1))
    walk = greedy_chain_accept_length(
        fused, policy, policy_features(policy, sequences, extra_layers=LAYERS), lengths, 7
    )
    other = greedy_chain_accept_length(
        fused, policy, policy_features(policy, sequences, extra_layers=(1, 3)), lengths, 7
    )
    print(f"fused 7_1_8 T=0 bs=1: engine {engine:.4f}, walk {walk:.4f}, walk over layers 1, 3: {other:.4f}")
    assert abs(engine - walk) <= 0.02 * walk
    assert abs(other - walk) > 0.03 * walk  # features of other layers change acceptance: the agreement means something
    assert walk > 1.5


def test_the_shipped_fused_drafter_accepts_in_the_engine_what_its_features_give_offline():
    """The shipped drafter was trained on the fused input (layers 0, 2 and the last): the engine's greedy 7_1_8
    accept length is the walk's over those features, and well above the walk over the last layer alone."""
    policy = load_model(bundled_model_dir()).eval()
    shipped = load_drafter(bundled_drafter_dir(), policy)[0]
    assert isinstance(shipped, FusedEagleDrafter) and shipped.extra_layers == LAYERS
    held = prompts(12, seed=9)  # 4 prompts put the two 4% apart: at ~5 tokens a round, one near-tie moves a lot
    inputs = [GenerateInput(p, SamplingParams(max_new_tokens=1024, temperature=0.0)) for p in held]
    rollouts = Engine(policy, EngineConfig(max_batch_size=12)).generate(inputs)
    sequences = [p + o.token_ids for p, o in zip(held, rollouts, strict=True)]
    lengths = [len(p) for p in held]
    engine = measure_accept_length(policy, shipped, inputs, "7_1_8", EngineConfig(max_batch_size=1))
    walk, other = (
        greedy_chain_accept_length(shipped, policy, policy_features(policy, sequences, extra_layers=layers), lengths, 7)
        for layers in (LAYERS, (1, 3))
    )
    print(f"shipped fused drafter 7_1_8 T=0 bs=1: engine {engine:.4f}, walk {walk:.4f}, over layers 1, 3 {other:.4f}")
    assert abs(engine - walk) <= 0.02 * walk and walk > 3.0
    assert other < 0.9 * walk  # the trained fuse depends on the layers it reads
