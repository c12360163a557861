"""The engine-free chain walk pairs each rollout with its own prompt length (by position in the lists, whatever the
objects), and refuses bad inputs with one error naming the argument."""

from __future__ import annotations

import random

import pytest
import torch

from fastrl.assets_path import bundled_drafter_dir, bundled_model_dir
from fastrl.cotrain.chain_accept import greedy_chain_accept_length as walk
from fastrl.cotrain.feature_sequence import FeatureSequence
from fastrl.cotrain.features import policy_features
from fastrl.engine.config import EngineConfig
from fastrl.engine.engine import Engine, GenerateInput
from fastrl.models.checkpoint import load_model
from fastrl.models.tokenizer import load_tokenizer
from fastrl.rl.tasks.task import ArithChainTask
from fastrl.sampling.params import SamplingParams
from fastrl.speculative.drafter_checkpoint import load_drafter


@pytest.fixture(scope="module")
def rollout():
    """The bundled policy, its shipped drafter, one greedy rollout's features and its prompt length."""
    policy = load_model(bundled_model_dir()).eval()
    drafter = load_drafter(bundled_drafter_dir(), policy)[0].eval()
    prompt = load_tokenizer(bundled_model_dir())(ArithChainTask().sample_problem(random.Random(5)).prompt)["input_ids"]
    params = SamplingParams(max_new_tokens=40, temperature=0.0)
    output = Engine(policy, EngineConfig(max_batch_size=1)).generate([GenerateInput(prompt, params)])[0]
    features = policy_features(policy, [prompt + output.token_ids], extra_layers=drafter.extra_layers)[0]
    return policy, drafter, features, len(prompt)


def copy(seq: FeatureSequence) -> FeatureSequence:
    return FeatureSequence(seq.tokens.clone(), seq.features.clone(), seq.start_position, seq.policy_version)


def test_the_same_sequence_listed_twice_keeps_each_prompt_length(rollout):
    policy, drafter, seq, n = rollout
    assert walk(drafter, policy, [seq], [n], 5) != walk(drafter, policy, [seq], [n + 10], 5)  # the lengths matter
    twice = walk(drafter, policy, [seq, seq], [n, n + 10], 5)
    assert twice == pytest.approx(walk(drafter, policy, [seq, copy(seq)], [n, n + 10], 5))
    assert twice == pytest.approx(walk(drafter, policy, [seq, seq], [n + 10, n], 5))


@pytest.mark.parametrize(
    ("lengths", "depth", "message"),
    [
        ([0], 5, r"prompt_lengths\[0\] must be an integer in 1\.\."),
        ([-3], 5, r"prompt_lengths\[0\] must be an integer in 1\.\."),
        (["last"], 5, r"prompt_lengths\[0\] must be an integer in 1\.\."),
        ([10_000], 5, r"prompt_lengths\[0\] must be an integer in 1\.\."),
        ([], 5, r"seqs and prompt_lengths differ in length \(1 and 0\)"),
        (None, 0, "depth must be an integer >= 1, got 0"),
        (None, -1, "depth must be an integer >= 1, got -1"),
        (None, 2.0, "depth must be an integer >= 1, got 2.0"),
    ],
)
def test_bad_inputs_name_the_argument(rollout, lengths, depth, message):
    policy, drafter, seq, n = rollout
    with pytest.raises(ValueError, match=message):
        walk(drafter, policy, [seq], [n] if lengths is None else lengths, depth)


def test_no_sequences_and_a_cut_sequence_are_refused(rollout):
    policy, drafter, seq, n = rollout
    with pytest.raises(ValueError, match="seqs is empty"):
        walk(drafter, policy, [], [], 3)
    cut = FeatureSequence(seq.tokens[4:], seq.features[4:], seq.start_position + 4)
    with pytest.raises(ValueError, match=r"seqs\[0\] starts at position 5"):
        walk(drafter, policy, [cut], [n - 4], 3)


def test_a_prompt_length_up_to_the_last_entry_is_accepted(rollout):
    policy, drafter, seq, _ = rollout
    entries = seq.tokens.shape[0]
    assert walk(drafter, policy, [seq], [entries - 1], 3) == 1.0  # one round of one token: x_S after x_{S-1}
    assert torch.isfinite(torch.tensor(walk(drafter, policy, [seq], [1], 3)))


def test_rollouts_of_one_generated_token_are_said_to_have_ended_there(rollout):
    """The engine runs no decode round for a response that ends at its first token (sampled at prefill), and neither
    does the walk; the error says that, not that the rollouts ended at their prompts."""
    policy, drafter, seq, _ = rollout
    entries = seq.tokens.shape[0]  # a prompt of `entries` tokens leaves the last one, x_S, as the only generated one
    with pytest.raises(ValueError, match="every rollout ended at its first generated token"):
        walk(drafter, policy, [seq, copy(seq)], [entries, entries], 3)
