"""CoTrainer: slices train a private copy (the live drafter never changes), failures are reported and discarded;
average_drafters: the step-weighted mean, refusing mismatched or non-finite states."""

from __future__ import annotations

import copy

import pytest
import torch

from fastrl.cotrain.cotrainer import CoTrainer, average_drafters
from fastrl.cotrain.drafter_trainer import DrafterTrainer, DrafterTrainerConfig
from fastrl.cotrain.features import policy_features
from fastrl.models.checkpoint import load_model
from fastrl.speculative.drafter import EagleDrafter
from tests.helpers import make_hf_model


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    path = tmp_path_factory.mktemp("policy")
    make_hf_model("llama").save_pretrained(path)
    policy = load_model(path)
    torch.manual_seed(0)
    drafter = EagleDrafter(policy.config).eval()
    g = torch.Generator().manual_seed(0)
    seqs = policy_features(policy, [torch.randint(3, 97, (24,), generator=g).tolist() for _ in range(8)])
    return policy, drafter, seqs


def states_equal(a: dict, b: dict) -> bool:
    return all(torch.equal(a[k], b[k]) for k in a)


def test_slice_trains_a_copy_and_learns(setup):
    policy, live, seqs = setup
    before = copy.deepcopy(live.state_dict())
    trainer = CoTrainer(policy, DrafterTrainerConfig(lr=3e-3, warmup_steps=0))
    trainer.prepare(live, version=4)
    assert trainer.trained() is None  # nothing trained yet
    metrics = trainer.train_slice(lambda _: seqs, seconds=30.0, should_stop=stop_after(15))
    assert metrics.error is None and metrics.steps == 15 and metrics.stopped
    assert metrics.tokens == 15 * sum(s.num_targets for s in seqs) and metrics.loss is not None
    assert states_equal(live.state_dict(), before), "the live drafter must not change"
    trained = trainer.trained()
    assert trained is not None and trained.steps == 15 and trained.base_version == 4
    assert not states_equal(trained.state, before)
    new = copy.deepcopy(live)
    new.load_state_dict(trained.state)
    frozen = DrafterTrainer(copy.deepcopy(live), policy).evaluate(seqs)
    learned = DrafterTrainer(new, policy).evaluate(seqs)
    assert learned.loss < frozen.loss
    trainer.prepare(live, version=5)  # a new live version: the copy restarts from it
    assert trainer.trained() is None and trainer.total_steps == 15


def stop_after(n: int):
    calls = iter(range(10**9))
    return lambda: next(calls) >= n


def test_empty_data_and_stop_do_nothing(setup):
    policy, live, seqs = setup
    trainer = CoTrainer(policy, DrafterTrainerConfig())
    trainer.prepare(live, version=0)
    empty = trainer.train_slice(lambda _: [], seconds=1.0)
    assert empty.steps == 0 and empty.skipped is not None and empty.error is None
    stopped = trainer.train_slice(lambda _: seqs, seconds=1.0, should_stop=lambda: True)
    assert stopped.steps == 0 and stopped.stopped and stopped.skipped is None
    assert trainer.trained() is None


def test_diverging_slice_is_reported_and_discarded(setup):
    policy, live, seqs = setup
    config = DrafterTrainerConfig(warmup_steps=0)
    config.lr = float("inf")  # past the config's own check: a diverging step
    trainer = CoTrainer(policy, config)
    trainer.prepare(live, version=0)
    metrics = trainer.train_slice(lambda _: seqs, seconds=5.0, should_stop=stop_after(3))
    assert metrics.error is not None and "FloatingPointError" in metrics.error and metrics.steps == 0
    assert trainer.trained() is None
    assert all(torch.isfinite(p).all() for p in live.parameters())
    unprepared = CoTrainer(policy, DrafterTrainerConfig()).train_slice(lambda _: seqs, seconds=1.0)
    assert unprepared.error is not None and "prepare" in unprepared.error


