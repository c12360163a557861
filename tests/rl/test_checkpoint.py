"""Training checkpoints: a run of 4 steps equals 2 steps + checkpoint + 2 resumed steps, bit for bit; the files
load with the standard loaders and without pickle."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from fastrl.models.checkpoint import load_model
from fastrl.rl.checkpoint import read_trainer_state
from fastrl.rl.optimizer_state import load_optimizer, save_optimizer
from fastrl.rl.trainer import GRPOTrainer
from fastrl.rl.trainer_config import GRPOConfig
from fastrl.rollout.local import LocalRollout
from fastrl.speculative.drafter_checkpoint import load_drafter
from tests.rl.grpo_setup import DigitTask, char_tokenizer, local_backend, tiny_policy

STRATEGY = "3_2_6"


def _config(tmp_path, name: str, **overrides) -> GRPOConfig:
    settings = dict(
        steps=4,
        prompts_per_step=2,
        samples_per_prompt=4,
        max_new_tokens=10,
        lr=1e-2,
        weight_decay=0.01,
        kl_coef=0.05,
        ppo_epochs=2,
        mini_batches=2,
        micro_batch_tokens=48,
        top_p=0.95,
        checkpoint_every=2,
        checkpoint_dir=str(tmp_path / name),
        progress=False,
    )
    settings.update(overrides)
    return GRPOConfig(**settings)


def _trainer(config: GRPOConfig, seed: int, cotrain: bool = False) -> tuple[GRPOTrainer, LocalRollout]:
    """Trainer and speculative backend; `seed` sets the initial policy, the backend's weights and its drafter."""
    policy = tiny_policy(seed=seed)
    served = Path(config.checkpoint_dir or "unused").with_suffix(".served")
    backend = local_backend(served, policy, strategy=STRATEGY, cotrain=cotrain, seed=seed)
    return GRPOTrainer(policy, char_tokenizer(), DigitTask(), backend, config), backend


def _trajectory(metrics) -> list[tuple]:
    return [
        (m.step, m.policy_version, m.reward_mean, m.response_tokens, m.mean_accept_length, m.loss, m.kl, m.grad_norm)
        for m in metrics
    ]


def test_resume_continues_exactly(tmp_path):
    full, full_backend = _trainer(_config(tmp_path, "full"), seed=0)
    history = full.train()
    assert (tmp_path / "full" / "step_000002").is_dir() and (tmp_path / "full" / "step_000004").is_dir()

    # another initial policy, backend weights and drafter: everything must come from the checkpoint
    resumed, resumed_backend = _trainer(_config(tmp_path, "resumed"), seed=11)
    resumed.resume(tmp_path / "full" / "step_000002")
    assert (resumed.step, resumed.version) == (2, 2)
    tail = resumed.train()

    assert _trajectory(tail) == _trajectory(history[2:])
    assert all(m.mean_accept_length > 1.0 for m in history)  # speculation ran: the drafter state matters
    for name, value in full.policy.state_dict().items():
        assert torch.equal(resumed.policy.state_dict()[name], value), name
        assert torch.equal(resumed_backend.worker.policy.state_dict()[name], value), name
    for name, value in full.updater.reference.state_dict().items():
        assert torch.equal(resumed.updater.reference.state_dict()[name], value), name
    for name, value in full_backend.worker.drafter.state_dict().items():
        assert torch.equal(resumed_backend.worker.drafter.state_dict()[name], value), name
    full_opt, resumed_opt = full.updater.optimizer.state_dict(), resumed.updater.optimizer.state_dict()
    assert full_opt["param_groups"] == resumed_opt["param_groups"]
    for pid, entries in full_opt["state"].items():
        for key, value in entries.items():
            assert torch.equal(resumed_opt["state"][pid][key], value), (pid, key)
    # and the resumed run's own checkpoint equals the uninterrupted run's
    assert read_trainer_state(tmp_path / "resumed" / "step_000004")["step"] == 4


def test_resume_with_cotraining_keeps_rollouts_and_weights_exact(tmp_path):
    """Co-training runs for wall-clock slices, so the drafter differs between runs; the rollouts and the policy
    must not (speculative decoding is exact whatever the drafter)."""
    config = _config(tmp_path, "full", kl_coef=0.0, ppo_epochs=1, mini_batches=1)
    full, _ = _trainer(config, seed=0, cotrain=True)
    history = full.train()
    assert history[-1].drafter_version > 0  # the drafter was co-trained
    resumed, _ = _trainer(_config(tmp_path, "resumed", kl_coef=0.0, ppo_epochs=1, mini_batches=1), 5, cotrain=True)
    resumed.resume(tmp_path / "full" / "step_000002")
    tail = resumed.train()
    assert [(m.reward_mean, m.response_tokens, m.loss) for m in tail] == [
        (m.reward_mean, m.response_tokens, m.loss) for m in history[2:]
    ]
    assert all(torch.equal(resumed.policy.state_dict()[k], v) for k, v in full.policy.state_dict().items())


