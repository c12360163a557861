"""Streamed drafter training: the rollout plan's order and seeds, shards kept on disk, and a run interrupted and
resumed ending with exactly the weights of an uninterrupted one; a resume with other settings is refused."""

from __future__ import annotations

import copy
import dataclasses
import json
import re

import pytest
import torch
from safetensors.torch import load_file

from fastrl.cotrain.drafter_trainer import DrafterTrainer, DrafterTrainerConfig
from fastrl.cotrain.features import policy_features
from fastrl.cotrain.rollout_plan import RolloutPlan, RolloutShards
from fastrl.cotrain.stream_trainer import StreamRun
from fastrl.models.checkpoint import load_model
from fastrl.speculative.drafter import EagleDrafter
from tests.helpers import make_hf_model


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    path = tmp_path_factory.mktemp("policy")
    make_hf_model("llama").save_pretrained(path)
    return load_model(path)


def plan() -> RolloutPlan:
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
    return RolloutPlan(prompts, [0.5, 1.0], samples=2, max_new_tokens=6, seed=3)


def test_plan_orders_samples_within_temperature_passes():
    p = plan()
    assert len(p) == 12
    requests = [p.request(r) for r in range(len(p))]
    assert [r.prompt_ids for r in requests[:6]] == [[5, 6, 7]] * 2 + [[8, 9]] * 2 + [[10, 11, 12, 13]] * 2
    assert [r.params.temperature for r in requests] == [0.5] * 6 + [1.0] * 6
    assert len({r.params.seed for r in requests}) == 12
    greedy = RolloutPlan(p.prompts, [0.0, 1.0], samples=2, max_new_tokens=6, seed=3)  # one greedy sample a prompt
    assert [(r.prompt_ids, r.params.temperature) for r in map(greedy.request, range(3))] == [
        (prompt, 0.0) for prompt in p.prompts
    ]
    assert len(greedy) == 9


class Counter:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> float:
        self.calls += 1
        return float(self.calls)


def make_run(policy, directory, drafter: EagleDrafter, held) -> StreamRun:
    trainer = DrafterTrainer(copy.deepcopy(drafter), policy, DrafterTrainerConfig(ttt_steps=2, warmup_steps=1))
    shards = RolloutShards(plan(), shard_size=5, directory=directory)
    return StreamRun(policy, trainer, shards, held, Counter(), 2, 0, 4, "cpu", "test")


def test_resumed_run_equals_uninterrupted_run(policy, tmp_path):
    torch.manual_seed(0)
    drafter = EagleDrafter(policy.config)
    held = policy_features(policy, [[5, 6, 7, 20, 21, 22, 23]])
    whole = make_run(policy, tmp_path / "whole", drafter, held)
    end = whole.run({"k": 1})
    assert (end.epoch, end.shard, len(end.epochs)) == (2, 0, 2) and whole.accept_length.calls == 2
    assert sorted(p.name for p in (tmp_path / "whole").glob("shard_*.json")) == [
        f"shard_0000{i}.json" for i in range(3)
    ]

    first = make_run(policy, tmp_path / "split", drafter, held)
    middle = first.run({"k": 1}, stop_after_shards=4)
    assert (middle.epoch, middle.shard, len(middle.epochs)) == (1, 1, 1)
    shard0 = (tmp_path / "split" / "shard_00000.json").read_text()
    second = make_run(policy, tmp_path / "split", drafter, held)  # a restart: fresh objects, the same directory
    resumed = second.run({"k": 1})
    assert (tmp_path / "split" / "shard_00000.json").read_text() == shard0
    assert resumed.steps == end.steps and resumed.tokens == end.tokens and resumed.total_steps == end.total_steps
    a, b = whole.trainer.drafter.state_dict(), second.trainer.drafter.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert [e.metrics.loss for e in resumed.epochs] == [e.metrics.loss for e in end.epochs]

    with pytest.raises(ValueError, match="other settings \\(k\\)"):
        make_run(policy, tmp_path / "split", drafter, held).run({"k": 2})


def _interrupted(policy, directory, drafter, held, monkeypatch, saves: int) -> None:
    """A run killed inside its ``saves``-th save, after the new drafter is written and before the rest."""
    import fastrl.cotrain.stream_trainer as stream_trainer

    real, count = torch.save, {"n": 0}

    def save(*args, **kwargs):
        count["n"] += 1
        if count["n"] == saves:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(stream_trainer.torch, "save", save)
    with pytest.raises(KeyboardInterrupt):
        make_run(policy, directory, drafter, held).run({"k": 1})
    monkeypatch.setattr(stream_trainer.torch, "save", real)


