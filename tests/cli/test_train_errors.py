"""`fastrl train` errors in the user's words (issue 25's six cases): each is one `fastrl train: error:` line naming
the key as typed, and leaves no run folder."""

from __future__ import annotations

import os

import pytest

from fastrl.cli import main

TINY = ["rl.steps=1", "rl.prompts_per_step=2", "rl.samples_per_prompt=2", "rl.max_new_tokens=8", "task.n_max=6"]


def _error_line(capsys) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("fastrl train: error: ")
    return lines[0]


@pytest.mark.parametrize(
    "args, words",
    [
        # a group option that does not exist: the valid choices and the right spelling
        (
            ["strategy=4-3-10"],
            "strategy=4-3-10: no such strategy option; choose one of ['bandit', 'disable', 'ema', 'static']; "
            "a fixed strategy is spelled strategy=static strategy.name=4_3_10",
        ),
        # a strategy string named as strategy.name, not rollout.worker.strategy
        (["strategy=static", "strategy.name=4-3-10"], "strategy.name=4-3-10: expected bandit | ema, disable"),
        (["strategy.name=4-3-10"], "did you mean strategy.name=4_3_10?"),
        # a strategy that breaks one rule: the rule, as generate names it
        (
            ["strategy=static", "strategy.name=8_4_1000"],
            "strategy '8_4_1000': num_draft_tokens=1000 exceeds the tree capacity 1 + topk + (steps - 1) * topk**2",
        ),
        # a GRPO key named as rl.steps, not GRPOConfig.steps
        (["rl.steps=-1"], "rl.steps must be an integer >= 1, got -1"),
        (["rl.steps=0"], "rl.steps must be an integer >= 1, got 0"),
        (["rl.temperature=1e-7"], "rl.temperature must be 0 (greedy) or at least 1e-06, got 1e-07"),  # as generate
        # the rollout worker's keys, named where `fastrl train` has them (drafter.*, rollout.*)
        (["drafter.slice_seconds=-1"], "drafter.slice_seconds must be a finite number > 0, got -1.0"),
        (["drafter.buffer_tokens=0"], "drafter.buffer_tokens must be an integer >= 2, got 0"),
        (["rollout.torch_threads=0"], "rollout.torch_threads must be an integer >= 1, got 0"),
        # rollout=local refuses what rollout=ray does (it ran with a round timeout of nan or 0)
        (["rollout.round_timeout_s=nan"], "rollout.round_timeout_s must be a finite number > 0, got nan"),
        (["rollout.round_timeout_s=0"], "rollout.round_timeout_s must be a finite number > 0, got 0.0"),
        (["rollout.ray_num_cpus=0"], "rollout.ray_num_cpus must be None or an integer >= 1, got 0"),
        (["rl.steps=abc"], "rl.steps=abc (Value 'abc' of type 'str' could not be converted to Integer)"),
        # keys of nested configs whose own messages name them shortly (EngineConfig's "engine.", the drafter
        # trainer's, the task's), named as typed
        (["rollout.engine.page_size=0"], "rollout.engine.page_size must be >= 1, got 0"),
        (["rollout.engine.dtype=int8"], "rollout.engine.dtype must be one of"),
        (["rollout.engine.kv_cache_tokens=64"], "rollout.engine.kv_cache_tokens = 64 cannot hold one request"),
        (
            ["rollout.engine.max_model_len=5000"],
            "rollout.engine.max_model_len=5000 exceeds the policy's 1024 positions",
        ),
        (["drafter.trainer.lr=-1"], "drafter.trainer.lr must be a finite number > 0, got -1.0"),
        (["drafter.trainer.grad_clip=-1"], "drafter.trainer.grad_clip must be a finite number > 0, got -1.0"),
        (["task.n_max=0"], "task.n_max must be in [n_min=2, "),
        # keys that would have been ignored
        (["rollout.num_workers=3"], "rollout.num_workers=3: rollout=local runs one engine in this process"),
        (["drafter.trainer.seed=5"], "drafter.trainer.seed=5: co-training draws its batches and noise from rl.seed"),
        # model= a path that is not a directory
        (["model=/nonexistent/ckpt"], "model=/nonexistent/ckpt: no such model option; choose one of ['bundled', "),
        # Hydra's flags are flags, not keys
        (["--cfg", "jobb"], "--cfg jobb: choose one of job | hydra | all"),
        (["-c"], "--cfg rollout=local: choose one of job | hydra | all"),
    ],
)
def test_one_line_naming_the_key_as_typed(args, words, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", *args, "rollout=local", "logger=none", f"hydra.run.dir={run}"]) == 2
    assert words in _error_line(capsys)
    assert not run.exists()
    assert "GRPOConfig" not in words and "rollout.worker" not in words


def test_cfg_job_is_a_flag_not_a_key(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for flags in (["--cfg", "job"], ["-c", "job"]):
        assert main(["train", *flags]) == 0
        assert "has no key" not in capsys.readouterr().err
    assert os.listdir(tmp_path) == []


def test_model_dir_works_as_for_generate(policy_dir, tmp_path):
    run = tmp_path / "run"
    args = [*TINY, f"model={policy_dir}", "drafter=fresh", "rollout=local", "logger=none", f"hydra.run.dir={run}"]
    assert main(["train", *args]) == 0
    assert (run / "metrics.jsonl").read_text().count("\n") == 1


def test_a_run_failing_before_its_first_step_leaves_no_run_folder(policy_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    # passes the config checks; fails when the drafter is loaded, after Hydra made the run directory and W&B's run
    bad_drafter = tmp_path / "drafter"
    bad_drafter.mkdir()
    args = [*TINY, f"model={policy_dir}", f"drafter.path={bad_drafter}", "rollout=local", "logger=wandb_offline"]
    assert main(["train", *args]) == 2
    assert "drafter.path=" in _error_line(capsys)
    assert not list((tmp_path / "runs" / "train").iterdir())


def test_damaged_weights_are_named_with_the_models_key(policy_dir, tmp_path, capsys):
    """The error named the file but not the key the model came from."""
    import shutil

    damaged = tmp_path / "model"
    shutil.copytree(policy_dir, damaged)
    weights = damaged / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:200])
    args = [
        *TINY,
        f"model={damaged}",
        "drafter=fresh",
        "rollout=local",
        "logger=none",
        f"hydra.run.dir={tmp_path / 'r'}",
    ]
    assert main(["train", *args]) == 2
    assert _error_line(capsys).startswith(f"fastrl train: error: model.path: {weights} is not a readable safetensors")


def test_reusing_a_run_directory_is_an_error(policy_dir, tmp_path, capsys):
    run = tmp_path / "run"
    args = [*TINY, f"model={policy_dir}", "drafter=fresh", "rollout=local", "logger=none", f"hydra.run.dir={run}"]
    assert main(["train", *args]) == 0
    capsys.readouterr()
    before = {p: p.stat().st_mtime_ns for p in run.rglob("*")}
    assert main(["train", *args]) == 2
    assert f"hydra.run.dir={run} holds an earlier run" in _error_line(capsys)
    assert {p: p.stat().st_mtime_ns for p in run.rglob("*")} == before


def test_more_workers_than_a_local_ray_has_is_said_before_ray_starts(tmp_path, capsys):
    """A local Ray's resources are known before it starts (rollout.ray_num_cpus or the cores, the GPUs here): asking
    for more is the error it would be inside Ray, without starting Ray (a `ray` import is no evidence either way,
    so the test asserts no Ray session was made)."""
    import ray

    run = tmp_path / "run"
    args = [*TINY, "rollout.num_workers=9", "rollout.ray_num_cpus=4", "logger=none", f"hydra.run.dir={run}"]
    assert main(["train", *args]) == 2
    assert "rollout.num_workers=9 workers of 1 CPU each need 9 CPUs, but this Ray cluster has 4" in _error_line(capsys)
    assert not ray.is_initialized() and not run.exists()


@pytest.mark.parametrize("backend", ["local", "ray"])
def test_rollout_keys_are_checked_before_any_work_for_either_backend(backend, tmp_path, capsys, monkeypatch):
    """rollout=local took rollout.round_timeout_s=nan (rollout=ray refused it, once the model had loaded)."""
    import ray

    import fastrl.commands.train as train_command

    monkeypatch.setattr(train_command, "load_model", lambda *a: pytest.fail("the model loaded before the check"))
    run = tmp_path / "run"
    args = [*TINY, f"rollout={backend}", "rollout.num_workers=1", "rollout.round_timeout_s=nan", "logger=none"]
    assert main(["train", *args, f"hydra.run.dir={run}"]) == 2
    assert "rollout.round_timeout_s must be a finite number > 0, got nan" in _error_line(capsys)
    assert not ray.is_initialized() and not run.exists()


def test_a_run_directory_that_cannot_be_made_is_said_before_anything_starts(tmp_path, capsys):
    """Hydra makes the run directory; where it cannot (under a file, a read-only place) the run says so in one line
    naming the key (it was an OSError traceback from Hydra)."""
    (tmp_path / "file").write_text("x")
    run = tmp_path / "file" / "run"
    assert main(["train", *TINY, "logger=none", f"hydra.run.dir={run}"]) == 2
    assert f"hydra.run.dir={run}: {tmp_path / 'file'} is not a directory" in _error_line(capsys)


@pytest.fixture
def wandb_online(monkeypatch):
    """W&B's environment says online (CI exports WANDB_MODE=offline), in a W&B set up afresh from it, and set up
    afresh again for the next test (from the environment monkeypatch restores)."""
    import wandb

    monkeypatch.setenv("WANDB_MODE", "online")
    wandb.teardown()
    yield
    wandb.teardown()


def test_wandb_online_without_an_account_is_one_error_naming_the_key(tmp_path, capsys, monkeypatch, wandb_online):
    """W&B's own UsageError was a traceback; it is one line naming logger.mode, said before the rollout engines
    start and calibrate (W&B refused only then, after minutes on a new GPU), and the refused run leaves no folder."""
    monkeypatch.setenv("FASTRL_CACHE", str(tmp_path / "cache"))  # no calibration cached: one would be measured
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))  # no stored login
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    run = tmp_path / "run"
    args = [
        "train",
        *TINY,
        "drafter=fresh",
        "rollout=local",
        "report=false",
        "logger.mode=online",
        f"hydra.run.dir={run}",
    ]
    assert main(args) == 2
    line = _error_line(capsys)
    assert "logger.mode=online: W&B refused to start a run" in line and "logger.mode=offline" in line
    assert not run.exists() and not (tmp_path / "cache").exists()


