"""recipes/gpu_model: every argument of run.py and engine_check.py checked before a model is built (a typo costs
no device time), the tests phase independent of the working directory, and `run.py --device cpu --tiny` a quick
smoke run of its phases."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "recipes" / "gpu_model"


def _script(name: str) -> ModuleType:
    """A recipe script, imported as a module (recipes/ is no package)."""
    spec = importlib.util.spec_from_file_location(f"gpu_model_{name}", RECIPE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


run = _script("run")
engine_check = _script("engine_check")


def _usage_error(parse, argv: list[str], capsys) -> str:
    """The one line argparse printed for ``parse(argv)``, which exits 2."""
    with pytest.raises(SystemExit) as exit_:
        parse(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


@pytest.fixture
def no_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--phases", "plain,attentoin"], "argument --phases: unknown ['attentoin']"),
        (["--batch-sizes", "1,x"], "argument --batch-sizes: integers separated by commas"),
        (["--profile-batches", "0"], "argument --profile-batches: each must be >= 1"),
        (["--strategy", "9_9_9_9"], "--strategy: strategy '9_9_9_9'"),
        (["--tests", "tests/models/test_cuda.py,tests/nope.py"], "argument --tests: tests/nope.py is not in"),
        (["--deadline", "-5"], "argument --deadline: must be a finite number > 0"),
        (["--long-tail", "0"], "argument --long-tail: must be >= 1"),
    ],
)
def test_engine_check_bad_arguments_are_one_error(flags, message, capsys):
    line = _usage_error(engine_check.parse_args, ["--out", "unused", "--device", "cpu", "--tiny", *flags], capsys)
    assert message in line


def test_engine_check_without_cuda_is_one_error_before_anything_runs(no_cuda, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(engine_check, "build", lambda *a: pytest.fail("built a model"))
    line = _usage_error(engine_check.main, ["--out", str(tmp_path / "out"), "--tiny"], capsys)
    assert "--device=cuda: this machine has no CUDA device" in line
    assert not (tmp_path / "out").exists()


def test_engine_check_parses_its_lists():
    args = engine_check.parse_args(["--out", "x", "--device", "cpu", "--phases", "tests,plain", "--batch-sizes", "1,4"])
    assert args.phases == ["tests", "plain"] and args.batch_sizes == [1, 4] and args.profile_batches == [1, 256]
    assert args.tests == engine_check.TESTS


def test_the_tests_phase_runs_from_the_repository_root(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # pytest's paths are the repository's, whatever the working directory
    value = engine_check.phase_tests(tmp_path / "tests.txt", 120.0, ["tests/test_json_values.py::test_reads_a_value"])
    assert value["returncode"] == 0, value["tail"]
    assert "error" not in value


def test_pytest_failing_without_a_failed_test_fails_the_phase(tmp_path, monkeypatch):
    def usage_error(*args, stdout, **kwargs):  # pytest's exit 4: a path not found, no test failed
        stdout.write("ERROR: file or directory not found: tests/models/x.py\n")
        return subprocess.CompletedProcess(args, 4)

    monkeypatch.setattr(engine_check.subprocess, "run", usage_error)
    value = engine_check.phase_tests(tmp_path / "tests.txt", 120.0, ["tests/models/x.py"])
    assert value["returncode"] == 4 and value["failed"] == []
    assert "pytest exited 4 with no FAILED test" in value["error"]


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--phases", "sft,bogus"], "argument --phases: unknown ['bogus']"),
        (["--sft-steps", "0"], "argument --sft-steps: must be >= 1"),
        (["--batch-sizes", "1,,4"], "argument --batch-sizes: integers separated by commas"),
        (["--bs1-strategies", "5_1_6,bandit"], "--bs1-strategies: strategy 'bandit'"),
        (["--dtype", "f16"], "--dtype must be one of"),
        (["--sft-seconds", "nan"], "argument --sft-seconds: must be a finite number > 0"),
    ],
)
def test_run_bad_arguments_are_one_error(flags, message, capsys):
    assert message in _usage_error(run.parse_args, ["--device", "cpu", "--tiny", *flags], capsys)


def test_run_without_cuda_is_one_error_before_anything_is_written(no_cuda, tmp_path, capsys):
    line = _usage_error(run.main, ["--out", str(tmp_path / "out"), "--work", str(tmp_path / "work"), "--tiny"], capsys)
    assert "--device=cuda: this machine has no CUDA device" in line
    assert not (tmp_path / "out").exists() and not (tmp_path / "work").exists()


def test_tiny_shrinks_every_phase_and_explicit_flags_win():
    args = run.parse_args(["--device", "cpu", "--tiny", "--drafter-epochs", "2"])
    assert args.drafter_epochs == 2 and args.dtype == "float32"
    for key, small in run.SMOKE.items():
        if key != "drafter_epochs":
            assert getattr(args, key) == small, key
    assert args.sft_steps < run.FULL["sft_steps"] and args.drafter_prompts < run.FULL["drafter_prompts"]
    assert args.long_tail < run.FULL["long_tail"] and args.repeats < run.FULL["repeats"]


def test_the_documented_gpu_command_means_what_it_did(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    # docs/benchmarks.md, round 11's next call
    argv = "--out o --phases sft,drafter,bs1,exactness --sft-seconds 110 --drafter-prompts 4096 --drafter-samples 2"
    argv += " --drafter-epochs 3 --bs1-strategies 5_1_6,6_4_24,8_4_32 --bs1-prompts 4 --repeats 1"
    args = run.parse_args(argv.split())
    assert args.phases == ["sft", "drafter", "bs1", "exactness"] and args.device == "cuda" and not args.tiny
    assert (args.sft_seconds, args.sft_steps, args.drafter_prompts, args.drafter_samples) == (110.0, 1600, 4096, 2)
    assert (args.drafter_epochs, args.drafter_ttt, args.drafter_shard, args.repeats) == (3, 3, 4096, 1)
    assert args.bs1_strategies == ["5_1_6", "6_4_24", "8_4_32"] and args.bs1_prompts == 4
    assert (args.dtype, args.long_tail, args.batch_sizes) == ("bfloat16", 256, [1, 8, 64, 256])


def test_tiny_smoke_run_of_the_default_phases(tmp_path):
    """The documented smoke run, from another working directory: every default phase ends without an error."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    argv = [sys.executable, str(RECIPE / "run.py"), "--device", "cpu", "--tiny", "--out", "out", "--work", "work"]
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    for phase in ("sft", "drafter", "bs1", "plain_vs_hf", "long_tail", "shapes"):
        assert "error" not in results[phase]["value"], (phase, results[phase])
    assert results["sft"]["value"]["config"]["steps"] == run.SMOKE["sft_steps"]
    assert results["shapes"]["value"]["skipped"]


