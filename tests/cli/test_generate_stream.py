"""`fastrl generate` loses no finished work: results stream to the output as requests finish, an interrupted run
(SIGINT, SIGTERM, a torn last line) resumes by skipping finished lines, and the result equals an uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fastrl.cli import main

N_PROMPTS = 12


@pytest.fixture(scope="module")
def prompts(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("prompts") / "in.jsonl"
    path.write_text("".join(json.dumps({"prompt_ids": [5 + i % 50, 6, 7 + i % 3]}) + "\n" for i in range(N_PROMPTS)))
    return path


def _args(model_dir, prompts, out, *extra):
    return [
        "generate",
        f"model={model_dir}",
        f"prompts={prompts}",
        f"output={out}",
        "max_new_tokens=16",
        "temperature=0.8",
        "batch_size=4",
        "progress=false",
        *extra,
    ]


def _read(path: Path) -> list[dict]:
    return [json.loads(line, parse_constant=_reject) for line in path.read_text().splitlines()]


def _assert_same(rows: list[dict], expected: list[dict]) -> None:
    """Identical records, except log-probs up to float noise (a different batch changes the summation order)."""
    assert [r["index"] for r in rows] == [e["index"] for e in expected]
    for r, e in zip(rows, expected, strict=True):
        assert r["logprobs"] == pytest.approx(e["logprobs"], abs=1e-4)
        assert {k: v for k, v in r.items() if k != "logprobs"} == {k: v for k, v in e.items() if k != "logprobs"}


def _reject(name: str):
    raise AssertionError(f"output holds a bare {name}: not JSON")


@pytest.fixture(scope="module")
def full_run(model_dir, prompts, tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("full") / "out.jsonl"
    assert main(_args(model_dir, prompts, out)) == 0
    return _read(out)


def test_output_is_in_prompt_order_with_an_index(full_run):
    assert [r["index"] for r in full_run] == list(range(N_PROMPTS))
    assert all(len(r["token_ids"]) == len(r["logprobs"]) for r in full_run)


def test_torn_output_resumes_and_keeps_finished_lines(model_dir, prompts, full_run, tmp_path, capsys):
    out = tmp_path / "out.jsonl"
    kept = [dict(r, kept=True) for r in full_run[3:7]]  # finished out of order; marked to prove they are not redone
    out.write_text("".join(json.dumps(r) + "\n" for r in kept) + '{"index": 9, "prompt_ids": [1')
    assert main(_args(model_dir, prompts, out)) == 0
    assert "resuming" in capsys.readouterr().err
    rows = _read(out)
    assert [r["index"] for r in rows] == list(range(N_PROMPTS))
    assert [r.pop("kept", False) for r in rows] == [3 <= i < 7 for i in range(N_PROMPTS)]
    _assert_same(rows, full_run)


@pytest.mark.parametrize("bad", [1, N_PROMPTS - 1])  # the last: its new record follows it, indices still sorted
def test_a_line_that_ended_in_an_error_runs_again_and_the_others_are_kept(model_dir, prompts, full_run, tmp_path, bad):
    """An earlier run's "error" result (e.g. a prompt since fixed, of a version that ran such prompts) was kept as
    finished: the same command found every line done, and the fixed line was refused as another prompt, the only
    remedies offered discarding every finished result. The line runs again; one record an index at the end."""
    out = tmp_path / "out.jsonl"
    failed = dict(full_run[bad], prompt_ids=[9, 9], token_ids=[], logprobs=[], finish_reason="error", error="boom")
    earlier = [failed if r["index"] == bad else dict(r, kept=True) for r in full_run]
    out.write_text("".join(json.dumps(r) + "\n" for r in earlier))
    assert main(_args(model_dir, prompts, out)) == 0
    rows = _read(out)
    assert [r["index"] for r in rows] == list(range(N_PROMPTS))
    assert [r.pop("kept", False) for r in rows] == [i != bad for i in range(N_PROMPTS)]
    _assert_same(rows, full_run)


def test_output_of_other_prompts_is_not_resumed(model_dir, prompts, full_run, tmp_path, capsys):
    out = tmp_path / "out.jsonl"
    out.write_text(json.dumps(dict(full_run[0], prompt_ids=[9, 9])) + "\n")
    assert main(_args(model_dir, prompts, out)) == 2
    assert "resume=false" in capsys.readouterr().err
    assert main(_args(model_dir, prompts, out, "resume=false")) == 0
    _assert_same(_read(out), full_run)


def test_output_of_other_settings_is_not_resumed(model_dir, prompts, full_run, tmp_path, capsys):
    """Each record carries the settings that made it: a rerun with another temperature or length would have mixed
    results of two settings into one file and said only "resuming"; it is refused, naming what differs. Records
    written before they carried settings resume on prompt and seed alone."""
    assert full_run[0]["settings"]["temperature"] == 0.8 and full_run[0]["settings"]["max_new_tokens"] == 16
    out = tmp_path / "out.jsonl"
    out.write_text("".join(json.dumps(r) + "\n" for r in full_run[:5]))
    before = out.read_text()
    assert main(_args(model_dir, prompts, out, "temperature=0.5", "max_new_tokens=8")) == 2
    err = capsys.readouterr().err
    assert "max_new_tokens=16 (now 8), temperature=0.8 (now 0.5)" in err and out.read_text() == before
    out.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "settings"}) + "\n" for r in full_run[:5]))
    assert main(_args(model_dir, prompts, out)) == 0
    rows = _read(out)
    assert [("settings" in r) for r in rows] == [i >= 5 for i in range(N_PROMPTS)]
    _assert_same(
        [{k: v for k, v in r.items() if k != "settings"} for r in rows],
        [{k: v for k, v in r.items() if k != "settings"} for r in full_run],
    )


def test_another_model_at_the_same_path_is_not_resumed_and_the_same_model_by_another_path_is(
    model_dir, prompts, full_run, tmp_path, capsys
):
    """The model was compared by the name it was given: another checkpoint put at the same path (an RL step's
    policy over its base) resumed, mixing two models' results in one file; the same directory named by another
    path (relative against absolute, a copy) was refused."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    out = tmp_path / "out.jsonl"
    out.write_text("".join(json.dumps(r) + "\n" for r in full_run[:5]))
    copy = tmp_path / "copy"
    shutil.copytree(model_dir, copy)
    assert main(_args(copy, prompts, out)) == 0  # the same weights under another name: resumed
    rows = _read(out)
    assert len({r["settings"]["weights"] for r in rows}) == 1
    _assert_same(
        [{k: v for k, v in r.items() if k != "settings"} for r in rows],
        [{k: v for k, v in r.items() if k != "settings"} for r in full_run],
    )
    out.write_text("".join(json.dumps(r) + "\n" for r in full_run[:5]))
    tensors = load_file(str(copy / "model.safetensors"))
    name = sorted(tensors)[0]
    tensors[name] = tensors[name] + 1e-3 * torch.ones_like(tensors[name])  # a step of training, in place
    save_file(tensors, str(copy / "model.safetensors"), metadata={"format": "pt"})
    before = out.read_text()
    assert main(_args(copy, prompts, out)) == 2
    err = capsys.readouterr().err
    assert f"the weights of model={str(model_dir)!r} (now other weights, model={str(copy)!r})" in err
    assert out.read_text() == before