def test_a_run_killed_while_saving_resumes_from_the_last_whole_save(policy, tmp_path, monkeypatch):
    """The drafter, optimizer and state of a save are swapped into place together: a run killed after writing the
    new drafter but not the rest resumes from the previous shard and ends with an uninterrupted run's weights (it
    trained a shard twice on a mismatched optimizer and said nothing when they were written in place)."""
    torch.manual_seed(0)
    drafter = EagleDrafter(policy.config)
    held = policy_features(policy, [[5, 6, 7, 20, 21, 22, 23]])
    whole = make_run(policy, tmp_path / "whole", drafter, held)
    end = whole.run({"k": 1})
    _interrupted(policy, tmp_path / "split", drafter, held, monkeypatch, saves=3)
    assert sorted(p.name for p in (tmp_path / "split").iterdir() if p.name.startswith("resume")) == [
        "resume",
        "resume.tmp",
    ]
    resumed_run = make_run(policy, tmp_path / "split", drafter, held)
    resumed = resumed_run.run({"k": 1})
    a, b = whole.trainer.drafter.state_dict(), resumed_run.trainer.drafter.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a) and resumed.steps == end.steps


def _edit_state(directory, **values) -> None:
    """Set values of a saved stream state (a state this code would never write)."""
    path = directory / "resume" / "state.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **values}))


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda d: (d / "resume" / "state.json").write_text("{garb"), r"resume/state.json: not a train-drafter"),
        (lambda d: (d / "resume" / "state.json").write_text("[]"), r"resume/state.json: not a train-drafter"),
        (lambda d: (d / "resume" / "state.json").write_text("{}"), r"resume/state.json: not a train-drafter"),
        (lambda d: (d / "resume" / "optimizer.pt").write_bytes(b"\0" * 10), r"saved optimizer is unreadable"),
        (lambda d: (d / "resume" / "optimizer.pt").unlink(), r"saved optimizer is unreadable"),
        (lambda d: _edit_state(d, shard=99), r"resume/state.json: not a state of this stream \(shard 99 of 3"),
        (lambda d: _edit_state(d, epoch=1), r"state.json: not a state of this stream .*0 epoch reports at epoch 1"),
        (lambda d: (d / "shard_00001.json").write_text("{}"), r"shard_00001.json: not shard 1 of this run"),
        (lambda d: (d / "shard_00001.json").write_text("[[5000]]"), r"shard_00001.json: not shard 1 of this run"),
        (lambda d: (d / "shard_00001.json").write_text("[[]]"), r"shard_00001.json: not shard 1 of this run"),
    ],
)
def test_a_damaged_stream_is_one_error_naming_the_file_and_the_way_out(policy, tmp_path, damage, message):
    torch.manual_seed(0)
    drafter = EagleDrafter(policy.config)
    held = policy_features(policy, [[5, 6, 7, 20, 21, 22, 23]])
    make_run(policy, tmp_path / "s", drafter, held).run({"k": 1}, stop_after_shards=1)
    make_run(policy, tmp_path / "s", drafter, held).run({"k": 1}, stop_after_shards=1)  # shard 1 on disk
    (tmp_path / "s" / "resume" / "state.json").write_text(
        (tmp_path / "s" / "resume" / "state.json").read_text().replace('"shard": 2', '"shard": 1')
    )
    damage(tmp_path / "s")
    with pytest.raises(ValueError, match=message) as err:
        make_run(policy, tmp_path / "s", drafter, held).run({"k": 1})
    assert "delete" in str(err.value)


def test_a_stream_saved_before_the_swap_resumes(policy, tmp_path):
    """Streams saved with the files at the top of the directory (before ``resume/``) resume from them."""
    torch.manual_seed(0)
    drafter = EagleDrafter(policy.config)
    held = policy_features(policy, [[5, 6, 7, 20, 21, 22, 23]])
    end = make_run(policy, tmp_path / "whole", drafter, held).run({"k": 1})
    make_run(policy, tmp_path / "old", drafter, held).run({"k": 1}, stop_after_shards=2)
    for item in (tmp_path / "old" / "resume").iterdir():
        item.rename(tmp_path / "old" / item.name)
    (tmp_path / "old" / "resume").rmdir()
    resumed = make_run(policy, tmp_path / "old", drafter, held).run({"k": 1})
    assert resumed.steps == end.steps and not (tmp_path / "old" / "state.json").exists()


def test_a_batch_with_nothing_to_learn_takes_no_step(policy):
    """Two-token sequences (a prompt of one token and a response of one) give the loss no position: the trainer
    takes no step and counts nothing (it was a backward through a loss without a graph: a traceback)."""
    torch.manual_seed(0)
    drafter = EagleDrafter(policy.config)
    trainer = DrafterTrainer(drafter, policy, DrafterTrainerConfig(ttt_steps=2, warmup_steps=0))
    before = {k: v.clone() for k, v in drafter.state_dict().items()}
    metrics = trainer.train_step(policy_features(policy, [[5, 6], [7, 8]]))
    assert metrics.tokens == 0 and trainer.step_count == 0
    assert all(torch.equal(before[k], v) for k, v in drafter.state_dict().items())
    assert trainer.train_step(policy_features(policy, [[5, 6, 7, 8]])).tokens > 0 and trainer.step_count == 1


