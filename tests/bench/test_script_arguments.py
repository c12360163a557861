"""The standalone benchmark scripts refuse a bad argument with argparse's one-line usage error naming the flag
(before any model loads), and answer --help."""

from __future__ import annotations

import json
import runpy
from pathlib import Path

import pytest

from fastrl.adaptive import sim
from fastrl.bench import (
    attention,
    attention_lengths,
    eager_ops,
    host_time,
    kv_memory,
    long_tail,
    plain_overhead,
    selector_cost,
    small_linear,
)

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "fastrl/assets/arith-tiny"


def _selector_random(argv: list[str]) -> None:
    runpy.run_path(str(ROOT / "recipes/selector_random/run.py"))["main"](argv)


@pytest.mark.parametrize(
    ("main", "argv", "said"),
    [
        (long_tail.main, ["--requests", "0"], "argument --requests: must be >= 1, got 0"),
        (long_tail.main, ["--group", "x"], "argument --group: 'x' is not an integer"),
        (long_tail.main, ["--temperature", "-1"], "--temperature must be a finite number >= 0"),
        (long_tail.main, ["--arms", "3_1_4,nope"], "--arms: strategy 'nope'"),
        (long_tail.main, ["--selectors", "bandit:epsilon=x"], "--selectors: selector 'bandit:epsilon=x'"),
        (long_tail.main, ["--device", "gpu"], "--device='gpu' is not a torch device"),
        (long_tail.main, ["--arms", "3_1_4,3_1_4"], "argument --arms: strategy space ['3_1_4', '3_1_4']: duplicate"),
        (long_tail.main, ["--arms", ","], "argument --arms: strategy ''"),
        (long_tail.main, ["--temperature", "1e-9"], "--temperature must be 0 (greedy) or at least 1e-06, got 1e-09"),
        (long_tail.main, ["--temperature", "nan"], "--temperature must be a finite number >= 0, got nan"),
        (long_tail.main, ["--selectors", "3_1_4,3_1_4"], "--selectors names '3_1_4' twice"),
        (long_tail.main, ["--model", "/nonexistent"], "--model=/nonexistent: checkpoint directory /nonexistent"),
        (long_tail.main, ["--drafter", "/nonexistent"], "--drafter=/nonexistent: drafter directory /nonexistent does"),
        (long_tail.main, ["--drafter", str(TINY)], "is not a drafter checkpoint: drafter_config.json is missing"),
        (long_tail.main, ["--batch-size", "10000000000", "--requests", "2"], "--batch-size=10000000000 needs a"),
        (long_tail.main, ["--requests", "10000000000"], "--requests=10000000000 needs a"),
        (plain_overhead.main, ["--rounds", "5"], "argument --rounds: must be >= 11, got 5"),
        (plain_overhead.main, ["--batch-size", ","], "argument --batch-size: integers separated by commas, got ','"),
        (plain_overhead.main, ["--batch-size", "abc"], "argument --batch-size: integers separated by commas"),
        (plain_overhead.main, ["--batch-size", "0"], "argument --batch-size: each must be >= 1, got '0'"),
        (plain_overhead.main, ["--batch-size", "1,0"], "argument --batch-size: each must be >= 1, got '1,0'"),
        (plain_overhead.main, ["--batch-size", "10000000000"], "--batch-size=10000000000 needs a"),
        (plain_overhead.main, ["--rounds", "977"], "argument --rounds: 977 rounds pass the bundled model's 1024"),
        (plain_overhead.main, ["--arm", "suffix_8"], "argument --arm: suffix_8: the arm must use the drafter"),
        (plain_overhead.main, ["--arm", "3_1_x"], "argument --arm: "),
        (selector_cost.main, ["--repeats", "0"], "argument --repeats: must be >= 1, got 0"),
        (selector_cost.main, ["--arms", "bogus"], "argument --arms: strategy 'bogus'"),
        (selector_cost.main, ["--batch-size", "10000000000"], "--batch-size=10000000000 needs a"),
        (selector_cost.main, ["--requests", "10000000000"], "--requests=10000000000 needs a"),
        (selector_cost.main, ["--arms", ","], "argument --arms: strategy ''"),
        (
            selector_cost.main,
            ["--arms", "3_1_4,3_1_4"],
            "argument --arms: strategy space ['3_1_4', '3_1_4']: duplicate",
        ),
        (small_linear.main, ["--decode", "X", "--batch-sizes", ","], "argument --batch-sizes: integers separated by"),
        (
            small_linear.main,
            ["--decode", "X", "--batch-sizes", "0"],
            "argument --batch-sizes: each must be >= 1, got '0'",
        ),
        (small_linear.main, ["--decode", "/nonexistent"], "--decode=/nonexistent: checkpoint directory"),
        (small_linear.main, ["--decode", str(ROOT / "README.md")], "README.md is a file; give a checkpoint directory"),
        (
            small_linear.main,
            ["--decode", str(TINY), "--new-tokens", "1001"],
            "argument --new-tokens: 1001 after 24-token",
        ),
        (small_linear.main, ["--decode", str(TINY), "--batch-sizes", "10000000000"], "--batch-sizes=10000000000 needs"),
        (small_linear.main, ["--batch-sizes", "1"], "argument --batch-sizes: only --decode uses it"),
        (
            small_linear.main,
            ["--decode", str(TINY), "--blocks", "3"],
            "argument --blocks: only the product table uses it",
        ),
        (attention_lengths.main, ["--batch", "4"], "unrecognized arguments: --batch 4"),
        (eager_ops.main, ["bogus"], "strategy 'bogus'"),
        (eager_ops.main, ["disable", "0"], "argument BATCHES: each must be >= 1, got '0'"),
        (eager_ops.main, ["disable", "-1"], "argument BATCHES: each must be >= 1, got '-1'"),
        (eager_ops.main, ["disable", "1,,2"], "argument BATCHES: integers separated by commas, got '1,,2'"),
        (eager_ops.main, ["disable", "999999999"], "argument BATCHES: batch=999999999 needs a"),
        (eager_ops.main, ["3_1_4,3_1_4"], "argument STRATEGIES: strategy space ['3_1_4', '3_1_4']: duplicate"),
        (eager_ops.main, ["disable", "1", "x"], "unrecognized arguments: x"),
        (kv_memory.main, [str(TINY), "0", "1", "0"], "argument MAX_NEW_TOKENS: must be >= 1, got 0"),
        (kv_memory.main, [str(TINY), "4", "0", "0"], "argument COUNT: must be >= 1, got 0"),
        (kv_memory.main, [str(TINY), "4", "1", "-1"], "argument SEED: must be >= 0, got -1"),
        (kv_memory.main, ["/nonexistent", "4", "1", "0"], "MODEL_DIR=/nonexistent: checkpoint directory"),
        (kv_memory.main, [str(TINY), "1024", "1", "0"], "argument MAX_NEW_TOKENS: 1024 leaves no room for a prompt"),
        (kv_memory.main, [str(TINY), "4", "10000000000", "0"], "argument COUNT: count=10000000000 needs a"),
        (kv_memory.main, [str(TINY), "4", "1"], "the following arguments are required: SEED"),
        (sim.main, ["--rollouts", "0"], "argument --rollouts: must be >= 2, got 0"),
        (sim.main, ["--strategies", "3_1_4,,8_4_32"], "argument --strategies: strategy ''"),
        (sim.main, ["--strategies", "3_1_4,3_1_4"], "duplicate strategy '3_1_4'"),
        (sim.main, ["--costs", "/nonexistent/costs.json"], "--costs /nonexistent/costs.json: No such file"),
        (_selector_random, ["--cases", "5-2"], "argument --cases: LOW-HIGH needs 0 <= LOW < HIGH, got '5-2'"),
        (_selector_random, ["--seeds", "0,,1"], "argument --seeds: integers separated by commas"),
        (_selector_random, ["--out", str(ROOT / "README.md" / "x.jsonl")], "README.md is not a directory"),
        (attention.main, ["--json", str(ROOT / "README.md" / "x.json")], "argument --json: " + str(ROOT / "README.md")),
        (attention.main, ["--repeats", "0"], "argument --repeats: must be >= 1, got 0"),
        (host_time.main, ["throughput", "1,,2", "4"], "argument BATCHES: integers separated by commas, got '1,,2'"),
        (host_time.main, ["throughput", "abc"], "argument BATCHES: integers separated by commas, got 'abc'"),
        (host_time.main, ["throughput", "1", "abc"], "argument NEW_TOKENS: 'abc' is not an integer"),
        (host_time.main, ["throughput", "0", "4"], "argument BATCHES: each must be >= 1, got '0'"),
        (host_time.main, ["throughput", "1,0", "2"], "argument BATCHES: each must be >= 1, got '1,0'"),
        (host_time.main, ["sampled", "1", "197"], "argument NEW_TOKENS: 197 does not fit the engines' 256-token"),
        (host_time.main, ["view", "10000000000", "4"], "argument BATCHES: batch=10000000000 needs a"),
        (host_time.main, ["throughput", "1", "4", "/nonexistent"], "MODEL=/nonexistent: checkpoint directory"),
        (host_time.main, ["kernel", "1", "4", "README.md", "x"], "unrecognized arguments: x"),
        (host_time.main, ["host", "bogus"], "argument STRATEGIES: strategy 'bogus'"),
        (host_time.main, ["host", "3_1_4,3_1_4"], "duplicate strategy '3_1_4'"),
        (host_time.main, ["gumbel", "extra"], "unrecognized arguments: extra"),
        (host_time.main, ["round", "bogus"], "argument STRATEGIES: strategy 'bogus'"),
        (host_time.main, ["round", "disable", "0"], "argument BATCH: must be >= 1, got 0"),
        (host_time.main, ["round", "disable", "5000"], "argument BATCH: at most 1024 rows, got 5000"),
        (host_time.main, ["nothing"], "argument COMMAND: invalid choice: 'nothing'"),
    ],
)
def test_a_bad_argument_is_a_usage_error(main, argv, said, capsys):
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 2 and said in capsys.readouterr().err