@pytest.mark.parametrize(
    "edit",
    [("config.json", "rms_norm_eps", 1e-3), ("generation_config.json", "eos_token_id", [2, 7])],
    ids=["norm epsilon", "stop ids"],
)
def test_another_configuration_of_the_same_weights_is_not_resumed(model_dir, prompts, full_run, tmp_path, capsys, edit):
    """Results were told apart by the weights alone: a checkpoint whose config.json (a norm epsilon) or
    generation_config.json (an end-of-turn id added) changed resumed, mixing results of two models in one file.
    Records written before the configuration was kept resume on the rest."""
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(model_dir, copy)
    out = tmp_path / "out.jsonl"
    out.write_text("".join(json.dumps(r) + "\n" for r in full_run[:5]))
    file, key, value = edit
    path = copy / file
    path.write_text(json.dumps({**(json.loads(path.read_text()) if path.exists() else {}), key: value}))
    before = out.read_text()
    assert main(_args(copy, prompts, out)) == 2
    assert (
        f"the configuration of model={str(copy)!r} (its config.json or generation_config.json)"
        in capsys.readouterr().err
    )
    assert out.read_text() == before
    older = [{**r, "settings": {k: v for k, v in r["settings"].items() if k != "model_config"}} for r in full_run]
    out.write_text("".join(json.dumps(r) + "\n" for r in older[:5]))
    assert main(_args(model_dir, prompts, out)) == 0
    _assert_same(
        [{k: v for k, v in r.items() if k != "settings"} for r in _read(out)],
        [{k: v for k, v in r.items() if k != "settings"} for r in full_run],
    )


