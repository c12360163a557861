"""`fastrl generate` checks every output path before any work and never replaces what it must not (the prompts, a
symlink, a FIFO); bad inputs are one clear error naming the key, file or line; non-finite logits give an error
record in valid JSON."""

from __future__ import annotations

import json
import os
import stat
import threading

import pytest
import torch

from fastrl.cli import main
from tests.helpers import make_hf_model

PROMPTS = [{"prompt_ids": [5, 6, 7]}, {"prompt_ids": [8, 9]}]


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in PROMPTS))
    return path


def _generate(model_dir, *args) -> int:
    return main(["generate", f"model={model_dir}", "max_new_tokens=4", "progress=false", *args])


def _strict(text: str) -> list[dict]:
    def reject(name):
        raise AssertionError(f"bare {name} in the output")

    return [json.loads(line, parse_constant=reject) for line in text.splitlines()]


def test_output_equal_to_prompts_is_refused(model_dir, prompts, capsys):
    before = prompts.read_text()
    assert _generate(model_dir, f"prompts={prompts}", f"output={prompts}") == 2
    assert "is the prompts file" in capsys.readouterr().err
    assert prompts.read_text() == before
    link = prompts.parent / "link.jsonl"
    link.symlink_to(prompts)
    assert _generate(model_dir, f"prompts={prompts}", f"output={link}") == 2
    assert prompts.read_text() == before


def test_symlink_output_is_written_through_and_stays_a_link(model_dir, prompts, tmp_path):
    target = tmp_path / "real.jsonl"
    target.write_text("")
    link = tmp_path / "out.jsonl"
    link.symlink_to(target)
    assert _generate(model_dir, f"prompts={prompts}", f"output={link}") == 0
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert len(_strict(target.read_text())) == 2


def test_fifo_output_is_streamed_not_replaced(model_dir, prompts, tmp_path):
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    received: list[str] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_text()))
    reader.start()
    assert _generate(model_dir, f"prompts={prompts}", f"output={fifo}") == 0
    reader.join(timeout=60)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert sorted(r["index"] for r in _strict(received[0])) == [0, 1]


@pytest.mark.parametrize(
    "outputs, message",
    [
        (["output={d}"], "is a directory"),
        (["output={d}/o.jsonl", "stats_output=/proc/nope/stats.json"], "stats_output=/proc/nope/stats.json"),
        (["output={d}/o.jsonl", "stats_output={d}/o.jsonl"], "name the same file"),
        (["output={d}/file.txt/o.jsonl"], "is not a directory"),
    ],
)
def test_bad_output_paths_fail_before_any_work(model_dir, prompts, tmp_path, capsys, outputs, message):
    (tmp_path / "file.txt").write_text("x")
    args = [a.format(d=tmp_path) for a in outputs]
    assert _generate(model_dir, f"prompts={prompts}", *args) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "o.jsonl").exists()


@pytest.mark.parametrize(
    ("key", "name", "said"),
    [
        ("stats_output", "notes.txt", "is not the stats JSON of a `fastrl generate` run (JSONDecodeError"),
        (
            "stats_output",
            "other.json",
            "is not the stats JSON of a `fastrl generate` run (it has no 'bucket_thresholds'",
        ),
        ("plot_output", "notes.png", "is not a .png image (it does not begin as one)"),
    ],
)
def test_an_existing_file_that_is_no_report_of_a_run_is_not_overwritten(
    model_dir, prompts, tmp_path, capsys, key, name, said
):
    """stats_output=notes.txt overwrote the notes with the stats JSON (exit 0), while output=notes.txt is refused."""
    notes = tmp_path / name
    notes.write_text('{"my": "precious notes"}\n' if name.endswith(".json") else "my precious notes\n")
    before = notes.read_bytes()
    assert _generate(model_dir, f"prompts={prompts}", f"output={tmp_path / 'o.jsonl'}", f"{key}={notes}") == 2
    err = capsys.readouterr().err
    assert f"{key}={notes} {said}" in err and f"delete the file or name another {key}" in err
    assert "Traceback" not in err
    assert notes.read_bytes() == before
    assert not (tmp_path / "o.jsonl").exists()


def test_the_reports_of_an_earlier_run_are_rewritten(model_dir, prompts, tmp_path):
    stats, plot = tmp_path / "stats.json", tmp_path / "plot.png"
    reports = [f"stats_output={stats}", f"plot_output={plot}"]
    assert _generate(model_dir, f"prompts={prompts}", f"output={tmp_path / 'a.jsonl'}", *reports) == 0
    stats.write_text(stats.read_text().replace('"round_log"', '"old": 1, "round_log"', 1))
    assert _generate(model_dir, f"prompts={prompts}", f"output={tmp_path / 'b.jsonl'}", *reports) == 0
    assert "old" not in json.loads(stats.read_text())
    assert plot.read_bytes().startswith(b"\x89PNG")


def test_the_stats_of_an_earlier_fastrl_are_rewritten(model_dir, prompts, tmp_path):
    """A stats JSON of an earlier version (the selector called the strategy policy, no round log) is a run's own."""
    stats = tmp_path / "stats.json"
    stats.write_text(json.dumps({"strategy_policy": "bandit", "bucket_thresholds": [1, 2, 5, 21], "arms": {}}))
    assert _generate(model_dir, f"prompts={prompts}", f"output={tmp_path / 'a.jsonl'}", f"stats_output={stats}") == 0
    assert "round_log" in json.loads(stats.read_text())


