"""`fastrl generate` end to end through Hydra composition, on a local checkpoint directory."""

from __future__ import annotations

import json

import pytest
import torch

from fastrl.cli import main
from fastrl.speculative.drafter import EagleDrafter
from fastrl.speculative.drafter_checkpoint import save_drafter


def _write(path, lines):
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))


def _read(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_generate_ids_without_tokenizer(model_dir, tmp_path, capsys):
    prompts = tmp_path / "in.jsonl"
    _write(prompts, [{"prompt_ids": [5, 6, 7]}, {"prompt_ids": [8, 9], "seed": 3}])
    out = tmp_path / "out.jsonl"
    args = [
        f"model={model_dir}",
        f"prompts={prompts}",
        f"output={out}",
        "max_new_tokens=6",
        "temperature=0.7",
        "top_p=0.9",
        "top_k=20",
        "seed=11",
        "batch_size=2",
        "progress=false",
    ]
    assert main(["generate", *args]) == 0
    rows = _read(out)
    assert len(rows) == 2
    assert rows[0]["prompt_ids"] == [5, 6, 7] and rows[0]["seed"] == 11 and rows[1]["seed"] == 3
    assert all(len(r["token_ids"]) == len(r["logprobs"]) for r in rows)
    assert rows[0]["finish_reason"] in ("stop", "length")
    assert "text" not in rows[0]
    # batch_size does not change outputs
    out1 = tmp_path / "out1.jsonl"
    others = [a for a in args if not a.startswith(("batch_size", "output"))]
    assert main(["generate", *others, "batch_size=1", f"output={out1}"]) == 0
    assert [r["token_ids"] for r in _read(out1)] == [r["token_ids"] for r in rows]


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ({"prompt_ids": []}, "empty prompt: a request needs at least one prompt token"),
        ({"prompt_ids": [1, 99999]}, "prompt token ids out of the vocabulary [0, "),
        ({"prompt_ids": [5] * 5000}, "prompt has 5000 tokens; the context length is "),
    ],
)
def test_a_prompt_the_policy_cannot_run_is_refused_before_any_work(model_dir, tmp_path, capsys, line, said):
    """Such a line ran with the others and was written as an "error" result: the same command then found every line
    done, and the fixed line was refused as another prompt (the remedies offered discarded every finished result)."""
    prompts, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write(prompts, [{"prompt_ids": [5, 6, 7]}, line])
    assert main(["generate", f"model={model_dir}", f"prompts={prompts}", f"output={out}", "progress=false"]) == 2
    assert f"fastrl generate: error: {prompts}:2: {said}" in capsys.readouterr().err
    assert not out.exists()


def test_a_text_prompt_past_the_context_gets_one_error_and_no_tokenizer_warning(tmp_path, capfd):
    """The tokenizer warned first ("Token indices sequence length is longer than the specified maximum sequence
    length ... will result in indexing errors"), then came fastrl's error: one message now, fastrl's."""
    prompts, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write(prompts, [{"prompt": "1+2="}, {"prompt": "12+34=" * 400}])
    assert main(["generate", f"prompts={prompts}", f"output={out}", "progress=false"]) == 2
    err = capfd.readouterr().err
    assert f"fastrl generate: error: {prompts}:2: prompt has " in err and "; the context length is 1024" in err
    assert "Token indices sequence length" not in err and not out.exists()


def test_generate_speculative_equals_plain(model_dir, tmp_path):
    torch.manual_seed(0)
    drafter_dir = tmp_path / "drafter"
    from fastrl.models.checkpoint import load_model

    save_drafter(EagleDrafter(load_model(model_dir).config), drafter_dir, policy_name="tiny")
    prompts = tmp_path / "in.jsonl"
    _write(prompts, [{"prompt_ids": [5 + i, 6, 7]} for i in range(5)])
    common = [f"model={model_dir}", f"prompts={prompts}", "max_new_tokens=12", "progress=false"]
    assert main(["generate", *common, f"output={tmp_path / 'plain.jsonl'}"]) == 0
    stats = tmp_path / "stats.json"
    assert (
        main(
            [
                "generate",
                *common,
                f"output={tmp_path / 'spec.jsonl'}",
                "strategy=3_2_6",
                f"drafter={drafter_dir}",
                f"stats_output={stats}",
            ]
        )
        == 0
    )
    plain, spec = _read(tmp_path / "plain.jsonl"), _read(tmp_path / "spec.jsonl")
    assert [r["token_ids"] for r in plain] == [r["token_ids"] for r in spec]
    assert all(sum(r["accept_lengths"]) == len(r["token_ids"]) - 1 for r in spec)
    summary = json.loads(stats.read_text())
    assert summary["rounds"] > 0 and summary["strategies"][0]["strategy"] == "3_2_6"