def test_records_that_carry_the_older_fingerprint_resume_with_the_weights_it_was_taken_of(
    model_dir, prompts, full_run, tmp_path, capsys
):
    """Results written before the fingerprint hashed every weight carry the older one (a hash of each tensor's first
    values): a rerun compares them by that recipe, so the same model resumes them and another is refused."""
    from fastrl.models.checkpoint import weights_heads_fingerprint

    out = tmp_path / "out.jsonl"
    older = [{**r, "settings": {**r["settings"], "weights": weights_heads_fingerprint(model_dir)}} for r in full_run]
    out.write_text("".join(json.dumps(r) + "\n" for r in older[:5]))
    assert main(_args(model_dir, prompts, out)) == 0
    rows = _read(out)
    assert [r["settings"]["weights"] for r in rows] == [older[0]["settings"]["weights"]] * 5 + [
        full_run[0]["settings"]["weights"]
    ] * (len(rows) - 5)
    _assert_same(
        [{k: v for k, v in r.items() if k != "settings"} for r in rows],
        [{k: v for k, v in r.items() if k != "settings"} for r in full_run],
    )
    out.write_text(
        "".join(json.dumps({**r, "settings": {**r["settings"], "weights": "0" * 16}}) + "\n" for r in older[:5])
    )
    before = out.read_text()
    assert main(_args(model_dir, prompts, out)) == 2
    assert "(now other weights" in capsys.readouterr().err
    assert out.read_text() == before


@pytest.mark.parametrize("text", ["my important notes", '{"a": 1}', "line one\nnotes without an end"])
def test_a_file_that_is_not_results_is_refused_untouched_whatever_its_last_line(
    model_dir, prompts, tmp_path, capsys, text
):
    """Text after the last newline was taken for a record a killed run was writing and cut off the file when it was
    read, before any check: a file of notes without a final newline was emptied, even by a run refused next."""
    out = tmp_path / "notes.txt"
    out.write_text(text)
    assert main(_args(model_dir, prompts, out)) == 2
    assert "not a result line of `fastrl generate`" in capsys.readouterr().err
    assert out.read_text() == text