def test_a_pool_too_small_is_the_same_line_with_ray_workers(tmp_path, capsys):
    """With rollout=ray the engines' refusal came back from the actors as a RuntimeError traceback naming
    engine.kv_cache_tokens: the worker config checks the pool in the driver, before Ray starts."""
    run = tmp_path / "run"
    args = ["train", "rollout=ray", "rollout.engine.kv_cache_tokens=64", "logger=none", f"hydra.run.dir={run}"]
    assert main(args) == 2
    assert "rollout.engine.kv_cache_tokens = 64 cannot hold one request" in _error_line(capsys)
    assert not run.exists()


@pytest.mark.parametrize(
    "args, words",
    [
        (["logger.project=bad/name"], "logger.project='bad/name': Invalid project name 'bad/name'"),
        (["logger.tags=[x,'']"], "logger.tags=['x', '']: Tag at index 1 is empty"),
        ([f"logger.tags=[{'t' * 65}]"], "is 65 characters. Tags must be between 1 and 64 characters"),
    ],
)
def test_wandb_settings_are_checked_before_any_work_naming_the_key(args, words, tmp_path, capsys, monkeypatch):
    """W&B refused a project name or a tag only when its run started (after the model and the workers), blaming
    logger.mode or in a multi-line pydantic dump."""
    import fastrl.commands.train as train_command

    monkeypatch.setattr(train_command, "load_model", lambda *a: pytest.fail("the model loaded before the check"))
    run = tmp_path / "run"
    assert main(["train", *TINY, *args, "rollout=local", "logger=wandb_offline", f"hydra.run.dir={run}"]) == 2
    assert words in _error_line(capsys)
    assert not run.exists()