def test_generate_groups_with_history_drafts(model_dir, tmp_path):
    prompts = tmp_path / "in.jsonl"
    _write(prompts, [{"prompt_ids": [5, 6, 7]}, {"prompt_ids": [9, 8], "seed": 40}])
    common = [f"model={model_dir}", f"prompts={prompts}", "max_new_tokens=16", "n=3", "progress=false"]
    assert main(["generate", *common, f"output={tmp_path / 'plain.jsonl'}"]) == 0
    assert main(["generate", *common, "strategy=suffix_8", f"output={tmp_path / 'hist.jsonl'}"]) == 0
    plain, hist = _read(tmp_path / "plain.jsonl"), _read(tmp_path / "hist.jsonl")
    assert [r["token_ids"] for r in plain] == [r["token_ids"] for r in hist]
    assert [(r["prompt_index"], r["sample"]) for r in plain] == [(i, j) for i in range(2) for j in range(3)]
    assert [r["prompt_ids"] for r in plain] == [[5, 6, 7]] * 3 + [[9, 8]] * 3
    seeds = [r["seed"] for r in plain]
    assert len(set(seeds)) == 6 and seeds[3] == 40
    # sample 0 of each line is what n=1 gives
    assert main(["generate", *common[:-2], "progress=false", f"output={tmp_path / 'one.jsonl'}"]) == 0
    one = _read(tmp_path / "one.jsonl")
    assert [r["token_ids"] for r in one] == [plain[0]["token_ids"], plain[3]["token_ids"]]