def test_checkpoint_files_load_with_standard_loaders_and_no_pickle(tmp_path):
    trainer, backend = _trainer(_config(tmp_path, "run", steps=1, checkpoint_every=0), seed=2)
    backend.worker.drafter_version = 5
    trainer.train()
    path = trainer.save_checkpoint(tmp_path / "ckpt")
    names = {p.name for p in path.rglob("*") if p.is_file()}
    assert not any(n.endswith((".pt", ".pth", ".bin", ".pkl")) for n in names), names
    state = json.loads((path / "trainer_state.json").read_text())
    assert (state["step"], state["policy_version"]) == (1, 1)
    assert GRPOConfig(**state["config"]) == trainer.config
    policy = load_model(path / "policy")
    assert all(torch.equal(policy.state_dict()[k], v) for k, v in trainer.policy.state_dict().items())
    drafter, info = load_drafter(path / "drafter", policy)
    assert info.version == 5
    assert all(torch.equal(drafter.state_dict()[k], v) for k, v in backend.worker.drafter.state_dict().items())
    assert json.loads((path / "rollout_selector.json").read_text()) == backend.selector_state()
    assert (path / "reference" / "model.safetensors").is_file()
    assert not (tmp_path / "ckpt.tmp").exists()


def test_optimizer_state_round_trip_gives_identical_next_steps(tmp_path):
    def make():
        model = tiny_policy(seed=4, tied=True)
        return model, torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.8, 0.95), weight_decay=0.1)

    def step(model, opt, k):
        opt.zero_grad()
        x = torch.arange(6).view(1, 6) + k
        model(x, torch.arange(6).view(1, 6)).logits.square().mean().backward()
        opt.step()

    a, opt_a = make()
    for k in range(3):
        step(a, opt_a, k)
    save_optimizer(opt_a, tmp_path)
    b, opt_b = make()
    b.load_state_dict(a.state_dict())
    load_optimizer(opt_b, tmp_path)
    assert opt_b.param_groups[0]["betas"] == (0.8, 0.95)
    step(a, opt_a, 3)
    step(b, opt_b, 3)
    assert all(torch.equal(b.state_dict()[k], v) for k, v in a.state_dict().items())

    _, other = make()
    other.add_param_group({"params": [torch.nn.Parameter(torch.zeros(2))]})
    with pytest.raises(ValueError, match="parameter groups"):
        load_optimizer(other, tmp_path)


def test_resume_refuses_a_different_trajectory(tmp_path):
    trainer, _ = _trainer(_config(tmp_path, "run", steps=1, checkpoint_every=1), seed=3)
    trainer.train()
    changed = dataclasses.replace(_config(tmp_path, "other", steps=3), lr=5e-3, samples_per_prompt=2)
    other, _ = _trainer(changed, seed=3)
    with pytest.raises(ValueError, match=r"\['rl.samples_per_prompt', 'rl.lr'\]"):
        other.resume(tmp_path / "run" / "step_000001")
    longer, _ = _trainer(_config(tmp_path, "longer", steps=2, logprob_tolerance=1e-2), seed=3)
    longer.resume(tmp_path / "run" / "step_000001")  # steps / tolerance / checkpoint_dir may change
    assert [m.step for m in longer.train()] == [1]


def test_not_a_checkpoint_raises(tmp_path):
    trainer, _ = _trainer(_config(tmp_path, "run"), seed=0)
    with pytest.raises(ValueError, match="trainer_state.json is missing"):
        trainer.resume(tmp_path)


def test_drift_is_tracked_and_survives_resume(tmp_path):
    """track_drift keeps the initial policy (checkpointed like the KL reference) and reports KL(policy || initial):
    0 before the first update, positive after; a resumed run reports the same values."""
    config = _config(tmp_path, "full", kl_coef=0.0, track_drift=True, steps=3, checkpoint_every=1)
    full, _ = _trainer(config, seed=0)
    history = full.train()
    assert history[0].drift_kl == pytest.approx(0.0, abs=1e-6) and history[2].drift_kl > 1e-4
    resumed, _ = _trainer(_config(tmp_path, "resumed", kl_coef=0.0, track_drift=True, steps=3), seed=7)
    resumed.resume(tmp_path / "full" / "step_000001")
    assert [m.drift_kl for m in resumed.train()] == [m.drift_kl for m in history[1:]]


def test_drift_stays_finite_when_the_reference_filters_out_sampled_tokens(tmp_path):
    """With top-k, a policy that moved samples tokens the initial policy's filter excludes: the drift figure
    was inf from then on (invalid JSON in metrics.jsonl); it is the estimate over the tokens both can sample."""
    config = _config(tmp_path, "run", kl_coef=0.0, track_drift=True, steps=4, top_p=1.0, top_k=2, lr=0.3)
    history = _trainer(config, seed=0)[0].train()
    drifts = [m.drift_kl for m in history]
    assert all(m.finite() for m in history), drifts
    assert drifts[0] == pytest.approx(0.0, abs=1e-6) and max(drifts) > 1e-3


def test_draft_vocabulary_is_checkpointed(tmp_path):
    config = _config(tmp_path, "full", steps=1, checkpoint_every=1)
    full, backend = _trainer(config, seed=0)
    vocab = torch.arange(3, 40)
    backend.worker.drafter.set_draft_vocab(vocab)
    full.train()
    assert (tmp_path / "full" / "step_000001" / "drafter" / "draft_vocab.safetensors").is_file()
    resumed, resumed_backend = _trainer(_config(tmp_path, "resumed", steps=1), seed=3)
    assert resumed_backend.worker.drafter.draft_vocab is None
    resumed.resume(tmp_path / "full" / "step_000001")
    assert torch.equal(resumed_backend.worker.drafter.draft_vocab, vocab)
