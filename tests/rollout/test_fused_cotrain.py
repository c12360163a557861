"""Co-training a fused (EAGLE-3 input) drafter: rollouts keep the fused features (m*H wide, exactly the offline
ones), a slice trains every weight including `fuse`, the trained copy goes back into the live drafter, the state
carries extra_layers through a drafter checkpoint, and features of the wrong width are refused."""

from __future__ import annotations

import random

import pytest
import torch

from fastrl.cotrain.buffer import FeatureBuffer
from fastrl.cotrain.drafter_trainer import DrafterTrainer
from fastrl.cotrain.feature_sequence import FeatureSequence
from fastrl.cotrain.features import policy_features
from fastrl.models.checkpoint import load_model
from fastrl.rollout.engine_worker import EngineWorker
from fastrl.rollout.types import EXTRA_LAYERS_KEY
from fastrl.speculative.drafter_checkpoint import load_drafter, save_drafter
from fastrl.speculative.fused_drafter import FusedEagleDrafter
from tests.rollout.conftest import assert_same_tokens, mixed_requests, reference, worker_config
from tests.speculative.fused_helpers import random_fused_drafter

LAYERS = (0, 1)


@pytest.fixture(scope="module")
def fused_worker(checkpoint, tmp_path_factory) -> EngineWorker:
    policy = load_model(checkpoint.policy)
    path = tmp_path_factory.mktemp("fused-drafter")
    save_drafter(random_fused_drafter(policy.config, LAYERS, seed=2), path, "tiny-llama")
    return EngineWorker("fused", worker_config(checkpoint, drafter_dir=str(path)))


def test_rollouts_keep_the_fused_features(fused_worker, checkpoint):
    assert isinstance(fused_worker.drafter, FusedEagleDrafter) and fused_worker.drafter.extra_layers == LAYERS
    requests = mixed_requests(8)
    results = fused_worker.generate(requests)
    assert_same_tokens(results, reference(checkpoint.policy, requests))
    hidden = fused_worker.policy.config.hidden_size
    assert fused_worker.buffer.feature_size == 3 * hidden
    stored = fused_worker.buffer.sample(10**9, random.Random(0))
    assert stored and all(s.features.shape[-1] == 3 * hidden for s in stored)
    policy = load_model(checkpoint.policy)
    for r in results:
        if len(r.token_ids) < 2:
            continue
        full = r.prompt_ids + r.token_ids
        seq = next(s for s in stored if s.tokens.tolist() == full[1:])
        teacher = policy_features(policy, [full], extra_layers=LAYERS)[0]
        torch.testing.assert_close(seq.features, teacher.features, rtol=0, atol=1e-4)
    assert fused_worker.buffer.num_bytes >= sum(s.features.numel() * 4 for s in stored)


def test_slice_trains_fuse_and_the_state_keeps_extra_layers(fused_worker, tmp_path):
    if not fused_worker.buffer.num_sequences:
        fused_worker.generate(mixed_requests(6, prefix="fill"))
    version, live = fused_worker.drafter_state()
    assert live[EXTRA_LAYERS_KEY].tolist() == list(LAYERS)
    metrics = fused_worker.train_drafter_slice(0.3)
    assert metrics.error is None and metrics.steps > 0
    trained = fused_worker.trained_drafter()
    assert trained is not None and not torch.equal(trained.state["fuse.weight"], live["fuse.weight"])
    assert not torch.equal(trained.state["fc.weight"], live["fc.weight"])
    fused_worker.update_drafter(version + 1, trained.state)
    now = fused_worker.drafter_state()[1]
    assert torch.equal(now["fuse.weight"], trained.state["fuse.weight"])
    fused_worker.update_drafter(version + 2, now)  # a state carrying its extra layers loads back
    with pytest.raises(ValueError, match="extra_layers"):
        fused_worker.update_drafter(version + 3, {**now, EXTRA_LAYERS_KEY: torch.tensor([1])})
    # A checkpoint of the co-trained drafter keeps its layers and weights.
    save_drafter(fused_worker.drafter, tmp_path / "d", "tiny-llama", version=version + 2)
    loaded, info = load_drafter(tmp_path / "d", fused_worker.policy)
    assert info.extra_layers == LAYERS and isinstance(loaded, FusedEagleDrafter)
    assert torch.equal(loaded.fuse.weight.float(), now["fuse.weight"])


