"""Where `fastrl train` keeps its checkpoints: an `rl.checkpoint_dir` that holds another run's checkpoints or cannot
be made is refused before any work, a run that keeps them there is continued by `resume=RUN_DIR`, a config group
given anew on resume replaces the run's own keys of that group, a refused resume starts no W&B run, and a resume
logs into the run's W&B run."""

from __future__ import annotations

import json

import pytest

from fastrl.cli import main
from fastrl.commands.output_guard import guard_outputs
from fastrl.commands.run_dir import RUN_DIR_KEY, latest_checkpoint, plan_run, wandb_run_id
from tests.cli.test_train_run_dirs import TINY, _steps


def test_a_checkpoint_dir_of_another_run_is_refused_before_any_work(policy_dir, tmp_path, capsys):
    other = tmp_path / "other"
    (other / "step_000002").mkdir(parents=True)
    (other / "step_000002" / "marker").write_text("theirs")
    run = tmp_path / "run"
    args = ["train", *TINY, f"model={policy_dir}", "rl.steps=1", f"hydra.run.dir={run}"]
    assert main([*args, f"rl.checkpoint_dir={other}"]) == 2
    said = capsys.readouterr().err
    assert f"rl.checkpoint_dir={other} holds another run's checkpoints (step_000002)" in said
    assert (other / "step_000002" / "marker").read_text() == "theirs" and sorted(p.name for p in other.iterdir()) == [
        "step_000002"
    ]
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert main([*args, f"rl.checkpoint_dir={afile / 'ck'}"]) == 2
    assert f"rl.checkpoint_dir={afile / 'ck'}: {afile} is not a directory" in capsys.readouterr().err


def test_a_run_with_its_own_checkpoint_dir_is_resumed_from_it(policy_dir, tmp_path, capsys):
    run, kept = tmp_path / "run", tmp_path / "kept"
    base = ["train", *TINY, f"model={policy_dir}", "rl.checkpoint_every=1"]
    assert main([*base, "rl.steps=2", f"hydra.run.dir={run}", f"rl.checkpoint_dir={kept}"]) == 0
    assert latest_checkpoint(run) == kept / "step_000002"
    capsys.readouterr()
    assert main(["train", f"resume={run}", "rl.steps=3"]) == 0
    assert f"resuming {kept / 'step_000002'}: step 2 of 3" in capsys.readouterr().out
    assert _steps(run) == [0, 1, 2] and latest_checkpoint(run) == kept / "step_000003"


