"""`fastrl train-drafter prompts=FILE`: prompts from a file (chat-templated for chat tokenizers), one rollout pass
per temperature, a held-out split, and a drafter checkpoint at the end (bundled model, tiny settings)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from fastrl.assets_path import bundled_model_dir
from fastrl.commands.prompt_tokens import PromptLimits
from fastrl.commands.train_drafter_config import TrainDrafterConfig
from fastrl.commands.train_drafter_prompts import file_prompt_ids, split_prompts
from fastrl.models.tokenizer import chat_token_ids, load_tokenizer
from tests.helpers import chat_tokenizer


def write_prompts(path, lines):
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return str(path)


def test_text_goes_through_the_chat_template_and_ids_pass_unchanged(tmp_path):
    tokenizer = chat_tokenizer()
    path = write_prompts(tmp_path / "p.jsonl", [{"prompt": "ab"}, {"prompt_ids": [7, 8]}])
    as_user = chat_token_ids(tokenizer, [{"role": "user", "content": "ab"}])
    assert file_prompt_ids(path, tokenizer, chat_template=True) == [as_user, [7, 8]]
    assert file_prompt_ids(path, tokenizer, chat_template=False) == [tokenizer("ab")["input_ids"], [7, 8]]
    # Without a template in the tokenizer, chat_template=true falls back to the text as is.
    plain = load_tokenizer(bundled_model_dir())
    assert file_prompt_ids(path, plain, chat_template=True) == [plain("ab")["input_ids"], [7, 8]]


def test_a_prompt_that_fills_the_context_is_an_error_naming_its_line(tmp_path):
    """Before, the engine refused the request and train-drafter trained on the bare prompt, past the policy's
    positions; now the run stops before any rollout, naming the line."""
    path = write_prompts(tmp_path / "p.jsonl", [{"prompt_ids": [5] * 9}, {"prompt_ids": [5] * 10}])
    assert file_prompt_ids(path, None, chat_template=False, limits=PromptLimits(context=11)) == [[5] * 9, [5] * 10]
    with pytest.raises(ValueError, match=r"p.jsonl:2: prompt has 10 tokens; the context length is 10, leaving no room"):
        file_prompt_ids(path, None, chat_template=False, limits=PromptLimits(context=10))


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ([1, 2, 91], r"p.jsonl:2: prompt token ids out of the vocabulary \[0, 91\): \[91\]"),
        ([1, 5000, 3, 9999], r"p.jsonl:2: prompt token ids out of the vocabulary \[0, 91\): \[5000, 9999\]"),
        ([], r"p.jsonl:2: empty prompt"),
    ],
)
def test_a_prompt_the_policy_cannot_run_is_an_error_naming_its_line(tmp_path, bad, message):
    """ids past the vocabulary crashed inside the rollout's features and left the row in the shard; an empty
    prompt crashed too. Both now stop the run before any rollout."""
    path = write_prompts(tmp_path / "p.jsonl", [{"prompt_ids": [1, 2]}, {"prompt_ids": bad}, {"prompt_ids": [3]}])
    with pytest.raises(ValueError, match=message):
        file_prompt_ids(path, None, chat_template=False, limits=PromptLimits(context=64, vocab_size=91))


def test_split_holds_out_eval_prompts_and_names_the_key():
    prompts = [[i] for i in range(10)]
    cfg = TrainDrafterConfig(prompts="p.jsonl", eval_prompts=3, num_prompts=5)
    train, held = split_prompts(prompts, cfg)
    assert len(held) == 3 and len(train) == 5 and not {t[0] for t in train} & {h[0] for h in held}
    with pytest.raises(ValueError, match="eval_prompts=10"):
        split_prompts(prompts, TrainDrafterConfig(prompts="p.jsonl", eval_prompts=10))


@pytest.mark.parametrize("seed", range(8))
def test_no_held_out_prompt_is_a_training_prompt(seed):
    """A prompts file's repeated lines, or a task problem drawn for both sets, put one prompt on both sides: the
    held-out measure then read a prompt the drafter trained on. The held-out side keeps the others, each once."""
    import random

    from fastrl.commands.train_drafter_prompts import training_prompts

    rng = random.Random(seed)
    prompts = [[rng.randrange(25)] for _ in range(30)]  # repeats among them
    cfg = TrainDrafterConfig(prompts="p.jsonl", eval_prompts=10, num_prompts=8, seed=seed)
    train, held = split_prompts(prompts, cfg)
    assert held and not {tuple(h) for h in held} & {tuple(t) for t in train} and len(set(map(tuple, held))) == len(held)
    with pytest.raises(ValueError, match="every held-out prompt of p.jsonl's prompts is also a training prompt"):
        split_prompts([[7]] * 12, TrainDrafterConfig(prompts="p.jsonl", eval_prompts=4, seed=seed))
    tokenizer = load_tokenizer(bundled_model_dir())
    train, held = training_prompts(tokenizer, TrainDrafterConfig(num_prompts=1024, eval_prompts=64, seed=seed))
    assert not {tuple(h) for h in held} & {tuple(t) for t in train} and len(train) == 1024


def test_negative_rollout_temperature_is_rejected():
    with pytest.raises(ValueError, match="rollout_temperatures"):
        TrainDrafterConfig(rollout_temperatures=[0.0, -1.0])


def test_train_drafter_on_a_prompts_file_writes_a_drafter(tmp_path):
    from fastrl.commands.train_drafter import run_train_drafter
    from fastrl.speculative.drafter_checkpoint import read_drafter_info

    path = write_prompts(tmp_path / "p.jsonl", [{"prompt": f"{a}+{a + 1}="} for a in range(6)])
    cfg = small_run(tmp_path, path, max_new_tokens=8, rollout_temperatures=[0.0, 1.0], draft_vocab_size=16)
    report = run_train_drafter(cfg)
    assert report.train_sequences == 8  # 4 training prompts x 2 temperatures
    assert [a.strategy for a in report.accept_lengths] == ["3_1_4", "3_1_4"]
    info = read_drafter_info(tmp_path / "drafter")
    assert info.version == 1 and info.draft_vocab_size == 16
    assert json.loads((tmp_path / "drafter" / "metrics.json").read_text())["config"]["prompts"] == path
    # the same file name, other prompts: the stream's shards were generated from the old ones, so no resume
    write_prompts(tmp_path / "p.jsonl", [{"prompt": f"{a}*{a + 2}="} for a in range(6)])
    with pytest.raises(ValueError, match=r"holds a run with other settings \(prompt_ids_sha256\)"):
        run_train_drafter(dataclasses.replace(cfg, overwrite=True))
    # overwritten by a drafter over the whole vocabulary: the earlier draft vocabulary goes (it was left behind)
    full = dataclasses.replace(cfg, overwrite=True, draft_vocab_size=0, stream_dir=str(tmp_path / "s2"))
    run_train_drafter(full)
    assert read_drafter_info(tmp_path / "drafter").draft_vocab_size is None
    assert not (tmp_path / "drafter" / "draft_vocab.safetensors").exists()


@pytest.mark.parametrize("key", ["samples_per_prompt", "shard_requests", "accept_batch_size"])
def test_counts_below_one_name_the_key(key):
    with pytest.raises(ValueError, match=f"train_drafter.{key} must be >= 1"):
        TrainDrafterConfig(**{key: 0})


def test_stream_dir_defaults_beside_the_output():
    assert TrainDrafterConfig(output="runs/d/").stream_path == "runs/d.stream"
    assert TrainDrafterConfig(output="runs/d", stream_dir="s").stream_path == "s"


@pytest.mark.parametrize("seed", [-1, 2**40, 10**14])
def test_a_seed_outside_its_range_names_the_key_before_any_rollout(seed):
    with pytest.raises(ValueError, match=r"train_drafter.seed must be an integer in \[0, 2\*\*40\)"):
        TrainDrafterConfig(seed=seed)


def test_a_prompts_path_that_is_not_a_file_is_named(tmp_path, capsys):
    from fastrl.cli import main

    for prompts, said in ((tmp_path, "is a directory"), (tmp_path / "none.jsonl", "is not found")):
        assert main(["train-drafter", f"output={tmp_path / 'out'}", f"prompts={prompts}"]) == 2
        assert f"train_drafter.prompts={prompts} {said}; give a JSONL file" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_train_drafter_checks_its_prompts_before_the_policy_loads(tmp_path, monkeypatch):
    """The prompts were checked against the loaded policy's sizes: a bad line cost the whole model load first."""
    import fastrl.commands.train_drafter as train_drafter

    monkeypatch.setattr(train_drafter, "load_model", lambda *a, **k: pytest.fail("the policy loaded first"))
    path = write_prompts(tmp_path / "p.jsonl", [{"prompt_ids": [1, 2]}, {"prompt_ids": [91]}, {"prompt_ids": [3]}])
    cfg = TrainDrafterConfig(prompts=path, eval_prompts=1, output=str(tmp_path / "drafter"))
    with pytest.raises(ValueError, match=r"p.jsonl:2: prompt token ids out of the vocabulary \[0, 91\)"):
        train_drafter.run_train_drafter(cfg)
    assert not (tmp_path / "drafter").exists()


def test_accept_lengths_at_t0_are_measured_once_when_the_run_is_greedy(tmp_path):
    """The held-out accept lengths are measured at T=0 and at the run's temperature: once when that is 0 too."""
    from fastrl.commands.train_drafter import run_train_drafter

    path = write_prompts(tmp_path / "p.jsonl", [{"prompt": f"{a}+{a + 1}="} for a in range(5)])
    cfg = small_run(tmp_path, path, temperature=0.0, rollout_temperatures=[0.0], accept_strategies=["3_1_4", "2_1_3"])
    report = run_train_drafter(cfg)
    assert [(a.strategy, a.temperature) for a in report.accept_lengths] == [("3_1_4", 0.0), ("2_1_3", 0.0)]


def small_run(tmp_path, prompts: str, **settings) -> TrainDrafterConfig:
    """A train-drafter run of a few seconds on ``prompts`` (2 held out), into ``tmp_path/drafter``."""
    defaults = dict(eval_prompts=2, max_new_tokens=6, epochs=1, accept_strategies=["3_1_4"], accept_requests=2)
    return TrainDrafterConfig(
        prompts=prompts, gen_batch_size=4, output=str(tmp_path / "drafter"), **{**defaults, **settings}
    )