def test_a_logger_dir_that_cannot_be_made_is_one_error_naming_it(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    run = tmp_path / "run"
    bad = tmp_path / "file" / "wandb"
    assert main(["train", *TINY, f"logger.dir={bad}", "rollout=local", f"hydra.run.dir={run}"]) == 2
    assert f"logger.dir={bad}: {tmp_path / 'file'} is not a directory" in _error_line(capsys)
    assert not run.exists()


def test_wandb_online_that_cannot_reach_its_server_is_one_error_naming_the_key(tmp_path):
    """With an API key but no way to the server, W&B's CommError was a traceback after its init timeout. (A fresh
    process: W&B reads WANDB_INIT_TIMEOUT once per process, and a W&B run of an earlier test would keep its 90 s.)"""
    import subprocess
    import sys

    env = dict(os.environ, WANDB_API_KEY="0" * 40, WANDB_INIT_TIMEOUT="5", WANDB_CONFIG_DIR=str(tmp_path / "config"))
    env["WANDB_BASE_URL"] = "http://127.0.0.1:9"  # the discard port: nothing listens
    script = (
        "from fastrl.telemetry.wandb_logger import WandbConfig, WandbLogger\n"
        f"WandbLogger(WandbConfig(mode='online', dir={str(tmp_path / 'wandb')!r}))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    said = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 1
    assert said.startswith("ValueError: logger.mode=online: W&B could not start a run (CommError: "), said
    assert "logger.mode=offline" in said


@pytest.mark.parametrize("exists", [False, True])
def test_a_new_run_directory_another_command_holds_is_refused_before_hydra_writes_into_it(tmp_path, capsys, exists):
    """Two `fastrl train hydra.run.dir=D` started together: the one refused the lock had already let Hydra write
    its .hydra/ record and log into D, over the running run's, whose resume then read the refused one's settings."""
    from fastrl.commands.run_dir import lock_run

    run = tmp_path / "D"
    if exists:
        run.mkdir()
    with lock_run(run):  # the other command, running in it
        args = [*TINY, "rollout=local", "logger=none", f"hydra.run.dir={run}"]
        assert main(["train", *args]) == 2
        assert f"hydra.run.dir={run} is being written by another fastrl command" in _error_line(capsys)
        assert not run.exists() or list(run.iterdir()) == []


def test_a_checkpoint_directory_another_run_holds_is_refused(tmp_path, capsys):
    """Two runs given one rl.checkpoint_dir both found it empty before either saved, then wrote over each other's
    steps (both exit 0): the directory is locked for a run's whole life, before it is checked."""
    from fastrl.commands.output_guard import guard_outputs

    shared = tmp_path / "ck"
    with guard_outputs({}, {}, work_dirs={"rl.checkpoint_dir": str(shared)}):  # the other run
        args = [*TINY, "rollout=local", "logger=none", f"rl.checkpoint_dir={shared}", f"hydra.run.dir={tmp_path / 'r'}"]
        assert main(["train", *args]) == 2
        assert f"rl.checkpoint_dir={shared} is being written by another fastrl command" in _error_line(capsys)
    assert not shared.exists() and not (tmp_path / "r").exists()


def test_a_run_directory_given_by_an_interpolation_is_locked_where_it_resolves(tmp_path, capsys):
    """`hydra.run.dir=runs/${fastrl_run_id:}` (the default's own pattern) was locked under its literal text before
    Hydra ran: a second such run, bound for a new directory of its own, was refused naming the first's pid, while
    the first's real directory went unlocked."""
    from fastrl.commands.run_dir import lock_run

    given = f"{tmp_path}/runs/${{fastrl_run_id:}}"
    with lock_run(tmp_path / "runs" / "${fastrl_run_id:}"):  # the literal a first run used to hold
        assert main(["train", *TINY, "rollout=local", "logger=none", "report=false", f"hydra.run.dir={given}"]) == 0
    (made,) = [p for p in (tmp_path / "runs").iterdir() if p.is_dir()]
    assert (made / "metrics.jsonl").is_file() and "$" not in made.name


def test_an_interpolated_run_directory_that_resolves_to_an_earlier_run_is_refused(tmp_path, capsys, monkeypatch):
    """`hydra.run.dir=runs/${oc.env:EXP}` naming an earlier run's directory passed the check made on its text and
    trained into it, rewriting its checkpoints and metrics (Hydra's `outputs/${now:%Y-%m-%d}` twice in a day)."""
    run = tmp_path / "runs" / "exp1"
    args = [*TINY, "rollout=local", "logger=none", "report=false", "rl.checkpoint_every=1"]
    assert main(["train", *args, f"hydra.run.dir={run}"]) == 0
    kept = {p: p.read_bytes() for p in (run / "checkpoints").rglob("*") if p.is_file()}
    metrics = (run / "metrics.jsonl").read_bytes()
    capsys.readouterr()
    monkeypatch.setenv("FASTRL_TEST_EXP", "exp1")
    assert main(["train", *args, f"hydra.run.dir={tmp_path}/runs/${{oc.env:FASTRL_TEST_EXP}}"]) == 2
    assert f"hydra.run.dir resolved to {run}, which holds an earlier run" in _error_line(capsys)
    assert (run / "metrics.jsonl").read_bytes() == metrics
    assert {p: p.read_bytes() for p in (run / "checkpoints").rglob("*") if p.is_file()} == kept