def test_help_is_answered_without_running(capsys, monkeypatch):
    for main in (eager_ops.main, long_tail.main):
        with pytest.raises(SystemExit) as stopped:
            main(["--help"])
        assert stopped.value.code == 0
    monkeypatch.setattr("sys.argv", ["attention_lengths", "--help"])
    with pytest.raises(SystemExit) as stopped:
        attention_lengths.main()
    assert stopped.value.code == 0 and "usage:" in capsys.readouterr().out
    with pytest.raises(SystemExit) as stopped:
        host_time.main(["--help"])
    assert stopped.value.code == 0
    out = capsys.readouterr().out
    assert "usage: python -m fastrl.bench.host_time [-h] COMMAND" in out and "throughput 1,64,256 64" in out


@pytest.mark.parametrize(
    ("content", "said"),
    [
        ("not json", "is not JSON"),
        ("[]", "needs at least one measurement"),
        ('{"strategy": "3_1_4"}', "expected a list of {strategy, batch_size, seconds} objects"),
        ('[{"strategy": "nope", "batch_size": 1, "seconds": 0.1}]', "strategy 'nope'"),
        ('[{"strategy": "3_1_4", "batch_size": 0, "seconds": 0.1}]', "batch_size must be >= 1"),
        ('[{"strategy": "3_1_4", "batch_size": 1, "seconds": 0.1}]', "times none of --strategies ['8_4_32']"),
    ],
)
def test_the_simulator_refuses_a_bad_costs_file_naming_it(content, said, tmp_path, capsys):
    costs = tmp_path / "costs.json"
    costs.write_text(content)
    with pytest.raises(SystemExit) as stopped:
        sim.main(["--costs", str(costs), "--strategies", "8_4_32"])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert said in err and "--costs" in err and "Traceback" not in err