def test_a_half_written_record_is_cut_only_by_a_run_that_goes_ahead(model_dir, prompts, full_run, tmp_path, capsys):
    """A run refused for its settings leaves the half-written last record where it was; one that resumes cuts it
    and writes that record whole."""
    out = tmp_path / "out.jsonl"
    lines = [json.dumps(r) + "\n" for r in full_run]
    cut = "".join(lines[:4]) + lines[4][: len(lines[4]) // 2]
    out.write_text(cut)
    other = [a if a != "max_new_tokens=16" else "max_new_tokens=15" for a in _args(model_dir, prompts, out)]
    assert main(other) == 2
    assert "holds results made with other settings" in capsys.readouterr().err
    assert out.read_text() == cut
    assert main(_args(model_dir, prompts, out)) == 0
    _assert_same(_read(out), full_run)


@pytest.fixture(scope="module")
def many_prompts(model_dir, tmp_path_factory) -> tuple[Path, list[dict]]:
    """Enough prompts that a run at batch 1 is still busy seconds after its first lines (the signal must land in the
    middle of the run, not after it, on a fast machine too), and their uninterrupted results."""
    path = tmp_path_factory.mktemp("many") / "in.jsonl"
    path.write_text("".join(json.dumps({"prompt_ids": [5 + i % 50, 6 + i % 7, 7 + i % 3]}) + "\n" for i in range(160)))
    out = tmp_path_factory.mktemp("many_full") / "out.jsonl"
    assert main(_args(model_dir, path, out)) == 0
    return path, _read(out)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_keeps_finished_results_and_a_rerun_completes_them(model_dir, many_prompts, tmp_path, sig):
    prompts, full_run = many_prompts
    out = tmp_path / "out.jsonl"
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    cmd = [sys.executable, "-m", "fastrl.cli", *_args(model_dir, prompts, out, "batch_size=1")]
    # An ignored SIGINT is inherited across exec (an earlier test's library, e.g. Ray, or a background shell can set
    # it in this process); give the child the default disposition, so Python turns SIGINT into KeyboardInterrupt.
    restore = lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)  # noqa: E731
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True, preexec_fn=restore)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if out.exists() and len(out.read_text().splitlines()) >= 2:
                proc.send_signal(sig)
                break
            time.sleep(0.01)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    partial = _read(out)
    assert proc.returncode == 130, err
    assert 2 <= len(partial) < len(full_run) and "Run the same command again" in err
    _assert_same(partial, [full_run[r["index"]] for r in partial])  # every line written is a complete, exact result
    assert main(_args(model_dir, prompts, out)) == 0
    _assert_same(_read(out), full_run)


def test_a_resume_merges_only_the_stats_of_the_results_it_keeps(model_dir, prompts, tmp_path, capsys):
    """A complete run's stats_output beside an output a later run (resume=false, killed before its stats) left with
    fewer results: the resume merged the complete run's rounds as the kept results' (its tokens counted ~twice).
    Stats say which results their rounds made; a resume merges them only where those are the kept ones."""
    out, stats = tmp_path / "out.jsonl", tmp_path / "stats.json"
    assert main(_args(model_dir, prompts, out, f"stats_output={stats}", "strategy=disable")) == 0
    assert json.loads(stats.read_text())["results"] == list(range(N_PROMPTS))
    kept = _read(out)[:5]
    out.write_text("".join(json.dumps(r) + "\n" for r in kept))  # the killed run's five, the first run's stats
    capsys.readouterr()
    assert main(_args(model_dir, prompts, out, f"stats_output={stats}", "strategy=disable")) == 0
    assert f"{stats} holds the rounds of {N_PROMPTS} other results than the 5 kept" in capsys.readouterr().err
    written = json.loads(stats.read_text())
    new = _read(out)[5:]
    assert written["results"] == list(range(5, N_PROMPTS))
    assert written["emitted_tokens"] == sum(max(len(r["token_ids"]) - 1, 0) for r in new)  # the first: a prefill's
    kept_stats = dict(written, results=list(range(N_PROMPTS)))  # stats of exactly the kept results: merged
    out.write_text("".join(json.dumps(r) + "\n" for r in _read(out)[: N_PROMPTS - 2]))
    stats.write_text(json.dumps(dict(kept_stats, results=list(range(N_PROMPTS - 2)))))
    assert main(_args(model_dir, prompts, out, f"stats_output={stats}", "strategy=disable")) == 0
    merged = json.loads(stats.read_text())
    assert merged["results"] == list(range(N_PROMPTS)) and merged["rounds"] > written["rounds"]