def test_heldout_top1_of_a_fused_drafter(fused_worker):
    """The held-out measure `fastrl train` reports after each rollout: its feature targets are the final-norm
    columns of the fused features (a full-width target once made every co-trained fused run fail here)."""
    cotraining = fused_worker.cotraining
    if not fused_worker.buffer.num_sequences:  # this module's tests may run on a fresh worker (xdist's order)
        fused_worker.generate(mixed_requests(6, prefix="heldout-fill"))
    sequences = fused_worker.buffer.sample(10**9, random.Random(1))
    assert sequences
    cotraining._heldout = sequences  # what the held-out schedule would have kept from these rollouts
    tokens, top1_sum = cotraining.heldout_top1(fused_worker.drafter)
    assert tokens == sum(s.num_targets for s in sequences) and 0.0 <= top1_sum <= tokens


def test_features_of_another_width_are_refused(fused_worker):
    hidden = fused_worker.policy.config.hidden_size
    last_layer = FeatureSequence(torch.arange(3, 9), torch.zeros(6, hidden), 1, 0)
    with pytest.raises(ValueError, match="feature_size"):
        FeatureBuffer(100, feature_size=3 * hidden).add(last_layer)
    trainer = DrafterTrainer(random_fused_drafter(fused_worker.policy.config, LAYERS), fused_worker.policy)
    with pytest.raises(ValueError, match=r"the drafter reads \[.., 192\]"):
        trainer.train_step([last_layer])


def test_training_checkpoint_keeps_the_fused_drafter(fused_worker, tmp_path):
    """`fastrl train`'s checkpoint writes the worker's fused drafter in the drafter layout and restores it."""
    from fastrl.rl.checkpoint import DRAFTER_DIR, _read_drafter, _save_drafter

    version, state = fused_worker.drafter_state()
    _save_drafter(fused_worker, fused_worker.drafter.config, tmp_path / DRAFTER_DIR)
    loaded, info = load_drafter(tmp_path / DRAFTER_DIR, fused_worker.policy)
    assert info.extra_layers == LAYERS and torch.equal(loaded.fuse.weight.float(), state["fuse.weight"])
    read_version, read = _read_drafter(tmp_path, {"has_drafter": True}, fused_worker)
    assert read_version == version and read[EXTRA_LAYERS_KEY].tolist() == list(LAYERS)
    fused_worker.update_drafter(read_version, read)
    assert all(torch.equal(fused_worker.drafter_state()[1][k], v) for k, v in state.items())


def test_training_checkpoint_keeps_the_drafters_own_layer_config(checkpoint, tmp_path):
    """A drafter's layer may differ from its policy's in keys of no shape (rope, norm epsilon), which load_drafter
    takes and the workers run; `fastrl train`'s checkpoint rebuilt the drafter from the policy's config, so the
    resumed run drafted with another function."""
    import dataclasses

    from fastrl.commands.train_config import TrainConfig
    from fastrl.commands.train_setup import drafter_layer_config
    from fastrl.rl.checkpoint import DRAFTER_DIR, _save_drafter

    policy = load_model(checkpoint.policy)
    own = dataclasses.replace(policy.config, rope_theta=50.0, rms_norm_eps=0.1)
    source = tmp_path / "drafter"
    save_drafter(random_fused_drafter(own, LAYERS, seed=3), source, "tiny-llama")
    worker = EngineWorker("own-config", worker_config(checkpoint, drafter_dir=str(source)))
    cfg = TrainConfig()
    cfg.model.path, cfg.drafter.path = checkpoint.policy, str(source)
    config = drafter_layer_config(cfg)
    assert (config.rope_theta, config.rms_norm_eps) == (50.0, 0.1)
    _save_drafter(worker, config, tmp_path / DRAFTER_DIR)
    saved, _ = load_drafter(tmp_path / DRAFTER_DIR, policy)
    assert saved.config == worker.drafter.config
    tokens, features = (
        torch.randint(0, policy.config.vocab_size, (1, 6)),
        torch.randn(1, 6, 3 * policy.config.hidden_size),
    )
    positions = torch.arange(1, 7)[None]
    with torch.no_grad():
        assert torch.equal(
            saved(policy, tokens, features, positions), worker.drafter(policy, tokens, features, positions)
        )
