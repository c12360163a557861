"""DrafterTrainer's inputs: an empty batch is one clear error, and a non-finite feature is refused by evaluation as
it is by a training step (never NaN metrics)."""

from __future__ import annotations

import math

import pytest
import torch

from fastrl.cotrain.drafter_trainer import DrafterTrainer, DrafterTrainerConfig
from fastrl.cotrain.feature_sequence import FeatureSequence
from fastrl.cotrain.features import policy_features
from fastrl.models.checkpoint import load_model
from fastrl.speculative.drafter import EagleDrafter
from tests.helpers import make_hf_model


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    path = tmp_path_factory.mktemp("policy")
    make_hf_model("llama").save_pretrained(path)
    policy = load_model(path).eval()
    torch.manual_seed(0)
    drafter = EagleDrafter(policy.config).eval()
    g = torch.Generator().manual_seed(2)
    seqs = policy_features(policy, [torch.randint(3, 97, (n,), generator=g).tolist() for n in (9, 12)])
    return policy, drafter, seqs


def test_an_empty_batch_is_one_clear_error(setup):
    policy, drafter, _ = setup
    trainer = DrafterTrainer(drafter, policy, DrafterTrainerConfig(feature_noise=0.0))
    with pytest.raises(ValueError, match="no sequences"):
        trainer.train_step([])
    assert trainer.step_count == 0


def test_a_nan_feature_is_refused_by_evaluation_as_by_a_training_step(setup):
    policy, drafter, seqs = setup
    broken = [FeatureSequence(s.tokens, s.features.clone(), s.start_position) for s in seqs]
    broken[0].features[2, 3] = float("nan")
    trainer = DrafterTrainer(drafter, policy, DrafterTrainerConfig(feature_noise=0.0))
    assert math.isfinite(trainer.evaluate(seqs).loss)
    with pytest.raises(FloatingPointError, match="non-finite drafter loss nan at step 1"):
        trainer.train_step(broken)
    with pytest.raises(FloatingPointError, match="non-finite drafter loss nan in evaluation"):
        trainer.evaluate(broken)
    assert not drafter.training and trainer.step_count == 0


def test_train_drafter_leaves_out_held_out_rollouts_whose_features_are_not_finite(tmp_path, monkeypatch, capsys):
    """Evaluation refuses a NaN, so the held-out set keeps only finite rollouts (as training shards do) and the
    run's held-out figures stay numbers."""
    import fastrl.cotrain.offline as offline

    path = tmp_path / "policy"
    make_hf_model("llama", seed=4).save_pretrained(path)
    policy = load_model(path)
    real = offline.policy_features

    def one_nan(*args, **kwargs):  # offline.py computes only the held-out features itself
        seqs = real(*args, **kwargs)
        seqs[0].features[1, 0] = float("nan")
        return seqs

    monkeypatch.setattr(offline, "policy_features", one_nan)
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13], [14, 3, 9, 9, 2]]
    cfg = offline.OfflineDrafterConfig(
        num_prompts=4, eval_prompts=2, max_new_tokens=10, epochs=1, shard_requests=2, gen_batch_size=4,
        accept_requests=1, accept_batch_size=1, accept_strategies=["3_1_4"],
    )  # fmt: skip
    torch.manual_seed(0)
    report = offline.train_offline(policy, EagleDrafter(policy.config), prompts, prompts[:2], cfg, tmp_path / "s", "t")
    assert math.isfinite(report.epochs[-1].metrics.loss)
    assert "1 held-out rollouts' policy features are not finite: left out" in capsys.readouterr().out