@pytest.mark.parametrize("script", [run, engine_check])
def test_results_of_another_machine_are_refused_before_any_work(script, tmp_path, capsys, monkeypatch):
    """A later call added its phases to a results.json of another machine (run.py: an H200's bs1 figures under
    device cpu) or replaced the file whole (engine_check.py); a damaged file was a JSONDecodeError traceback."""
    monkeypatch.setattr(script, "build", lambda *a: pytest.fail("a model was built"), raising=False)
    monkeypatch.setattr(script, "PHASES", {k: lambda *a: pytest.fail("a phase ran") for k in script.PHASES})
    out = tmp_path / "out"
    out.mkdir()
    earlier = {"device": "NVIDIA H200", "torch": "2.9.0", "bs1": {"value": {"speedup": 3.1}}}
    (out / "results.json").write_text(json.dumps(earlier))
    argv = ["--out", str(out), "--work", str(tmp_path / "work"), "--device", "cpu", "--tiny"]
    line = _usage_error(script.main, [*argv, "--phases", next(iter(script.PHASES))], capsys)
    assert f"{out / 'results.json'} holds results of another machine or settings (device: 'NVIDIA H200' there" in line
    assert json.loads((out / "results.json").read_text()) == earlier
    (out / "results.json").write_text('{"device": "cpu", "bs1": ')
    assert "is not valid JSON" in _usage_error(script.main, [*argv, "--phases", next(iter(script.PHASES))], capsys)
    under_file = ["--out", str(out / "results.json" / "x"), "--device", "cpu", "--tiny"]
    assert "is not a directory" in _usage_error(script.main, under_file, capsys)


def test_a_later_call_on_the_same_machine_keeps_the_earlier_phases(tmp_path):
    from fastrl.bench.results_file import ResultsFile

    path = tmp_path / "results.json"
    identity = {"device": "cpu", "torch": torch.__version__, "tiny": True}
    ResultsFile.open(path, identity).record("sft", {"value": 1})
    later = ResultsFile.open(path, identity)
    later.record("bs1", {"value": 2})
    assert json.loads(path.read_text()) == identity | {"sft": {"value": 1}, "bs1": {"value": 2}}
    with pytest.raises(ValueError, match="tiny: True there, False here"):
        ResultsFile.open(path, identity | {"tiny": False})


def test_a_second_call_reruns_a_phase_that_writes_its_own_file(tmp_path):
    """The attention phase's file of an earlier call made the benchmark refuse its --json (a SystemExit, which
    passed the phases' `except Exception`: the call ended there, later phases unrun and unrecorded)."""
    argv = ["--out", str(tmp_path / "out"), "--work", str(tmp_path / "work"), "--device", "cpu", "--tiny"]
    for _ in range(2):
        run.main([*argv, "--phases", "attention"])
        results = json.loads((tmp_path / "out" / "results.json").read_text())
        assert "error" not in results["attention"]["value"], results["attention"]


@pytest.mark.parametrize("script", [run, engine_check])
def test_a_phase_that_exits_is_recorded_and_the_next_runs(script, tmp_path, monkeypatch):
    monkeypatch.setattr(script, "build", lambda *a: (None, None), raising=False)
    first, second = list(script.PHASES)[:2]

    def exits(*args):
        raise SystemExit(2)

    def phase_value(*args):
        return {"ran": True}

    if script is run:
        monkeypatch.setattr(script, "PHASES", {first: exits, second: phase_value})
    else:  # engine_check dispatches by name: its first two phases, as the module runs them
        monkeypatch.setattr(script, "phase_tests", exits)
        monkeypatch.setattr(script, "phase_plain", phase_value)
        first, second = "tests", "plain"
    argv = ["--out", str(tmp_path / "out"), "--work", str(tmp_path / "work"), "--device", "cpu", "--tiny"]
    script.main([*argv, "--phases", f"{first},{second}"])
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results[first]["value"]["error"].startswith("SystemExit") and results[second]["value"]["ran"] is True
