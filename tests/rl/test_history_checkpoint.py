"""The rollout workers' history indexes in a training checkpoint (`fastrl.rl.history_checkpoint`): a resumed run
drafts from the responses of the steps before it; the files round-trip any state; a damaged file is one error naming
it, raised before anything is restored."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from fastrl.rl.history_checkpoint import read_history_states, save_history_states
from fastrl.rl.trainer import GRPOTrainer
from fastrl.speculative.history import HistoryConfig, HistoryIndex, HistoryState
from fastrl.tensor_files import save_tensors
from tests.rl.grpo_setup import digit_trainer

VOCAB = 50_000  # the vocabulary files are read against here (a resume reads them against its policy's)


def _trainer(directory: Path, steps: int, seed: int = 0) -> GRPOTrainer:
    sizes = dict(prompts_per_step=2, samples_per_prompt=3, max_new_tokens=8, checkpoint_every=2)
    return digit_trainer(directory, "3_1_4+suffix_8", seed, steps=steps, **sizes)


def test_resume_restores_the_history_the_run_had(tmp_path):
    run = _trainer(tmp_path / "run", steps=2)
    run.train()
    held = run.backend.history_state()
    saved = read_history_states(tmp_path / "run" / "step_000002" / "history", VOCAB)
    assert saved == held and held[0].num_tokens > 0 and len(held[0].groups) == 4  # two steps of two prompts
    resumed = _trainer(tmp_path / "resumed", steps=3, seed=7)
    resumed.resume(tmp_path / "run" / "step_000002")
    assert resumed.backend.history_state() == held
    resumed.train()
    assert len(resumed.backend.history_state()[0].groups) == 6  # and it goes on growing from there


def _random_state(rng: random.Random) -> HistoryState:
    return HistoryState(
        [
            (
                [rng.randrange(VOCAB) for _ in range(rng.randint(1, 9))],
                [[rng.randrange(VOCAB) for _ in range(rng.randint(0, 9))] for _ in range(rng.randint(0, 4))],
            )
            for _ in range(rng.randint(0, 5))
        ]
    )


def _index_state(rng: random.Random) -> HistoryState:
    """An index's state, with the order its siblings' texts arrived in (emitted interleaved)."""
    index = HistoryIndex(HistoryConfig(max_match=4))
    for g in range(rng.randint(1, 4)):
        prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 9))]
        for s in range(3):
            index.start((g, s), None, prompt)
        for _ in range(rng.randint(0, 5)):
            for s in range(3):
                index.extend((g, s), [rng.randrange(VOCAB) for _ in range(rng.randint(0, 3))])
        for s in range(3):
            index.finish((g, s), keep=s != 1)
    return index.state()


@pytest.mark.parametrize("seed", range(8))
def test_files_round_trip_any_state(tmp_path, seed):
    """States with arrival orders (an index's) and without (an older checkpoint's) both come back as they were."""
    rng = random.Random(seed)
    states = [_random_state(rng) if rng.random() < 0.3 else _index_state(rng) for _ in range(rng.randint(1, 3))]
    save_history_states(states, tmp_path / "history")
    assert read_history_states(tmp_path / "history", VOCAB) == states


@pytest.mark.parametrize(
    "order, counts, message",
    [
        ([0, 0, 3, 1, -1, 2], [2], None),  # the valid order of the group below
        ([0, 0, 3, 1, 0, 2], [2], "does not continue its text"),
        ([0, 0, 3], [1], "does not cover its texts"),
        ([0, 0, 3, 1, -1], [2], "order_counts name 2 triples, order holds 1.66667"),
        (None, [2], "'order' and 'order_counts' come together"),
    ],
)
def test_an_order_that_does_not_fit_its_groups_is_named(tmp_path, order, counts, message):
    (tmp_path / "history").mkdir()
    tensors = {"tokens": torch.tensor([1, 2, 3, 9, 9], dtype=torch.int64), "layout": torch.tensor([3, 1, 2])}
    tensors["order_counts"] = torch.tensor(counts, dtype=torch.int64)
    if order is not None:
        tensors["order"] = torch.tensor(order, dtype=torch.int64)
    save_tensors(tensors, tmp_path / "history" / "worker_0.safetensors")
    if message is None:
        assert read_history_states(tmp_path / "history", VOCAB)[0].orders == [[(0, 0, 3), (1, -1, 2)]]
        return
    with pytest.raises(ValueError, match=f"worker_0.safetensors: .*{message}"):
        read_history_states(tmp_path / "history", VOCAB)


def test_no_history_writes_nothing_and_reads_as_none(tmp_path):
    save_history_states([None, None], tmp_path / "history")
    assert not (tmp_path / "history").exists()
    assert read_history_states(tmp_path / "history", VOCAB) == []


def _write(directory: Path, tokens: list[int], layout: list[int], dtype=torch.int64) -> None:
    directory.mkdir(exist_ok=True)
    tensors = {"tokens": torch.tensor(tokens, dtype=dtype), "layout": torch.tensor(layout, dtype=torch.int64)}
    save_tensors(tensors, directory / "worker_0.safetensors")


@pytest.mark.parametrize(
    "tokens, layout, dtype, message",
    [
        ([1, 2, 3], [2, 1, 5], torch.int64, "layout names more tokens than the 3 stored"),
        ([1, 2, 3], [1, 1, 1], torch.int64, "layout covers 2 of the 3 tokens stored"),
        ([1, 2, 3], [3, 2, 0], torch.int64, r"layout is cut short \(the group at entry 0 runs past its end\)"),
        ([1, 2, 3], [0, 0], torch.int64, "the group at layout entry 0 has an empty prompt"),
        ([1, -2, 3], [3, 0], torch.int64, r"token ids must lie in \[0, 50000\).*found \[-2\]"),
        ([1, 2, 50_000, 7], [4, 0], torch.int64, r"token ids must lie in \[0, 50000\).*found \[50000\]"),
        ([1, 2, 3], [3, 1, -1], torch.int64, "lengths must be >= 0"),
        ([1, 2, 3], [3, 0], torch.float32, "tokens must be a 1-D int64 tensor"),
        # one prompt group twice: the index refused it halfway through a resume, naming no file
        (
            [1, 2, 7, 1, 2, 8],
            [2, 1, 1, 2, 1, 1],
            torch.int64,
            "history state: group 1 holds the prompt of group 0 again",
        ),
    ],
)
def test_an_inconsistent_file_is_named(tmp_path, tokens, layout, dtype, message):
    _write(tmp_path / "history", tokens, layout, dtype)
    with pytest.raises(ValueError, match=f"worker_0.safetensors: {message}"):
        read_history_states(tmp_path / "history", VOCAB)


def test_a_damaged_checkpoint_restores_nothing(tmp_path):
    run = _trainer(tmp_path / "run", steps=2)
    run.train()
    file = tmp_path / "run" / "step_000002" / "history" / "worker_0.safetensors"
    file.write_bytes(file.read_bytes()[:40])
    other = _trainer(tmp_path / "other", steps=3, seed=7)
    before = {k: v.clone() for k, v in other.policy.state_dict().items()}
    with pytest.raises(ValueError, match="worker_0.safetensors is not a readable safetensors file"):
        other.resume(tmp_path / "run" / "step_000002")
    assert other.step == 0 and other.backend.history_state()[0].groups == []
    assert all(torch.equal(v, other.policy.state_dict()[k]) for k, v in before.items())
    missing = tmp_path / "run" / "step_000002" / "history" / "worker_1.safetensors"
    file.rename(missing)
    with pytest.raises(ValueError, match="worker_0.safetensors is missing"):
        other.resume(tmp_path / "run" / "step_000002")


def test_a_history_token_outside_the_policy_vocabulary_is_refused_at_resume(tmp_path):
    run = _trainer(tmp_path / "run", steps=2)
    run.train()
    vocab = run.policy.config.vocab_size
    history = tmp_path / "run" / "step_000002" / "history"
    _write(history, [5, 6, vocab + 3], [2, 1, 1])
    other = _trainer(tmp_path / "other", steps=3, seed=7)
    message = rf"worker_0.safetensors: token ids must lie in \[0, {vocab}\).*\[{vocab + 3}\]"
    with pytest.raises(ValueError, match=message):
        other.resume(tmp_path / "run" / "step_000002")
    assert other.step == 0 and other.backend.history_state()[0].groups == []


def _interrupted_after_a_rollout(tmp_path: Path, strategy: str, state) -> tuple[object, object, object, object]:
    """A 3-step run, and the same run cut after step 2's rollout, before its update (Ctrl-C), checkpointed and resumed
    to the end: ``state(trainer)`` of the uninterrupted run at its end, of the cut run at the step boundary and after
    the rollout, and of the resumed run at its end."""

    def trainer(directory: Path, steps: int, seed: int = 0) -> GRPOTrainer:
        sizes = dict(prompts_per_step=2, samples_per_prompt=3, max_new_tokens=8, checkpoint_every=2)
        return digit_trainer(directory, strategy, seed, steps=steps, **sizes)

    whole = trainer(tmp_path / "whole", steps=3)
    whole.train()
    cut = trainer(tmp_path / "cut", steps=3)
    cut.config.steps = 2
    cut.train()
    boundary = state(cut)
    cut.rollout(cut.step)  # step 2's rollout; the interrupt comes before its update
    after_rollout = state(cut)
    resumed = trainer(tmp_path / "resumed", steps=3, seed=7)
    resumed.resume(cut.save_checkpoint(tmp_path / "cut" / "step_000002"))
    resumed.train()
    return state(whole), boundary, after_rollout, state(resumed)


def test_a_checkpoint_taken_after_a_rollout_before_its_update_holds_the_last_step_boundary(tmp_path):
    """Ctrl-C after a step's rollout finished, before its update: the checkpoint is of the step before, and so is its
    history index (it held that rollout's responses, which the resumed run, repeating the rollout, then kept twice)."""
    whole, boundary, after, resumed = _interrupted_after_a_rollout(
        tmp_path, "3_1_4+suffix_8", lambda t: t.backend.history_state()
    )
    assert after == boundary and resumed == whole
    assert read_history_states(tmp_path / "cut" / "step_000002" / "history", VOCAB) == boundary


def _selector_state(trainer: GRPOTrainer) -> dict:
    return trainer.backend.selector_state()


def test_the_selector_in_a_checkpoint_is_the_one_the_last_step_boundary_left(tmp_path):
    """As the history index: a checkpoint taken after a step's rollout, before its update, holds the EMA controller as
    the step before left it (it held the rollout's rounds, which the resumed run, repeating the rollout, then counted
    twice); the resumed run ends on the uninterrupted run's controller."""
    whole, boundary, after, resumed = _interrupted_after_a_rollout(tmp_path, "ema", _selector_state)
    assert after == boundary and resumed == whole