def test_average_is_weighted_by_steps():
    a = {"w": torch.tensor([1.0, 2.0]), "b": torch.tensor([0.0]), "n": torch.tensor([7])}
    b = {"w": torch.tensor([5.0, 6.0]), "b": torch.tensor([4.0]), "n": torch.tensor([7])}
    avg = average_drafters([(a, 1.0), (b, 3.0)])
    assert torch.allclose(avg["w"], torch.tensor([4.0, 5.0])) and torch.allclose(avg["b"], torch.tensor([3.0]))
    assert avg["w"].dtype == torch.float32 and torch.equal(avg["n"], torch.tensor([7]))
    assert torch.equal(average_drafters([(a, 2.0)])["w"], a["w"])


@pytest.mark.parametrize(
    "items, message",
    [
        ([], "nothing"),
        ([({"w": torch.ones(2)}, 0.0)], "weights"),
        ([({"w": torch.ones(2)}, 1.0), ({"v": torch.ones(2)}, 1.0)], "key"),
        ([({"w": torch.ones(2)}, 1.0), ({"w": torch.ones(3)}, 1.0)], "shape"),
        ([({"w": torch.tensor([1.0, float("nan")])}, 1.0)], "non-finite"),
    ],
)
def test_average_refuses_bad_inputs(items, message):
    with pytest.raises(ValueError, match=message):
        average_drafters(items)


@pytest.mark.parametrize("engine_dtype", [torch.float64, torch.bfloat16])
def test_the_copy_trains_in_float32_whatever_the_engines_dtype(setup, engine_dtype):
    """A float64 (CPU) or bf16 (GPU) engine's drafter is co-trained as a float32 copy: the steps' loss is that of
    float64 steps within float32 precision (from bf16 weights too: a bf16 copy would be ~10x further off), the live
    drafter and the policy stay in the engine's dtype, and the published state is float32 and finite."""
    policy32, live32, seqs = setup
    policy = copy.deepcopy(policy32).to(engine_dtype)
    live = copy.deepcopy(live32).to(engine_dtype)
    config = DrafterTrainerConfig(lr=3e-3, warmup_steps=0, feature_noise=0.0)
    trainer = CoTrainer(policy, config)
    trainer.prepare(live, version=1)
    metrics = trainer.train_slice(lambda _: seqs, seconds=30.0, max_steps=2)
    assert metrics.error is None and metrics.steps == 2
    assert live.fc.weight.dtype == engine_dtype and policy.lm_head.weight.dtype == engine_dtype
    trained = trainer.trained()
    assert trained is not None and all(
        v.dtype == torch.float32 and torch.isfinite(v).all() for v in trained.state.values()
    )
    reference = DrafterTrainer(
        copy.deepcopy(live32).to(torch.float64), copy.deepcopy(policy32).to(torch.float64), config
    )
    expected = [reference.train_step(seqs) for _ in range(2)]
    expected_loss = sum(m.loss * m.tokens for m in expected) / sum(m.tokens for m in expected)
    # float32 steps: within 1e-5 of float64 ones, from a float64 engine or a bf16 one (a bf16 copy: ~2e-3 off)
    assert metrics.loss == pytest.approx(expected_loss, rel=1e-5 if engine_dtype == torch.float64 else 2e-4)


def test_a_new_live_version_brings_its_draft_vocabulary_to_the_copy(setup):
    """The draft vocabulary is a buffer outside the state dict: a copy restarted from a live drafter whose vocabulary
    changed (or was dropped) must train over the live one's, not the one it was first copied with."""
    policy, live, seqs = setup
    live = copy.deepcopy(live)
    trainer = CoTrainer(policy, DrafterTrainerConfig(lr=3e-3, warmup_steps=0))
    for version, ids in enumerate([torch.arange(3, 40), torch.arange(50, 87), None, torch.arange(10, 90)]):
        live.set_draft_vocab(ids)
        trainer.prepare(live, version=version)
        trainer.train_slice(lambda _: seqs, seconds=30.0, should_stop=stop_after(1))
        copied = trainer._drafter.draft_vocab
        assert (copied is None) == (ids is None) and (ids is None or torch.equal(copied, ids)), version