def test_a_diverged_run_is_one_error_and_keeps_the_last_whole_save(policy, tmp_path):
    """A learning rate that blows the drafter up (its loss NaN, or its weights after an update) stops the run with an
    error saying where; the shard it diverged in is not saved, so the save before it stays whole and finite."""
    torch.manual_seed(0)
    drafter = EagleDrafter(policy.config)
    held = policy_features(policy, [[5, 6, 7, 20, 21, 22, 23]])
    make_run(policy, tmp_path / "s", drafter, held).run({"k": 1}, stop_after_shards=1)
    run = make_run(policy, tmp_path / "s", drafter, held)
    run.trainer.config = dataclasses.replace(run.trainer.config, lr=1e12, warmup_steps=0)
    with pytest.raises(ValueError, match=r"train-drafter diverged at epoch 1, shard (\d) of 3 \(.*non-finite") as err:
        run.run({"k": 1})
    assert "lower drafter_trainer.lr" in str(err.value)
    diverged = int(re.search(r"shard (\d) of 3", str(err.value)).group(1))
    state = json.loads((tmp_path / "s" / "resume" / "state.json").read_text())
    assert state["shard"] == diverged - 1  # the shards before it were saved, the one it diverged in was not
    weights = load_file(str(tmp_path / "s" / "resume" / "drafter" / "drafter.safetensors"))
    assert all(bool(torch.isfinite(w).all()) for w in weights.values())


def test_an_accept_length_without_a_decode_round_says_so():
    from fastrl.cotrain.accept_eval import accept_text

    assert accept_text(0.0) == "not measured (no decode round)" and accept_text(1.0) == "1.00"


def test_what_a_stream_leaves_is_its_own_and_anything_else_is_refused(tmp_path):
    """A stream's own leftovers pass (a shard's temporary file after a kill, shard numbers past 99999, a cleanup of
    the layout before the swap cut short after state.json); so does the command's output inside it; anything else
    is named."""
    from fastrl.cotrain.stream_trainer import check_stream_dir

    stream = tmp_path / "s"
    (stream / "resume").mkdir(parents=True)
    for name in ("shard_00003.tmp", "shard_00004.json", "shard_123456.json", ".lock", "fingerprint.json"):
        (stream / name).write_text("")
    (stream / "out").mkdir()
    check_stream_dir("k", stream, beside=(stream / "out",))
    (stream / "state.json").write_text("{}")  # the layout before the swap: its files are the stream's
    (stream / "drafter").mkdir()
    (stream / "optimizer.pt").write_text("")
    check_stream_dir("k", stream, beside=(stream / "out",))
    (stream / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match=r"k=.* holds what a train-drafter stream does not write \(notes.txt, out\)"):
        check_stream_dir("k", stream)


def test_a_stream_saved_before_its_prompts_were_fingerprinted_resumes(policy, tmp_path):
    torch.manual_seed(0)
    drafter = EagleDrafter(policy.config)
    held = policy_features(policy, [[5, 6, 7, 20, 21, 22, 23]])
    make_run(policy, tmp_path / "s", drafter, held).run({"k": 1}, stop_after_shards=1)  # no digest then
    resumed = make_run(policy, tmp_path / "s", drafter, held).run({"k": 1, "prompt_ids_sha256": "abc"})
    assert resumed.epoch == 2
    with pytest.raises(ValueError, match=r"other settings \(prompt_ids_sha256\): prompt_ids_sha256=abc… \(now other…"):
        make_run(policy, tmp_path / "s", drafter, held).run({"k": 1, "prompt_ids_sha256": "other"})


def test_the_draft_vocabulary_is_built_from_what_the_policy_generated(policy, tmp_path):
    """It counted the prompts' tokens too, once per sample: a prompt-only token (the BOS, a chat template's) took a
    place that a token the policy emits should have had. With a vocabulary of as many tokens as the responses
    hold, every one of its tokens is a response's."""
    torch.manual_seed(0)
    drafter = EagleDrafter(policy.config)
    shards = RolloutShards(plan(), shard_size=5, directory=tmp_path / "first")  # the run's first shard, beside it
    ids = shards.ids(0, policy, 4, "cpu")
    responses = shards.responses(0, ids)
    assert all(
        row[: len(row) - len(r)] == plan().request(i).prompt_ids
        for i, (row, r) in enumerate(zip(ids, responses, strict=True))
    )
    generated = {t for r in responses for t in r}
    size = len(generated)
    trainer = DrafterTrainer(copy.deepcopy(drafter), policy, DrafterTrainerConfig(ttt_steps=2, warmup_steps=1))
    run = StreamRun(policy, trainer, RolloutShards(plan(), 5, tmp_path / "s"), [], Counter(), 1, size, 4, "cpu", "t")
    run.run({"k": 1}, stop_after_shards=1)
    assert set(trainer.drafter.draft_vocab.tolist()) == generated
