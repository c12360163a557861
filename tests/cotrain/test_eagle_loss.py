"""The training-time test: unrolled steps equal the drafter run step by step as a drafting chain runs it, one
unrolled step is EAGLE-1's loss, and gradients reach through the drafter's own features."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fastrl.cotrain.eagle_loss import EagleLossConfig, eagle_loss, unrolled_predictions
from fastrl.cotrain.feature_sequence import FeatureBatch
from fastrl.cotrain.features import policy_features
from fastrl.models.checkpoint import load_model
from fastrl.speculative.drafter import EagleDrafter
from tests.helpers import make_hf_model


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    path = tmp_path_factory.mktemp("policy")
    make_hf_model("llama").save_pretrained(path)
    policy = load_model(path)
    for p in policy.parameters():
        p.requires_grad_(False)
    torch.manual_seed(0)
    drafter = EagleDrafter(policy.config).eval()
    g = torch.Generator().manual_seed(1)
    seqs = policy_features(policy, [torch.randint(3, 97, (n,), generator=g).tolist() for n in (13, 9, 11)])
    return policy, drafter, FeatureBatch.collate(seqs, target_size=policy.config.hidden_size)


def drafted_chain(drafter, policy, batch: FeatureBatch, row: int, root: int, steps: int) -> list[torch.Tensor]:
    """Step by step as `grow_chain` drafts: the real entries 1..p in the drafter's cache at their positions, then
    level k at cache entry base + k, reading token x_{p+k} and the previous level's output.  # -> steps x [H]"""
    p = int(batch.positions[row, root])
    base = int(batch.positions[row, -1]) + steps + 1
    cache = drafter.new_cache(1, base + steps + 1, torch.float32, "cpu")
    slots = torch.zeros(1, dtype=torch.long)
    positions = batch.positions[row : row + 1, : root + 1]
    keys = torch.arange(base + steps + 1)
    mask = ((keys >= 1) & (keys <= positions.unsqueeze(-1)))[:, :, : base + 1]
    real = drafter(
        policy, batch.tokens[row : row + 1, : root + 1], batch.features[row : row + 1, : root + 1], positions,
        cache, slots, positions, mask,
    )  # fmt: skip
    outputs = [real[0, -1]]
    prefix = (keys[: base + 1] >= 1) & (keys[: base + 1] <= p)
    for level in range(1, steps):
        level_mask = torch.cat([prefix, torch.ones(level, dtype=torch.bool)]).view(1, 1, -1)
        token = batch.tokens[row : row + 1, root + level : root + level + 1]
        out = drafter(
            policy, token, outputs[-1].view(1, 1, -1), torch.tensor([[p + level]]), cache, slots,
            torch.tensor([[base + level]]), level_mask,
        )  # fmt: skip
        outputs.append(out[0, 0])
    return outputs


@torch.no_grad()
def test_unrolled_steps_equal_drafting_step_by_step(setup):
    policy, drafter, batch = setup
    steps = 4
    preds = unrolled_predictions(drafter, policy, batch.tokens, batch.features, batch.positions, [1.0] * steps)
    assert len(preds) == steps
    lengths = batch.mask.sum(1) + 1
    checked = 0
    for row in range(batch.tokens.shape[0]):
        for root in range(int(lengths[row]) - steps + 1):
            chain = drafted_chain(drafter, policy, batch, row, root, steps)
            for k in range(steps):
                torch.testing.assert_close(preds[k][row, root], chain[k], rtol=1e-5, atol=1e-5)
                checked += 1
    assert checked > 50
    different = (preds[1][0, :5] - preds[0][0, 1:6]).abs().max()
    assert different > 1e-3  # step 1 reads the drafter's own feature, not the policy's


def test_one_step_is_eagle1_loss(setup):
    policy, drafter, batch = setup
    torch.manual_seed(3)
    loss = eagle_loss(drafter, policy, batch, EagleLossConfig(ttt_steps=1))
    pred = drafter(policy, batch.tokens, batch.features, batch.positions)[batch.mask]
    target = batch.targets[batch.mask]
    head = policy.lm_head.weight
    token = -(torch.softmax(target @ head.T, -1) * torch.log_softmax(pred @ head.T, -1)).sum(-1).mean()
    expected = F.smooth_l1_loss(pred, target) + 0.1 * token
    torch.testing.assert_close(loss.total, expected)
    torch.testing.assert_close(loss.token, token.detach())
    assert loss.count == int(batch.mask.sum()) and len(loss.step_top1) == 1


def test_unrolled_steps_change_the_loss_and_draft_vocab_is_kept(setup):
    policy, drafter, batch = setup
    one = eagle_loss(drafter, policy, batch, EagleLossConfig(ttt_steps=1))
    three = eagle_loss(drafter, policy, batch, EagleLossConfig(ttt_steps=3, step_weights=[0.0, 0.0, 1.0]))
    assert len(three.step_top1) == 3 and not torch.isclose(one.total, three.total)
    try:
        drafter.set_draft_vocab(torch.arange(10, 40))
        reduced = eagle_loss(drafter, policy, batch, EagleLossConfig(ttt_steps=3, feature_weight=0.0))
    finally:
        drafter.set_draft_vocab(None)
    assert torch.isfinite(reduced.total)
    full = eagle_loss(drafter, policy, batch, EagleLossConfig(ttt_steps=3, feature_weight=0.0))
    assert not torch.isclose(reduced.token, full.token)


def test_gradient_flows_through_unrolled_features(setup):
    policy, drafter, batch = setup
    with torch.enable_grad():
        preds = unrolled_predictions(drafter, policy, batch.tokens, batch.features, batch.positions, [1.0] * 3)
        (through,) = torch.autograd.grad(preds[2][batch.mask].pow(2).sum(), preds[0], retain_graph=True)
        assert through.abs().sum() > 0  # step 2 depends on step 0's output through step 1's input
        only_last = eagle_loss(drafter, policy, batch, EagleLossConfig(ttt_steps=3, step_weights=[0.0, 0.0, 1.0]))
        grads = torch.autograd.grad(only_last.total, list(drafter.fc.parameters()))
    assert all(g.abs().sum() > 0 for g in grads)


@pytest.mark.parametrize(
    "kwargs, key",
    [
        ({"ttt_steps": 0}, "ttt_steps"),
        ({"ttt_steps": 2, "step_weights": [1.0]}, "step_weights"),
        ({"ttt_steps": 2, "step_weights": [0.0, 0.0]}, "step_weights"),
        ({"step_decay": 0.0}, "step_decay"),
        ({"feature_weight": 0.0, "ce_weight": 0.0}, "ce_weight"),
        ({"ttt_steps": 3, "step_weights": [float("nan"), 1.0, 1.0]}, "step_weights must be finite"),
        ({"ttt_steps": 2, "step_weights": [1e308, 1e308]}, "positive finite sum"),
        ({"step_decay": float("nan")}, "step_decay must be a finite number > 0"),
        ({"step_decay": float("inf")}, "step_decay must be a finite number > 0"),
        ({"ttt_steps": 3, "step_decay": 1e300}, r"step_decay \*\* k for k < ttt_steps"),
        ({"ttt_steps": 3, "step_decay": 1e-300}, r"step_decay \*\* k for k < ttt_steps"),
        ({"feature_weight": float("nan")}, "feature_weight and ce_weight must be finite"),
        ({"ce_weight": float("inf")}, "feature_weight and ce_weight must be finite"),
    ],
)
def test_bad_loss_config_names_the_key(kwargs, key):
    with pytest.raises(ValueError, match=key):
        EagleLossConfig(**kwargs)