def test_results_that_finish_in_the_step_an_interrupt_comes_in_are_written(model_dir, tmp_path, monkeypatch):
    """Ctrl-C waits for the engine step's end, but the results that finished in that step were parked for a next
    step that never came: the run said 0 of 4 results were kept although their responses were computed."""
    import fastrl.engine.engine as engine_module

    prompts = tmp_path / "in.jsonl"
    prompts.write_text("".join(json.dumps({"prompt_ids": [5 + i, 6, 7]}) + "\n" for i in range(4)))
    out = tmp_path / "out.jsonl"
    original, finished = engine_module.Engine._release, []

    def release(self):
        done = original(self)
        if done and not finished:
            finished.extend(r.request_id for r in done)
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C inside the step in which these finished
        return done

    monkeypatch.setattr(engine_module.Engine, "_release", release)
    assert main(_args(model_dir, prompts, out, "strategy=disable")) == 130
    assert finished and len(_read(out)) >= len(finished)


def test_a_rerun_of_an_error_line_merges_the_stats_of_the_kept_results(model_dir, prompts, tmp_path, capsys):
    """An error record's line runs again, and the stats the earlier run wrote list its result among theirs: the
    rerun took them for another set's and kept only the rerun line's rounds."""
    out, stats = tmp_path / "out.jsonl", tmp_path / "stats.json"
    args = _args(model_dir, prompts, out, f"stats_output={stats}", "strategy=disable")
    assert main(args) == 0
    first = json.loads(stats.read_text())
    rows = _read(out)
    rows[3] = dict(rows[3], token_ids=[], logprobs=[], finish_reason="error", error="boom")  # a failed request
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    capsys.readouterr()
    assert main(args) == 0
    assert "covers only the rest" not in capsys.readouterr().err
    after = json.loads(stats.read_text())
    assert after["results"] == list(range(N_PROMPTS)) and after["rounds"] > first["rounds"]


@pytest.mark.parametrize("where", ["writing the first result", "building the step's outputs"])
def test_an_interrupt_anywhere_in_a_step_or_its_writes_keeps_every_result_it_finished(
    model_dir, tmp_path, monkeypatch, where
):
    """Ctrl-C while the first of a step's four finished results was written dropped the other three, and one while
    the step built its outputs (after the held block) lost all four and left their ids taken for good."""
    import fastrl.commands.result_stream as result_stream
    import fastrl.engine.engine as engine_module

    prompts = tmp_path / "in.jsonl"
    prompts.write_text("".join(json.dumps({"prompt_ids": [5 + i, 6, 7]}) + "\n" for i in range(4)))
    out = tmp_path / "out.jsonl"
    sent = []
    owner, name = (
        (result_stream.ResultStream, "write") if where.startswith("writing") else (engine_module.Engine, "_outputs")
    )
    original = getattr(owner, name)

    def interrupted(self, *args):
        finishing = name == "write" or any(r.finish_reason is not None for r in args[0])
        if finishing and not sent:
            sent.append(1)
            os.kill(os.getpid(), signal.SIGINT)
        return original(self, *args)

    monkeypatch.setattr(owner, name, interrupted)
    assert main(_args(model_dir, prompts, out, "strategy=disable", "max_new_tokens=4")) == 130
    assert sent and len(_read(out)) == 4  # the four finish in one step (one batch, one length)


@pytest.mark.parametrize("second", [signal.SIGTERM, signal.SIGINT])
def test_a_second_signal_after_the_interrupted_line_keeps_exit_130(tmp_path, second):
    """After "interrupted" the command put SIGTERM back to the default while the interpreter shut down: a second
    SIGTERM there killed it (143 to a scheduler), a second SIGINT left an uncaught KeyboardInterrupt."""
    import subprocess
    import sys
    import time

    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt_ids": [5 + i % 40, 6, 7]}) + "\n" for i in range(300)))
    out = tmp_path / "o.jsonl"
    args = [sys.executable, "-m", "fastrl.cli", "generate", f"prompts={prompts}", f"output={out}", "progress=false"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([*args, "max_new_tokens=64"], stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 120
        while not (out.exists() and out.read_text().count("\n") >= 2) and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        line = proc.stderr.readline()
        while line and "interrupted" not in line:
            line = proc.stderr.readline()
        proc.send_signal(second)  # while the interpreter shuts down
        assert proc.wait(timeout=60) == 130 and "interrupted" in line
    finally:
        if proc.poll() is None:
            proc.kill()
