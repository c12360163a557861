"""On a CUDA device: graph replay equals eager rounds, and speculative equals plain decoding in float64, float32
and bfloat16 (the last two judged by `compare_runs`: no bug, near-ties counted) for a grid of strategies."""

from __future__ import annotations

import random

import pytest
import torch

from fastrl.adaptive.factory import build_selector
from fastrl.assets_path import bundled_drafter_dir, bundled_model_dir
from fastrl.engine.config import EngineConfig
from fastrl.engine.engine import Engine, GenerateInput
from fastrl.exactness.compare import compare_runs
from fastrl.models.checkpoint import load_model
from fastrl.models.tokenizer import load_tokenizer
from fastrl.rl.tasks.task import ArithChainTask
from fastrl.sampling.params import SamplingParams
from fastrl.speculative.drafter_checkpoint import load_drafter

pytestmark = pytest.mark.gpu
STRATEGIES = ["disable", "1_1_2", "5_1_6", "8_1_9@0.3", "3_2_6", "6_4_24", "8_8_64"]


def _inputs(count: int, seed: int = 0) -> list[GenerateInput]:
    rng = random.Random(seed)
    tokenizer = load_tokenizer(bundled_model_dir())
    settings = [dict(temperature=0.0), dict(temperature=1.0), dict(temperature=0.8, top_p=0.9), dict(top_k=3)]
    return [
        GenerateInput(
            tokenizer(ArithChainTask().sample_problem(rng).prompt)["input_ids"],
            SamplingParams(max_new_tokens=80, seed=100 + i, **settings[i % len(settings)]),
            request_id=f"g{i}",
        )
        for i in range(count)
    ]


def _run(dtype: str, strategy: str, batch: int, graphs: bool, inputs: list[GenerateInput]):
    policy = load_model(bundled_model_dir())
    drafter = load_drafter(bundled_drafter_dir(), policy)[0] if strategy != "disable" else None
    config = EngineConfig(max_batch_size=batch, device="cuda", dtype=dtype, cuda_graphs=graphs)
    engine = Engine(policy, config, drafter=drafter, selector=build_selector(strategy))
    return engine, engine.generate(inputs)


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("batch", [1, 3, 8])
def test_graph_replay_equals_eager_float64(strategy, batch):
    inputs = _inputs(10)
    engine, graphed = _run("float64", strategy, batch, True, inputs)
    assert engine.runner.graphs is not None and engine.runner.graphs.pool_bytes > 0
    _, eager = _run("float64", strategy, batch, False, inputs)
    _, plain = _run("float64", "disable", 10, False, inputs)
    for a, b, p in zip(eager, graphed, plain, strict=True):
        assert a.token_ids == b.token_ids == p.token_ids, f"{strategy} bs={batch} {a.request_id}"
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-6)
        assert a.finish_reason == b.finish_reason == p.finish_reason


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("strategy", STRATEGIES[1:] + ["bandit"])
def test_speculative_matches_plain_up_to_ties(dtype, strategy, capsys):
    torch.backends.cuda.matmul.allow_tf32 = False
    inputs = _inputs(24, seed=1)
    engine, spec = _run(dtype, strategy, 8, True, inputs)
    _, plain = _run(dtype, "disable", 24, True, inputs)
    # bfloat16 keeps 8 mantissa bits: log-probs of ~-5 from differently shaped forwards differ by up to ~0.1.
    report = compare_runs(engine.model, inputs, plain, spec)  # the dtype's log-prob tolerance
    with capsys.disabled():
        print(f"\n{dtype} {strategy}: {report.summary()}")
    assert not report.bugs, report.to_dict()["items"][:3]
    assert report.identical >= len(inputs) // 2


@pytest.mark.parametrize("strategy", ["5_1_6", "3_2_6"])
def test_fused_drafter_graphs_equal_eager_and_return_fused_features(strategy):
    """A fused drafter (layers 0 and 2, random fuse): graph replay gives the eager rounds' tokens and the same
    fused hidden states ([.., 3H]: what the drafter and co-training read), and both equal plain decoding."""
    from fastrl.adaptive.fixed import FixedSelector
    from tests.speculative.fused_helpers import random_fused_drafter

    inputs = [GenerateInput(i.prompt_ids, i.params, i.request_id, return_hidden_states=True) for i in _inputs(10)]
    runs = []
    for graphs in (True, False):
        policy = load_model(bundled_model_dir())
        shipped = load_drafter(bundled_drafter_dir(), policy)[0]
        fused = random_fused_drafter(policy.config, (0, 2), seed=1)
        fused.load_state_dict({**shipped.state_dict(), "fuse.weight": fused.fuse.weight})
        config = EngineConfig(max_batch_size=4, device="cuda", dtype="float64", cuda_graphs=graphs)
        engine = Engine(policy, config, drafter=fused, selector=FixedSelector(strategy))
        assert (engine.runner.graphs is not None) == graphs
        runs.append(engine.generate(inputs))
    _, plain = _run("float64", "disable", 10, False, inputs)
    hidden = load_model(bundled_model_dir()).config.hidden_size
    for a, b, p in zip(*runs, plain, strict=True):
        assert a.token_ids == b.token_ids == p.token_ids
        assert a.hidden_states.shape == (len(a.token_ids), 3 * hidden)
        torch.testing.assert_close(a.hidden_states, b.hidden_states, rtol=0, atol=1e-6)


def test_graphs_draft_over_a_draft_vocabulary_pushed_after_capture():
    """A drafter push that carries a draft vocabulary of the live size (a resumed or replacement worker's) is copied
    into the tensors the graphs were captured over: graphed rounds then draft exactly as eager ones do (the same
    accept lengths), where they read the replaced, freed vocabulary and head."""
    inputs = _inputs(6)
    vocab = load_model(bundled_model_dir()).config.vocab_size
    first, second = (torch.tensor(random.Random(s).sample(range(vocab), 40)) for s in (1, 2))
    runs = []
    for graphs in (True, False):
        policy = load_model(bundled_model_dir())
        drafter = load_drafter(bundled_drafter_dir(), policy)[0]
        drafter.set_draft_vocab(first)
        config = EngineConfig(max_batch_size=3, device="cuda", dtype="float64", cuda_graphs=graphs)
        engine = Engine(policy, config, drafter=drafter, selector=build_selector("3_2_6"))
        engine.generate(inputs)
        drafter.set_draft_vocab(second)
        runs.append(engine.generate(inputs))
    graphed, eager = runs
    assert [o.token_ids for o in graphed] == [o.token_ids for o in eager]
    assert [o.accept_lengths for o in graphed] == [o.accept_lengths for o in eager]