def test_selector_random_refuses_an_existing_out_before_running_and_writes_a_new_one(tmp_path, capsys):
    done = tmp_path / "done.jsonl"
    done.write_text("finished results\n")
    with pytest.raises(SystemExit) as stopped:
        _selector_random(["--cases", "0", "--seeds", "0", "--out", str(done)])
    assert stopped.value.code == 2 and f"{done} exists; choose a new file" in capsys.readouterr().err
    assert done.read_text() == "finished results\n"
    out = tmp_path / "deeper" / "new.jsonl"
    _selector_random(["--cases", "3", "--seeds", "1", "--out", str(out)])
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert (row["case"], row["seed"]) == (3, 1) and "vs_oracle: min" in capsys.readouterr().out


def test_kv_memory_process_entry_prints_one_row(capsys, monkeypatch, tmp_path):
    kv_memory.main([str(TINY), "4", "2", "0"])
    row = json.loads(capsys.readouterr().out)
    assert (row["max_new_tokens"], row["generated_tokens"]) == (4, 8) and row["peak_kv_bytes"] > 0
    # a budget up to the context (rows stop there: the suite measures memory, not speed; 1023 was refused and
    # `fastrl bench suites=[kv_memory]` ended in a traceback), and a model named as the suites name it ('' is
    # the bundled one: the check resolved it, the measurement loaded the raw argument)
    monkeypatch.chdir(tmp_path)
    kv_memory.main(["", "1023", "1", "0"])
    row = json.loads(capsys.readouterr().out)
    assert row["max_new_tokens"] == 1023 and 0 < row["generated_tokens"] <= 1023