@pytest.mark.parametrize(
    "args, message",
    [
        (["prompts=missing.jsonl", "output=o.jsonl"], "prompts file missing.jsonl is not found"),
        (["output=o.jsonl"], "prompts"),
        (["prompts=in.jsonl", "output=o.jsonl", "no_such_key=1"], "no_such_key"),
        (["prompts=in.jsonl", "output=o.jsonl", "batch_size=0"], "batch_size"),
        (["prompts=in.jsonl", "output=o.jsonl", "n=0"], "generate.n"),
        (["prompts=in.jsonl", "output=o.jsonl", "strategy=suffix_1"], "suffix_1"),
        (["prompts=in.jsonl", "output=o.jsonl", "strategy=8_4"], "8_4"),
        (["prompts=in.jsonl", "output=o.jsonl", "temperature=-1"], "temperature"),
    ],
)
def test_generate_bad_input_is_one_clear_error(model_dir, tmp_path, monkeypatch, capsys, args, message):
    monkeypatch.chdir(tmp_path)
    _write(tmp_path / "in.jsonl", [{"prompt_ids": [5, 6]}])
    assert main(["generate", f"model={model_dir}", "progress=false", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "o.jsonl").exists()


def test_malformed_prompt_line_names_the_line(model_dir, tmp_path, capsys):
    prompts = tmp_path / "in.jsonl"
    prompts.write_text('{"prompt_ids": [5]}\n{"prompt": 3}\n')
    assert main(["generate", f"model={model_dir}", f"prompts={prompts}", f"output={tmp_path / 'o.jsonl'}"]) == 2
    assert f"{prompts}:2" in capsys.readouterr().err


def test_text_prompt_without_tokenizer_is_an_error(model_dir, tmp_path, capsys):
    prompts = tmp_path / "in.jsonl"
    _write(prompts, [{"prompt": "sum 1 2 ="}])
    assert main(["generate", f"model={model_dir}", f"prompts={prompts}", f"output={tmp_path / 'o.jsonl'}"]) == 2
    assert "tokenizer" in capsys.readouterr().err


def test_generate_bandit_and_ema_write_arm_tables(model_dir, tmp_path):
    torch.manual_seed(0)
    drafter_dir = tmp_path / "drafter"
    from fastrl.models.checkpoint import load_model

    save_drafter(EagleDrafter(load_model(model_dir).config), drafter_dir, policy_name="tiny")
    prompts = tmp_path / "in.jsonl"
    _write(prompts, [{"prompt_ids": [5 + i, 6, 7]} for i in range(6)])
    common = [
        f"model={model_dir}",
        f"prompts={prompts}",
        "max_new_tokens=16",
        "progress=false",
        f"drafter={drafter_dir}",
    ]
    assert main(["generate", *common, f"output={tmp_path / 'plain.jsonl'}"]) == 0
    stats, plot = tmp_path / "bandit.json", tmp_path / "bandit.png"
    bandit_args = ["strategy=bandit", "bandit.strategies=[3_1_4,2_2_4,disable]", "bandit.epsilon=0.2"]
    assert (
        main(
            [
                "generate",
                *common,
                f"output={tmp_path / 'b.jsonl'}",
                *bandit_args,
                f"stats_output={stats}",
                f"plot_output={plot}",
            ]
        )
        == 0
    )
    summary = json.loads(stats.read_text())
    assert {a["strategy"] for a in summary["arms"]} <= {"3_1_4", "2_2_4", "disable"}
    assert sum(a["pulls"] for a in summary["arms"]) == summary["rounds"]
    assert summary["bandit"] and plot.read_bytes()[:4] == b"\x89PNG"
    assert summary["bandit_covers"].startswith("the rounds of this process")  # not the resumed run's earlier ones
    sglang = tmp_path / "adaptive.json"
    sglang.write_text(json.dumps({"candidate_steps": [1, 3], "ema_alpha": 0.3, "warmup_batches": 2}))
    assert main(["generate", *common, f"output={tmp_path / 'e.jsonl'}", "strategy=ema", f"ema_json={sglang}"]) == 0
    plain = [r["token_ids"] for r in _read(tmp_path / "plain.jsonl")]
    assert [r["token_ids"] for r in _read(tmp_path / "b.jsonl")] == plain
    assert [r["token_ids"] for r in _read(tmp_path / "e.jsonl")] == plain


@pytest.mark.parametrize(
    "args, message",
    [
        (["strategy=bandit", "bandit.strategies=[]"], "strategies"),
        (["strategy=bandit", "bandit.bs_thresholds=[1,5,2]"], "bs_thresholds"),
        (["strategy=bandit", "bandit.epsilon=1.5"], "epsilon"),
        (["strategy=ema", "ema_json=bad.json"], "nope"),
    ],
)
def test_bad_policy_config_is_one_clear_error(model_dir, tmp_path, monkeypatch, capsys, args, message):
    monkeypatch.chdir(tmp_path)
    _write(tmp_path / "in.jsonl", [{"prompt_ids": [5, 6]}])
    (tmp_path / "bad.json").write_text(json.dumps({"candidate_steps": [1, 3], "nope": 1}))
    assert main(["generate", f"model={model_dir}", "prompts=in.jsonl", "output=o.jsonl", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_chat_messages_and_chat_text_use_the_models_template(tmp_path, capsys):
    from fastrl.models.tokenizer import chat_token_ids, load_tokenizer
    from tests.helpers import save_chat_model

    chat_dir = save_chat_model(tmp_path / "chat-model")
    tokenizer = load_tokenizer(chat_dir)
    chat = [{"role": "system", "content": "Add."}, {"role": "user", "content": "3+4="}]
    prompts = tmp_path / "in.jsonl"
    _write(prompts, [{"messages": chat}, {"prompt": "5+1="}])
    out = tmp_path / "out.jsonl"
    args = [f"prompts={prompts}", f"output={out}", "max_new_tokens=4", "progress=false", "chat_template=true"]
    assert main(["generate", f"model={chat_dir}", *args]) == 0
    rows = _read(out)
    assert rows[0]["prompt_ids"] == chat_token_ids(tokenizer, chat)
    assert rows[1]["prompt_ids"] == chat_token_ids(tokenizer, [{"role": "user", "content": "5+1="}])
    assert tokenizer.decode(rows[1]["prompt_ids"]).endswith("user: 5+1=\nassistant: ")
    # The bundled model's tokenizer has no template: one error naming the line, before anything is written.
    out2 = tmp_path / "out2.jsonl"
    assert main(["generate", f"prompts={prompts}", f"output={out2}", "progress=false"]) != 0
    assert f'{prompts}:1: "messages" needs a chat template' in capsys.readouterr().err
    assert not out2.exists()


@pytest.mark.parametrize(
    "arg, key",
    [
        ("max_new_tokens=0", "max_new_tokens"),
        ("temperature=-0.5", "temperature"),
        ("temperature=nan", "temperature"),
        ("top_p=0", "top_p"),
        ("top_k=-1", "top_k"),
        ("dtype=half", "dtype"),
        ("n=0", "n"),
        ("seed=-3", "seed"),
    ],
)
@pytest.mark.parametrize("command", ["generate", "check-exact"])
def test_a_bad_decode_key_is_one_error_naming_it(tmp_path, capsys, command, arg, key):
    prompts = tmp_path / "in.jsonl"
    _write(prompts, [{"prompt_ids": [5, 6]}])
    out = tmp_path / "out.jsonl"
    extra = [f"output={out}"] if command == "generate" else [f"report={tmp_path / 'r.json'}"]
    assert main([command, f"prompts={prompts}", *extra, "progress=false", arg]) != 0
    err = capsys.readouterr().err
    assert f"{command.replace('-', '_')}.{key} " in err and err.count("error:") == 1
    assert not out.exists() and not (tmp_path / "r.json").exists()


@pytest.mark.parametrize(
    "args, words",
    [
        (["strategy=bogus"], "strategy=bogus: strategy selector 'bogus'"),
        (["strategy=100000_1_100001"], "steps <= 64, topk <= 64 and num_draft_tokens <= 1024"),
        (["strategy=suffix_100000"], "suffix_N takes N <= 1024"),
        (["strategy=ema", "ema.candidate_steps=[100000]"], "ema.candidate_steps must be ints in [0, 64]"),
        (["strategy=bandit", "bandit.seed=-1"], "bandit.seed must be an int in [0, 2**63)"),
    ],
)
@pytest.mark.parametrize("command", ["generate", "check-exact"])
def test_a_strategy_the_engine_cannot_run_is_refused_before_the_model_loads(
    tmp_path, capsys, monkeypatch, command, args, words
):
    """A strategy that does not parse, or one too large to run (a 100000-level chain was killed for memory, a
    suffix_100000 asked 80 GB), is one line naming the key, and the model is never loaded."""
    import fastrl.commands.check_exact as check_exact
    import fastrl.commands.generate as generate

    def never(*args, **kwargs):
        raise AssertionError("the model was loaded")

    for module in (generate, check_exact):  # the commands' own names (imported before the patch: nothing leaks)
        monkeypatch.setattr(module, "load_model", never)
    prompts = tmp_path / "in.jsonl"
    _write(prompts, [{"prompt_ids": [5, 6]}])
    extra = [f"output={tmp_path / 'out.jsonl'}"] if command == "generate" else []
    assert main([command, f"prompts={prompts}", *extra, "progress=false", *args]) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("error:") == 1, err


def test_per_bucket_arms_are_set_on_the_command_line(tmp_path, capsys):
    """`bandit.bucket_strategies={1:[3_1_4,disable]}` reaches the bandit (it was an OmegaConf traceback for every
    value, and unquoted strategies would have been read as integers)."""
    from fastrl.commands.generate_config import GenerateConfig
    from fastrl.config_compose import compose_config

    prompts = tmp_path / "in.jsonl"
    _write(prompts, [{"prompt_ids": [5, 6]}])
    overrides = [
        f"prompts={prompts}",
        "output=o.jsonl",
        "strategy=bandit",
        "bandit.bucket_strategies={1:[3_1_4,disable]}",
    ]
    config = compose_config("generate", GenerateConfig, overrides)
    assert config.bandit.bucket_strategies == {1: ["3_1_4", "disable"]}
    out = tmp_path / "out.jsonl"
    args = ["strategy=bandit", "bandit.bucket_strategies={1:[3_1_4]}", "max_new_tokens=4", "progress=false"]
    assert main(["generate", f"prompts={prompts}", f"output={out}", *args]) == 0
    bad = ["strategy=bandit", "bandit.bucket_strategies={3:[3_1_4]}"]
    assert main(["generate", f"prompts={prompts}", f"output={tmp_path / 'bad.jsonl'}", *bad]) == 2
    assert "bandit.bucket_strategies[3]: not a bucket threshold" in capsys.readouterr().err


def test_a_plot_of_an_unknown_format_or_a_model_that_is_a_file_is_refused_before_any_work(tmp_path, capsys):
    """plot_output's format goes by its suffix: a .json plot failed after the whole run; a model= that names a file
    said the directory did not exist."""
    prompts = tmp_path / "in.jsonl"
    _write(prompts, [{"prompt_ids": [5, 6]}])
    out = tmp_path / "out.jsonl"
    args = ["generate", f"prompts={prompts}", f"output={out}", "progress=false"]
    assert main([*args, f"plot_output={tmp_path / 'plot.json'}"]) == 2
    assert f"generate.plot_output={tmp_path / 'plot.json'}: give a file ending in one of" in capsys.readouterr().err
    assert main([*args, f"model={prompts}"]) == 2
    assert f"model={prompts} is a file; give a checkpoint directory" in capsys.readouterr().err
    assert not out.exists()


def test_a_pgf_plot_without_latex_is_refused_before_any_work(tmp_path, capsys, monkeypatch):
    """matplotlib draws .pgf through LaTeX: without it the plot failed after the whole run, as a traceback, and
    before the bandit state was saved (what the bandit learned was lost)."""
    import matplotlib

    prompts = tmp_path / "in.jsonl"
    _write(prompts, [{"prompt_ids": [5, 6]}])
    out = tmp_path / "out.jsonl"
    monkeypatch.setenv("PATH", str(tmp_path))  # no LaTeX on it
    tex = matplotlib.rcParams["pgf.texsystem"]
    args = ["generate", f"prompts={prompts}", f"output={out}", "progress=false", f"plot_output={tmp_path / 'a.pgf'}"]
    assert main(args) == 2
    assert f"a .pgf plot is drawn with {tex}, which is not installed" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize(
    ("args", "key"),
    [
        (["strategy=bandit"], "bandit.strategies: ['8_4_32']"),  # the bandit's default arms
        (["strategy=5_4_8"], "strategy: ['5_4_8']"),
    ],
)
def test_strategies_wider_than_the_draft_vocabulary_are_refused_naming_their_key(
    model_dir, tmp_path, capsys, args, key
):
    """The engine refused them without naming the key that chose them."""
    from fastrl.models.checkpoint import load_model

    drafter = EagleDrafter(load_model(model_dir).config)
    drafter.set_draft_vocab(torch.tensor([5, 6, 7]))
    save_drafter(drafter, tmp_path / "narrow", policy_name="tiny")
    prompts = tmp_path / "in.jsonl"
    _write(prompts, [{"prompt_ids": [5, 6, 7]}])
    common = [f"model={model_dir}", f"prompts={prompts}", f"drafter={tmp_path / 'narrow'}", "progress=false"]
    assert main(["generate", *common, f"output={tmp_path / 'out.jsonl'}", *args]) == 2
    err = capsys.readouterr().err
    assert f"{key} draft more candidates a step than the 3 tokens of drafter=" in err
    assert not (tmp_path / "out.jsonl").exists()