def test_the_run_directory_named_another_way_is_resumed_in_place(tmp_path, monkeypatch):
    """`resume=RUN hydra.run.dir=RUN/` (or relative, or absolute) is the same directory: it was refused as an
    earlier run, with a hint to do exactly what was typed."""
    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_text("- rl.steps=2\n")
    (run / "checkpoints" / "step_000002").mkdir(parents=True)
    (run / "checkpoints" / "step_000002" / "trainer_state.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    for spelled in (str(run), f"{run}/", "run", "./run/", f"{tmp_path}/../{tmp_path.name}/run"):
        plan = plan_run([f"resume={run}", f"{RUN_DIR_KEY}={spelled}", "rl.steps=3"])
        assert plan.in_place and f"{RUN_DIR_KEY}={run.resolve()}" in plan.overrides, spelled


def test_a_group_given_on_resume_replaces_the_runs_keys_of_that_group(tmp_path):
    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_text("- strategy=static\n- strategy.name=5_1_6\n- rl.steps=2\n")
    (run / "checkpoints" / "step_000002").mkdir(parents=True)
    (run / "checkpoints" / "step_000002" / "trainer_state.json").write_text("{}")
    plan = plan_run([f"resume={run}", "strategy=disable", "rl.steps=3"])
    assert plan.in_place
    assert [o for o in plan.overrides if not o.startswith(("resume=", "hydra.run.dir="))] == [
        "strategy=disable",
        "rl.steps=3",
    ]
    kept = plan_run([f"resume={run}", "strategy.bandit.epsilon=0.2"]).overrides
    assert "strategy=static" in kept and "strategy.name=5_1_6" in kept  # a key inside the group keeps the rest


@pytest.mark.parametrize("damage", [b"- strategy=static\n- [unclosed\n", b"\xff\xfe- rl.steps=2\n"])
def test_a_damaged_overrides_file_is_named_on_resume(tmp_path, capsys, damage):
    """A YAML error in the run's .hydra/overrides.yaml came out as a traceback, bytes that are not UTF-8 as an error
    naming neither the file nor the key."""
    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_bytes(damage)
    (run / "checkpoints" / "step_000002").mkdir(parents=True)
    (run / "checkpoints" / "step_000002" / "trainer_state.json").write_text("{}")
    assert main(["train", f"resume={run}", "rl.steps=3"]) == 2
    err = capsys.readouterr().err
    assert f"resume={run}: {run / '.hydra' / 'overrides.yaml'} is damaged" in err and "Traceback" not in err
    assert (run / ".hydra" / "overrides.yaml").read_bytes() == damage


def test_a_refused_resume_starts_no_wandb_run_and_a_resume_logs_into_the_runs_own(policy_dir, tmp_path, capsys):
    run = tmp_path / "run"
    base = ["train", *[a for a in TINY if a != "logger=none"], f"model={policy_dir}", "rl.checkpoint_every=1"]
    assert main([*base, "rl.steps=1", f"hydra.run.dir={run}"]) == 0
    first = sorted((run / "wandb").glob("offline-run-*"))
    assert len(first) == 1
    recorded = (run / ".hydra" / "overrides.yaml").read_text()
    log = (run / "train.log").read_text()
    assert main(["train", f"resume={run}", "rl.steps=2", "rl.lr=0.5"]) == 2
    assert "GRPOConfig keys differ from the checkpoint's: ['rl.lr']" in capsys.readouterr().err
    assert sorted((run / "wandb").glob("offline-run-*")) == first
    assert (run / ".hydra" / "overrides.yaml").read_text() == recorded  # the refused resume left the run's record
    assert (run / "train.log").read_text() == log
    checkpoint = run / "checkpoints" / "step_000001"
    assert main(["train", f"resume={checkpoint}", "rl.steps=2", f"hydra.run.dir={tmp_path / 'new'}"]) == 2
    assert "resume=CHECKPOINT takes this command's keys alone" in capsys.readouterr().err
    assert main(["train", f"resume={run}", "rl.steps=2"]) == 0
    runs = sorted((run / "wandb").glob("offline-run-*"))
    assert len(runs) == 2 and all(wandb_run_id(run) in r.name for r in runs)  # one W&B run, logged twice
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [0, 1]


def test_logger_dir_is_where_wandb_writes(policy_dir, tmp_path):
    run, elsewhere = tmp_path / "run", tmp_path / "wb"
    base = ["train", *[a for a in TINY if a != "logger=none"], f"model={policy_dir}", "rl.checkpoint_every=0"]
    assert main([*base, "rl.steps=1", f"hydra.run.dir={run}", f"logger.dir={elsewhere}"]) == 0
    assert len(list((elsewhere / "wandb").glob("offline-run-*"))) == 1 and not (run / "wandb").exists()


def test_a_relative_checkpoint_dir_is_found_from_any_working_directory(policy_dir, tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    base = ["train", *TINY, f"model={policy_dir}", "rl.checkpoint_every=1"]
    assert main([*base, "rl.steps=1", f"hydra.run.dir={run}", "rl.checkpoint_dir=ck"]) == 0
    monkeypatch.chdir(tmp_path / "b")
    capsys.readouterr()
    assert main(["train", f"resume={run}", "rl.steps=2"]) == 0
    assert f"resuming {tmp_path / 'a' / 'ck' / 'step_000001'}" in capsys.readouterr().out
    assert latest_checkpoint(run) == tmp_path / "a" / "ck" / "step_000002"


def test_a_resume_refused_by_the_lock_leaves_the_run_as_it_was(policy_dir, tmp_path, capsys):
    run = tmp_path / "run"
    base = ["train", *TINY, f"model={policy_dir}", "rl.checkpoint_every=1"]
    assert main([*base, "rl.steps=1", f"hydra.run.dir={run}"]) == 0
    before = {p: p.read_bytes() for p in [*sorted((run / ".hydra").glob("*.yaml")), run / "train.log"]}
    with guard_outputs({}, {}, work_dirs={RUN_DIR_KEY: str(run)}):  # another command runs in it
        assert main(["train", f"resume={run}", "rl.steps=9", "threads=2"]) == 2
    assert "is being written by another fastrl command" in capsys.readouterr().err
    assert {p: p.read_bytes() for p in before} == before
    assert main(["train", "--cfg", "job", f"hydra.run.dir={run}"]) == 0  # printing a config checks no directory


def test_a_new_run_in_a_reused_directory_is_a_new_wandb_run(policy_dir, tmp_path):
    import shutil

    run = tmp_path / "run"
    base = ["train", *[a for a in TINY if a != "logger=none"], f"model={policy_dir}", "rl.checkpoint_every=0"]
    assert main([*base, "rl.steps=1", f"hydra.run.dir={run}"]) == 0
    first = wandb_run_id(run)
    shutil.rmtree(run)
    assert main([*base, "rl.steps=1", f"hydra.run.dir={run}"]) == 0
    assert wandb_run_id(run) != first


def test_a_resume_refused_by_the_checkpoint_itself_leaves_the_run_as_it_was(policy_dir, tmp_path, capsys):
    """A checkpoint the run cannot take (co-training state for 1 worker, 2 workers asked) is found only when it is
    loaded, after the workers start: the refusal still changes nothing (the run's record, its log, its W&B runs),
    so the run's own `resume=RUN_DIR` works afterwards."""
    run = tmp_path / "run"
    base = ["train", *[a for a in TINY if a != "logger=none"], f"model={policy_dir}", "rl.checkpoint_every=1"]
    assert main([*base, "rl.steps=1", f"hydra.run.dir={run}"]) == 0
    before = {p: p.read_bytes() for p in [*sorted((run / ".hydra").glob("*.yaml")), run / "train.log"]}
    segments = sorted((run / "wandb").glob("offline-run-*"))
    capsys.readouterr()
    assert main(["train", f"resume={run}", "rl.steps=2", "rollout=ray", "rollout.num_workers=2"]) == 2
    assert "co-training state for 1 workers, this run has rollout.num_workers=2" in capsys.readouterr().err
    assert {p: p.read_bytes() for p in before} == before
    assert sorted((run / "wandb").glob("offline-run-*")) == segments
    assert main(["train", f"resume={run}", "rl.steps=2"]) == 0
    assert _steps(run) == [0, 1]


def _wandb_steps(segment) -> set[int]:
    """The `step` values (single digits) a W&B offline segment's history records hold (its protobuf records: the
    key "step", then its JSON value)."""
    import re
    import time

    (events,) = segment.glob("*.wandb")
    deadline = time.monotonic() + 30.0  # W&B's service may still be writing when the command returns
    while b"\x12\x04step" not in events.read_bytes() and time.monotonic() < deadline:
        time.sleep(0.5)
    return {int(m) for m in re.findall(rb"\x12\x04step\x82\x01\x01(\d)", events.read_bytes())}


def test_a_resume_gives_wandb_the_steps_a_killed_run_lost(policy_dir, tmp_path):
    """A run killed before W&B wrote its history (SIGKILL: W&B's buffered records die with it) lost steps that
    metrics.jsonl and the checkpoint kept; the resume logs the earlier steps again (W&B keeps those it lacks)."""
    run = tmp_path / "run"
    base = ["train", *[a for a in TINY if a != "logger=none"], f"model={policy_dir}", "rl.checkpoint_every=1"]
    assert main([*base, "rl.steps=2", f"hydra.run.dir={run}"]) == 0
    (first,) = (run / "wandb").glob("offline-run-*")
    for events in first.glob("*.wandb"):
        events.write_bytes(events.read_bytes()[:100])  # what a killed run's segment may hold: its header
    assert main(["train", f"resume={run}", "rl.steps=3"]) == 0
    (second,) = set((run / "wandb").glob("offline-run-*")) - {first}
    assert _wandb_steps(second) == {0, 1, 2}


def test_a_damaged_metrics_file_refuses_the_resume_before_anything_changes(policy_dir, tmp_path, capsys):
    run = tmp_path / "run"
    base = ["train", *[a for a in TINY if a != "logger=none"], f"model={policy_dir}", "rl.checkpoint_every=1"]
    assert main([*base, "rl.steps=2", f"hydra.run.dir={run}"]) == 0
    lines = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text("\n".join(["{garb", *lines[1:]]) + "\n")
    before = {p: p.read_bytes() for p in [*sorted((run / ".hydra").glob("*.yaml")), run / "train.log"]}
    segments = sorted((run / "wandb").glob("offline-run-*"))
    capsys.readouterr()
    assert main(["train", f"resume={run}", "rl.steps=3"]) == 2
    said = capsys.readouterr()
    assert "metrics.jsonl:1: not a line of metrics" in said.err
    assert "resuming" not in said.out + said.err  # a refused resume does not say it resumes
    assert {p: p.read_bytes() for p in before} == before
    assert sorted((run / "wandb").glob("offline-run-*")) == segments


def test_a_run_refused_by_the_lock_of_a_command_started_with_it_removes_nothing(
    policy_dir, tmp_path, capsys, monkeypatch
):
    """Two commands started at once in one new run directory: the one refused the lock removed the directory the
    other was running in (it took the directory for its own, written before its first step)."""
    import fastrl.commands.train as train_command

    run = tmp_path / "run"
    held = []
    planned = train_command.plan_run

    def plan_then_the_other_starts(*args, **kwargs):
        plan = planned(*args, **kwargs)  # planned while the directory did not exist yet
        run.mkdir()
        other = guard_outputs({}, {}, work_dirs={RUN_DIR_KEY: str(run)})
        (run / "theirs.txt").write_text("the other command's")
        held.append(other)
        return plan

    monkeypatch.setattr(train_command, "plan_run", plan_then_the_other_starts)
    try:
        assert main(["train", *TINY, f"model={policy_dir}", "rl.steps=1", f"hydra.run.dir={run}"]) == 2
    finally:
        for other in held:
            other.release()
    assert "is being written by another fastrl command" in capsys.readouterr().err
    assert (run / "theirs.txt").read_text() == "the other command's"


def test_every_job_of_a_multirun_runs_under_its_own_directory_lock(tmp_path, monkeypatch):
    """The jobs of `fastrl train -m` share one RunPlan: a flag the first job set made every later one run without
    locking its directory (a second command could have written into it at the same time)."""
    from types import SimpleNamespace

    import fastrl.commands.train as train_command
    from fastrl.commands.run_dir import RunPlan

    held = []

    def job_body(cfg, run_dir, plan):
        try:
            with guard_outputs({}, {}, work_dirs={RUN_DIR_KEY: str(run_dir)}):
                held.append(False)
        except ValueError:
            held.append(True)  # refused: this job holds its directory
        return []

    monkeypatch.setattr(train_command, "_run_train", job_body)
    plan = RunPlan([])
    cfg = SimpleNamespace(rl=SimpleNamespace(checkpoint_dir=None))  # what run_train reads before the job
    for job in ("0", "1", "2"):
        train_command.run_train(cfg, tmp_path / job, plan)
    assert held == [True, True, True]


def test_resume_names_a_file_as_a_file_and_a_negative_step_count_names_its_key(tmp_path):
    """resume= naming a regular file said 'no such directory'; a negative warmup_steps or total_steps was reported
    as both keys, without the value."""
    from fastrl.commands.run_dir import resolve_resume
    from fastrl.cotrain.drafter_trainer import DrafterTrainerConfig

    afile = tmp_path / "notes.txt"
    afile.write_text("x")
    with pytest.raises(ValueError, match=r"resume=.*notes.txt: a file, not a directory \(give a run directory"):
        resolve_resume(str(afile))
    with pytest.raises(ValueError, match=r"resume=.*nowhere: no such directory"):
        resolve_resume(str(tmp_path / "nowhere"))
    for key in ("warmup_steps", "total_steps"):
        with pytest.raises(ValueError, match=rf"^drafter_trainer\.{key} must be >= 0, got -3$"):
            DrafterTrainerConfig(**{key: -3})