def test_attention_refuses_an_existing_json_and_an_absent_gpu_before_timing(tmp_path, capsys, monkeypatch):
    done = tmp_path / "done.json"
    done.write_text("{}")
    with pytest.raises(SystemExit) as stopped:
        attention.main(["--json", str(done)])
    assert stopped.value.code == 2 and f"argument --json: {done} exists; choose a new file" in capsys.readouterr().err
    assert done.read_text() == "{}"
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    monkeypatch.setattr(attention, "time_case", lambda *a: pytest.fail("timed a case"))
    with pytest.raises(SystemExit) as stopped:
        attention.main(["--device", "cuda"])
    assert stopped.value.code == 2 and "--device=cuda: this machine has no CUDA device" in capsys.readouterr().err


def test_long_tail_reads_its_prompts_file_as_the_policy_runs_it_before_loading(tmp_path, capsys, monkeypatch):
    """A prompt the policy cannot run was timed as an error request with no tokens (one bucket fewer in the table);
    "prompt" text on a model without a chat template was refused as needing chat_template=true, a key the script
    does not have."""
    import fastrl.models.checkpoint as checkpoint
    from fastrl.assets_path import bundled_model_dir
    from fastrl.commands.prompt_tokens import policy_prompt_ids

    text = tmp_path / "text.jsonl"
    text.write_text('{"prompt": "1+1="}\n{"prompt_ids": [5, 6]}\n')
    ids = policy_prompt_ids(text, bundled_model_dir())
    assert len(ids) == 2 and ids[1] == [5, 6] and len(ids[0]) > 0
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt_ids": [5]}\n{"prompt_ids": [91]}\n')
    monkeypatch.setattr(checkpoint, "load_model", lambda *a, **k: pytest.fail("the model loaded first"))
    with pytest.raises(SystemExit) as stopped:
        long_tail.main(["--prompts-file", str(bad), "--requests", "2"])
    assert stopped.value.code == 2 and f"{bad}:2: prompt token ids out of the vocabulary" in capsys.readouterr().err
