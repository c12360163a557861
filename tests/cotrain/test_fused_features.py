"""EAGLE-3's fused input: the extra layers' states come before the final-norm state, the hooks leave the policy as
they found it, training targets stay the final-norm state, and a fresh fused drafter starts as the last-layer one."""

from __future__ import annotations

import copy

import pytest
import torch

from fastrl.cotrain.chain_accept import greedy_chain_accept_length
from fastrl.cotrain.drafter_trainer import DrafterTrainer, DrafterTrainerConfig
from fastrl.cotrain.eagle_loss import eagle_loss
from fastrl.cotrain.feature_sequence import FeatureBatch
from fastrl.cotrain.features import policy_features
from fastrl.models.checkpoint import load_model
from fastrl.speculative.drafter import EagleDrafter
from fastrl.speculative.fused_drafter import FusedEagleDrafter
from tests.helpers import make_hf_model


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    path = tmp_path_factory.mktemp("policy")
    make_hf_model("llama").save_pretrained(path)
    return load_model(path).eval()


def sequences() -> list[list[int]]:
    g = torch.Generator().manual_seed(3)
    return [torch.randint(3, 97, (n,), generator=g).tolist() for n in (12, 7)]


def test_fused_features_end_with_the_final_state(policy):
    hidden = policy.config.hidden_size
    plain = policy_features(policy, sequences())
    fused = policy_features(policy, sequences(), extra_layers=(0, 1))
    for p, f in zip(plain, fused, strict=True):
        assert f.features.shape == (p.features.shape[0], 3 * hidden)
        torch.testing.assert_close(f.features[:, 2 * hidden :], p.features)
        assert not torch.allclose(f.features[:, :hidden], f.features[:, hidden : 2 * hidden])
    assert all(not layer._forward_hooks for layer in policy.model.layers)
    batch = FeatureBatch.collate(fused, target_size=hidden)
    torch.testing.assert_close(batch.targets[0, :10], fused[0].features[1:11, 2 * hidden :])


def test_bad_layer_is_named(policy):
    with pytest.raises(ValueError, match="extra_layers"):
        policy_features(policy, sequences(), extra_layers=(len(policy.model.layers),))


def test_fresh_fused_drafter_starts_as_last_layer_one_and_trains(policy):
    fused_seqs = policy_features(policy, sequences(), extra_layers=(0,))
    torch.manual_seed(0)
    last = EagleDrafter(policy.config).eval()
    torch.manual_seed(0)
    fused = FusedEagleDrafter(policy.config, (0,)).eval()
    batch = FeatureBatch.collate(fused_seqs, target_size=policy.config.hidden_size)
    plain_features = batch.features[..., policy.config.hidden_size :]
    with torch.no_grad():
        expected = last(policy, batch.tokens, plain_features, batch.positions)
        torch.testing.assert_close(fused(policy, batch.tokens, batch.features, batch.positions), expected)
    before = fused.fuse.weight.clone()
    DrafterTrainer(fused, policy, DrafterTrainerConfig(lr=1e-2, warmup_steps=0)).train_step(fused_seqs)
    assert not torch.equal(fused.fuse.weight, before)


def test_last_layer_features_are_refused_by_every_reader_of_a_fused_drafter(policy):
    """A fused drafter reads [.., m·H]; [.., H] features (extra_layers forgotten) would pass for its own outputs and
    skip the fuse. Training, evaluation, the loss and the chain walk refuse them alike, naming both widths."""
    hidden = policy.config.hidden_size
    narrow = policy_features(policy, sequences())
    drafter = FusedEagleDrafter(policy.config, (0,)).eval()
    trainer = DrafterTrainer(drafter, policy, DrafterTrainerConfig())
    batch = FeatureBatch.collate(narrow, target_size=hidden)
    reads = rf"features are \[.., {hidden}\], the drafter reads \[.., {2 * hidden}\]"
    for call in (
        lambda: trainer.train_step(narrow),
        lambda: trainer.evaluate(narrow),
        lambda: eagle_loss(drafter, policy, batch),
        lambda: greedy_chain_accept_length(drafter, policy, narrow, [3, 3], 2),
    ):
        with pytest.raises(ValueError, match=reads):
            call()


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_features_are_kept_in_float32_whatever_the_policys_dtype(policy, dtype):
    """As docs/architecture.md says: the forward runs in the policy's dtype, the features are its float32 rounding."""
    ids = sequences()[1]
    cast = copy.deepcopy(policy).to(dtype)
    features = policy_features(cast, [ids])[0].features
    with torch.no_grad():
        hidden = cast(torch.tensor([ids]), torch.arange(len(ids))[None], compute_logits=False).hidden[0, :-1]
    assert features.dtype == torch.float32 and torch.equal(features, hidden.float())
    assert dtype != torch.float64 or not torch.equal(features.double(), hidden)  # float64 is rounded, not kept
