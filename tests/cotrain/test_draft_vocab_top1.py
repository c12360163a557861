"""Top-1 agreement with a reduced draft vocabulary is agreement with the policy's own top-1 token over its whole
vocabulary: a position whose policy token lies outside the draft vocabulary is a miss, as it is in drafting, however
well the drafter agrees with the policy's choice among the K draft tokens."""

from __future__ import annotations

import random

import pytest
import torch

from fastrl.assets_path import bundled_drafter_dir, bundled_model_dir
from fastrl.cotrain.drafter_trainer import DrafterTrainer, DrafterTrainerConfig
from fastrl.cotrain.eagle_loss import EagleLossConfig, eagle_loss, top1_positions
from fastrl.cotrain.feature_sequence import FeatureBatch
from fastrl.cotrain.features import policy_features
from fastrl.engine.config import EngineConfig
from fastrl.engine.engine import Engine, GenerateInput
from fastrl.models.checkpoint import load_model
from fastrl.models.tokenizer import load_tokenizer
from fastrl.rl.tasks.task import ArithChainTask
from fastrl.sampling.params import SamplingParams
from fastrl.speculative.draft_vocab import most_frequent_tokens
from fastrl.speculative.drafter_checkpoint import load_drafter


@pytest.fixture(scope="module")
def bundled():
    """The bundled policy, its shipped (trained) drafter and the features of 6 greedy rollouts."""
    policy = load_model(bundled_model_dir()).eval()
    drafter = load_drafter(bundled_drafter_dir(), policy)[0].eval()
    tokenizer = load_tokenizer(bundled_model_dir())
    rng = random.Random(11)
    prompts = [tokenizer(ArithChainTask().sample_problem(rng).prompt)["input_ids"] for _ in range(6)]
    params = SamplingParams(max_new_tokens=48, temperature=0.0)
    outputs = Engine(policy, EngineConfig(max_batch_size=6)).generate([GenerateInput(p, params) for p in prompts])
    sequences = [p + o.token_ids for p, o in zip(prompts, outputs, strict=True)]
    return policy, drafter, sequences, policy_features(policy, sequences, extra_layers=drafter.extra_layers)


@torch.no_grad()
def agreement(policy, drafter, batch: FeatureBatch) -> tuple[float, float]:
    """(drafted token == the policy's top-1 over V, argmaxes equal among the K draft tokens) at step 0."""
    pred = drafter(policy, batch.tokens, batch.features, batch.positions)[batch.mask]
    target = batch.targets[batch.mask]
    drafted = drafter.draft_logits(policy, pred).argmax(-1)
    full = float((drafter.draft_vocab[drafted] == policy.logits(target).argmax(-1)).float().mean())
    among_k = float((drafted == drafter.draft_logits(policy, target).argmax(-1)).float().mean())
    return full, among_k


def test_top1_is_agreement_with_the_policys_top1_over_its_whole_vocabulary(bundled):
    policy, drafter, sequences, features = bundled
    batch = FeatureBatch.collate(features, target_size=drafter.config.hidden_size)
    try:
        drafter.set_draft_vocab(most_frequent_tokens(sequences[:3], 10, policy.config.vocab_size))
        loss = eagle_loss(drafter, policy, batch, EagleLossConfig(ttt_steps=2))
        held_out = DrafterTrainer(drafter, policy, DrafterTrainerConfig(ttt_steps=2)).evaluate(features)
        full, among_k = agreement(policy, drafter, batch)
    finally:
        drafter.set_draft_vocab(None)
    assert among_k > full + 0.1  # a draft vocabulary this small misses many of the policy's tokens
    assert float(loss.top1) == pytest.approx(full) and held_out.top1 == pytest.approx(full)
    assert loss.step_top1[0] == pytest.approx(full) and loss.step_top1[1] <= among_k


def test_a_draft_vocabulary_without_the_policys_tokens_agrees_nowhere(bundled):
    policy, drafter, _, features = bundled
    batch = FeatureBatch.collate(features, target_size=drafter.config.hidden_size)
    preferred = set(policy.logits(batch.targets[batch.mask]).argmax(-1).tolist())
    others = torch.tensor([t for t in range(policy.config.vocab_size) if t not in preferred])
    try:
        drafter.set_draft_vocab(others)
        loss = eagle_loss(drafter, policy, batch, EagleLossConfig(ttt_steps=3))
    finally:
        drafter.set_draft_vocab(None)
    assert float(loss.top1) == 0.0 and loss.step_top1 == [0.0, 0.0, 0.0]


def test_without_a_draft_vocabulary_top1_is_unchanged(bundled):
    policy, drafter, _, features = bundled
    batch = FeatureBatch.collate(features, target_size=drafter.config.hidden_size)
    loss = eagle_loss(drafter, policy, batch, EagleLossConfig(ttt_steps=1))
    with torch.no_grad():
        pred = drafter(policy, batch.tokens, batch.features, batch.positions)[batch.mask]
        expected = policy.logits(pred).argmax(-1) == policy.logits(batch.targets[batch.mask]).argmax(-1)
    assert float(loss.top1) == pytest.approx(float(expected.float().mean())) and float(loss.top1) > 0.5


@pytest.mark.parametrize("limit", [1, 7, 40])
def test_a_limited_top1_is_the_same_measure_on_evenly_spread_targets(bundled, limit):
    """A training step measures top-1 on at most TRAIN_TOP1_TARGETS targets (the full-vocabulary head product on
    every target doubled a SmolLM2 step): on those it is exactly the whole measure's per-target agreement."""
    policy, drafter, sequences, features = bundled
    batch = FeatureBatch.collate(features, target_size=drafter.config.hidden_size)
    chosen = top1_positions(batch.mask, limit)
    assert int(chosen.sum()) == limit and not bool((chosen & ~batch.mask).any())
    assert torch.equal(top1_positions(batch.mask, None), batch.mask)
    assert torch.equal(top1_positions(batch.mask, int(batch.mask.sum())), batch.mask)
    try:
        drafter.set_draft_vocab(most_frequent_tokens(sequences[:3], 10, policy.config.vocab_size))
        limited = eagle_loss(drafter, policy, batch, EagleLossConfig(ttt_steps=1), top1_targets=limit)
        whole = eagle_loss(drafter, policy, batch, EagleLossConfig(ttt_steps=1))
        with torch.no_grad():
            pred = drafter(policy, batch.tokens, batch.features, batch.positions)
            drafted = drafter.draft_vocab[drafter.draft_logits(policy, pred).argmax(-1)]
            hits = drafted == policy.logits(batch.targets).argmax(-1)  # [B,S], read where chosen
    finally:
        drafter.set_draft_vocab(None)
    assert float(limited.top1) == pytest.approx(float(hits[chosen].float().mean()))
    assert float(whole.top1) == pytest.approx(float(hits[batch.mask].float().mean()))
    assert limited.total.item() == pytest.approx(whole.total.item())  # the loss itself is over every target