@pytest.mark.parametrize(
    "content, message",
    [
        (b'{"prompt_ids": [5, true]}\n', "in.jsonl:1"),
        (b'{"prompt_ids": [5, 6]}\n{"prompt": "caf\xe9"}\n', "in.jsonl:2: not valid UTF-8"),
        (b'{"prompt_ids": [5, -1]}\n', "in.jsonl:1"),
    ],
)
def test_bad_prompt_lines_name_the_line(model_dir, tmp_path, capsys, content, message):
    path = tmp_path / "in.jsonl"
    path.write_bytes(content)
    assert _generate(model_dir, f"prompts={path}", f"output={tmp_path / 'o.jsonl'}") == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    "args, message",
    [
        (["threads=-1"], "generate.threads"),
        (["+temperture=0"], "did you mean 'temperature'?"),
        (["model=/nonexistent"], "model=/nonexistent: checkpoint directory /nonexistent does not exist"),
        (["strategy=ema", "ema_json={d}/missing.json"], "missing.json: file not found"),
        (["strategy=ema", "ema_json={d}"], "ema_json={d}: is a directory"),  # said "file not found"
        (["strategy=ema", "ema_json={d}/fifo.json"], "fifo.json: is not a regular file"),
        (["strategy=ema", "ema_json={d}/bad.json"], "bad.json is not valid JSON"),
        (["strategy=ema", "ema_json={d}/keys.json"], "unknown EMA config keys"),
        (["seed=9223372036854775808"], "generate.seed"),
        (["device=tpu"], "device"),
        (["strategy=3_2_4", "drafter={d}/nope"], "drafter={d}/nope: drafter directory {d}/nope does not exist"),
    ],
)
def test_bad_settings_are_one_clear_error(model_dir, prompts, tmp_path, capsys, args, message):
    (tmp_path / "bad.json").write_text("{")
    (tmp_path / "keys.json").write_text('{"alpha": 1}')
    os.mkfifo(tmp_path / "fifo.json")
    args = [a.format(d=tmp_path) for a in args]
    assert _generate(model_dir, f"prompts={prompts}", f"output={tmp_path / 'o.jsonl'}", *args) == 2
    err = capsys.readouterr().err
    assert message.format(d=tmp_path) in err and "Traceback" not in err
    assert not (tmp_path / "o.jsonl").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_cuda_is_named(model_dir, prompts, tmp_path, capsys):
    assert _generate(model_dir, f"prompts={prompts}", f"output={tmp_path / 'o.jsonl'}", "device=cuda") == 2
    assert "device=cuda: this machine has no CUDA device" in capsys.readouterr().err


def test_largest_seed_and_huge_batch_work(model_dir, prompts, tmp_path):
    out = tmp_path / "o.jsonl"
    args = [f"prompts={prompts}", f"output={out}", f"seed={2**63 - 1}", "batch_size=1000000000"]
    assert _generate(model_dir, *args) == 0
    assert [r["seed"] for r in _strict(out.read_text())] == [2**63 - 1, 0]


def test_kv_cache_that_cannot_fit_names_batch_size():
    from fastrl.commands.engine_setup import check_kv_memory
    from fastrl.models.config import ModelConfig

    config = ModelConfig("llama", 100, 4096, 8192, 32, 32, max_position_embeddings=131072)
    with pytest.raises(ValueError, match=r"batch_size=100000 needs a .* KV cache.*use batch_size="):
        check_kv_memory("batch_size", config, 100_000, torch.float32, "cpu")


def test_overflowing_activations_give_an_error_record_in_valid_json(tmp_path, prompts):
    model = make_hf_model("llama")
    with torch.no_grad():
        model.model.norm.weight.fill_(3e38)  # finite weights; the logits overflow to infinity, softmax to NaN
    model.save_pretrained(tmp_path / "overflow")
    out = tmp_path / "o.jsonl"
    assert _generate(tmp_path / "overflow", f"prompts={prompts}", f"output={out}") == 1
    rows = _strict(out.read_text())
    assert all(r["finish_reason"] == "error" and "non-finite logits" in r["error"] for r in rows)


def test_each_job_of_a_multirun_writes_its_own_results(tmp_path, monkeypatch, capsys):
    """`generate -m ... max_new_tokens=4,8` sent both jobs into one output: the second found the first's results,
    made with other settings, and the sweep failed."""
    import json

    from fastrl.cli import main

    monkeypatch.chdir(tmp_path)  # Hydra records the sweep under runs/multirun/ here
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"{a}+{a + 2}="}) + "\n" for a in range(3)))
    out, stats = tmp_path / "o.jsonl", tmp_path / "s.json"
    args = [f"prompts={prompts}", f"output={out}", f"stats_output={stats}", "progress=false", "strategy=3_1_4"]
    assert main(["generate", "-m", *args, "max_new_tokens=4,8"]) == 0, capsys.readouterr().err
    lengths = [
        {
            json.loads(line)["settings"]["max_new_tokens"]
            for line in (tmp_path / f"o.job{j}.jsonl").read_text().splitlines()
        }
        for j in (0, 1)
    ]
    assert lengths == [{4}, {8}] and (tmp_path / "s.job0.json").is_file() and (tmp_path / "s.job1.json").is_file()
    assert not out.exists() and not stats.exists()


@pytest.mark.parametrize("command", ["generate", "check-exact"])
def test_a_missing_prompts_key_says_what_to_type(command, capsys):
    """It printed OmegaConf's "Structured config of type `GenerateConfig` has missing mandatory value"."""
    from fastrl.cli import main

    assert main([command]) == 2
    err = capsys.readouterr().err
    assert f"`fastrl {command}` needs prompts: give it as prompts=VALUE" in err and "Structured config" not in err
