"""The output guard of every command (issue 27, cases 1, 2, 4, 6): inputs are never outputs, a directory where a
file goes (or a non-empty output directory without overwrite=true) is refused before any work, a second writer of
the same output is refused while the first holds it, and a refused command writes nothing."""

from __future__ import annotations

import errno
import json
import os

import pytest

from fastrl.assets_path import bundled_drafter_dir, bundled_model_dir
from fastrl.atomic_files import atomic_path
from fastrl.cli import main
from fastrl.commands.engine_setup import model_inputs
from fastrl.commands.output_guard import OutputTarget, guard_outputs, image_file_problem
from fastrl.commands.staged_output import staged_directory
from tests.helpers import write_last_layer_drafter

PROMPTS = [{"prompt": "3+4="}, {"prompt": "5+6="}]


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in PROMPTS))
    return path


@pytest.fixture(scope="module")
def drafter_dir(tmp_path_factory):
    """A last-layer drafter (the shipped one reads a fused input, which export-drafter refuses before any guard)."""
    return write_last_layer_drafter(tmp_path_factory.mktemp("drafter"))


def _snapshot(directory) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def test_check_exact_never_writes_its_report_over_the_prompts(prompts, tmp_path, capsys):
    before = prompts.read_bytes()
    assert main(["check-exact", f"prompts={prompts}", f"report={prompts}", "strategy=8_4_32", "progress=false"]) == 2
    assert "report=" in capsys.readouterr().err and prompts.read_bytes() == before
    assert main(["check-exact", f"prompts={prompts}", f"report={tmp_path}", "progress=false"]) == 2
    err = capsys.readouterr().err
    assert f"report={tmp_path} is a directory" in err and "Traceback" not in err


def test_export_drafter_refuses_a_directory_holding_a_model(drafter_dir, tmp_path, capsys):
    victim = tmp_path / "victim"
    victim.mkdir()
    for f in bundled_model_dir().iterdir():
        (victim / f.name).write_bytes(f.read_bytes())
    before = _snapshot(victim)
    assert main(["export-drafter", str(drafter_dir), str(victim), "--format", "sglang"]) == 2
    assert "not empty" in capsys.readouterr().err and _snapshot(victim) == before
    assert main(["export-drafter", str(drafter_dir), str(drafter_dir), "overwrite=true"]) == 2
    assert "is the drafter directory" in capsys.readouterr().err


def test_export_drafter_with_a_bad_bandit_state_writes_nothing(drafter_dir, tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text('{"config": 1}')
    out = tmp_path / "out"
    assert main(["export-drafter", str(drafter_dir), str(out), f"bandit_state={bad}"]) == 2
    assert f"bandit_state={bad}: not a fastrl bandit state_dict" in capsys.readouterr().err
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == ["bad.json"]


def test_export_drafter_overwrite_replaces_its_files_and_keeps_others(drafter_dir, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    (out / "model.safetensors").write_text("stale")
    assert main(["export-drafter", str(drafter_dir), str(out), "overwrite=true"]) == 0
    assert (out / "notes.txt").read_text() == "mine" and (out / "model.safetensors").stat().st_size > 100
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"], "no staging directory or lock file is left"


def test_a_second_writer_of_the_same_output_is_refused(prompts, tmp_path, capsys):
    out = tmp_path / "out.jsonl"
    out.write_text("")
    with guard_outputs({"output": str(out)}, {}):  # another command holds the output
        args = ["generate", f"prompts={prompts}", f"output={out}", "max_new_tokens=4", "progress=false"]
        assert main(args) == 2
        err = capsys.readouterr().err
        assert f"output={out} is being written by another fastrl command (pid {os.getpid()})" in err
        assert out.read_text() == ""
    assert main(args) == 0 and len(out.read_text().splitlines()) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "out.jsonl"]


def test_train_drafter_refuses_an_existing_output_before_any_work(tmp_path, capsys):
    out = tmp_path / "drafter"
    out.mkdir()
    (out / "drafter_config.json").write_text("{}")
    assert main(["train-drafter", f"output={out}", "num_prompts=1", "eval_prompts=1", "epochs=1"]) == 2
    err = capsys.readouterr().err
    assert f"output={out} is a directory that is not empty" in err and "overwrite=true" in err
    assert (out / "drafter_config.json").read_text() == "{}"


def test_bench_output_that_is_a_directory_is_refused_before_any_work(tmp_path, capsys):
    assert main(["bench", f"output={tmp_path}", "suites=[spec_bs1]"]) == 2
    assert f"output={tmp_path} is a directory" in capsys.readouterr().err


def test_an_output_that_is_a_file_of_the_model_is_refused(prompts, tmp_path, capsys):
    model = tmp_path / "model"
    model.mkdir()
    for f in bundled_model_dir().iterdir():
        (model / f.name).write_bytes(f.read_bytes())
    before = _snapshot(model)
    args = ["generate", f"model={model}", f"prompts={prompts}", f"output={model / 'config.json'}", "progress=false"]
    assert main(args) == 2
    assert "is a file of the model directory" in capsys.readouterr().err and _snapshot(model) == before


def test_the_shipped_drafter_a_run_loads_by_default_is_an_input_too():
    """`drafter=` left empty names the model's shipped drafter: no output may land on its files (the guard refuses
    before it locks or writes anything, so this runs against the real asset)."""
    inputs = model_inputs(bundled_model_dir(), "")
    assert inputs == {"model": str(bundled_model_dir()), "drafter": str(bundled_drafter_dir())}
    for name in ("drafter.safetensors", "metrics.json"):
        target = bundled_drafter_dir() / name
        with pytest.raises(ValueError, match="is a file of the drafter directory"):
            guard_outputs({"output": str(target)}, inputs)
    assert model_inputs(bundled_model_dir(), "elsewhere")["drafter"] == "elsewhere"


def _disk_full() -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_full_disk_while_writing_a_file_keeps_the_old_one_and_says_so(tmp_path):
    target = tmp_path / "report.json"
    target.write_text("earlier report")
    with pytest.raises(ValueError, match=f"^no space left writing {target}; it is left as it was$"):
        with atomic_path(target) as tmp:
            tmp.write_text("half a rep")
            raise _disk_full()
    assert target.read_text() == "earlier report" and [p.name for p in tmp_path.iterdir()] == ["report.json"]


def test_a_full_disk_while_staging_a_directory_keeps_its_files_and_says_so(tmp_path):
    final = tmp_path / "drafter"
    final.mkdir()
    (final / "drafter.safetensors").write_bytes(b"earlier weights")
    with pytest.raises(ValueError, match=f"^no space left writing into {final}; its files are left as they were$"):
        with staged_directory(OutputTarget(key="output", given=final, path=final, regular=True)) as staging:
            (staging / "drafter.safetensors").write_bytes(b"half")
            raise _disk_full()
    assert _snapshot(final) == {"drafter.safetensors": b"earlier weights"}
    assert [p.name for p in tmp_path.iterdir()] == ["drafter"]


def test_other_write_errors_pass_through_unchanged(tmp_path):
    with pytest.raises(PermissionError):
        with atomic_path(tmp_path / "x.json"):
            raise PermissionError(errno.EACCES, "denied")


def test_a_work_directory_is_reused_but_never_shared(tmp_path):
    """train-drafter's stream directory keeps its shards and state across runs (a non-empty one is its own to resume
    from), is created before any work, and is locked: a second command on it is refused while the first holds it."""
    stream = tmp_path / "run.stream"
    with guard_outputs({}, {}, work_dirs={"stream_dir": str(stream)}):
        assert not stream.exists()  # made by the command's first write: a refused run leaves none
        stream.mkdir()
        (stream / "shard_00000.json").write_text("[]")
        with pytest.raises(ValueError, match="stream_dir=.* is being written by another fastrl command"):
            guard_outputs({}, {}, work_dirs={"stream_dir": str(stream)})
    with guard_outputs({}, {}, work_dirs={"stream_dir": str(stream)}):  # released: reused, contents kept
        assert (stream / "shard_00000.json").read_text() == "[]"
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="stream_dir=.*file is a file; give a directory"):
        guard_outputs({}, {}, work_dirs={"stream_dir": str(tmp_path / "file")})


def test_train_drafter_refuses_a_stream_dir_holding_other_files(tmp_path, capsys):
    """A stream replaces and deletes files in its directory: one that holds anything else (an earlier drafter named
    like the stream's own `drafter/`, notes) is refused before any work, and nothing in it is touched."""
    runs = tmp_path / "runs"
    (runs / "drafter").mkdir(parents=True)
    (runs / "drafter" / "drafter.safetensors").write_bytes(b"weights")
    (runs / "notes.txt").write_text("keep me")
    (runs / "optimizer.pt").write_bytes(b"mine")
    args = ["train-drafter", f"output={tmp_path / 'out'}", f"stream_dir={runs}", "num_prompts=1", "eval_prompts=1"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "train_drafter.stream_dir=" in err and "(drafter, notes.txt, optimizer.pt)" in err
    assert (runs / "drafter" / "drafter.safetensors").read_bytes() == b"weights"
    assert (runs / "notes.txt").read_text() == "keep me" and (runs / "optimizer.pt").read_bytes() == b"mine"
    assert not (tmp_path / "out").exists()


def test_a_file_size_limit_is_said_as_a_full_disk_is(tmp_path):
    """EFBIG (``ulimit -f``) reached generate's and train's writers as a traceback."""
    target = tmp_path / "report.json"
    target.write_text("earlier report")
    limit = f"^file too large \\(a file-size limit: ulimit -f\\) writing {target}; it is left as it was$"
    with pytest.raises(ValueError, match=limit):
        with atomic_path(target) as tmp:
            tmp.write_text("half a rep")
            raise OSError(errno.EFBIG, os.strerror(errno.EFBIG))
    assert target.read_text() == "earlier report"


def test_a_symlink_loop_is_said_as_one(tmp_path):
    (tmp_path / "a.json").symlink_to("b.json")
    (tmp_path / "b.json").symlink_to("a.json")
    with pytest.raises(ValueError, match=r"output=.*a.json: a symlink loop \(through b.json\)"):
        guard_outputs({"output": str(tmp_path / "a.json")}, {})
    (tmp_path / "c.json").symlink_to("missing.json")
    with pytest.raises(ValueError, match=r"a dangling symlink \(its target missing.json does not exist\)"):
        guard_outputs({"output": str(tmp_path / "c.json")}, {})


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
@pytest.mark.parametrize("into", ["file", "pipe"])
def test_an_output_that_is_the_commands_own_stdout_is_refused(tmp_path, into, stream):
    """`fastrl generate output=/dev/stdout > res.jsonl` exited 0 with its summary lines over its first records (two
    descriptors on one file), and /dev/stderr into a file lost a record under the progress bar; through a pipe the
    refusal named a /proc directory."""
    import subprocess
    import sys

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt_ids": [5, 6, 7]}\n')
    args = [sys.executable, "-m", "fastrl.cli", "generate", f"prompts={prompts}", f"output=/dev/{stream}"]
    args += ["max_new_tokens=4", "progress=false"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if into == "file":
        files = {name: (tmp_path / f"{name}.txt").open("w") for name in ("stdout", "stderr")}
        with files["stdout"], files["stderr"]:
            done = subprocess.run(args, **files, env=env, timeout=300)
        said = {name: (tmp_path / f"{name}.txt").read_text() for name in files}
    else:
        done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300)
        said = {"stdout": done.stdout, "stderr": done.stderr}
    what = "output" if stream == "stdout" else "error"
    assert done.returncode == 2 and said["stdout"] == ""
    assert said["stderr"].strip() == (
        f"fastrl generate: error: output=/dev/{stream} is this command's standard {what}, where it prints its "
        "progress and summary: name the file itself, or a named FIFO (mkfifo) to stream results to another program"
    )


def test_an_existing_output_the_command_does_not_recognise_is_refused_leaving_nothing(tmp_path):
    """``own``: a file a command rewrites only when it is its own (a run's stats or plot) was overwritten whatever
    it held; an empty or a new file is taken, a refusal leaves no lock file nor directory behind."""
    notes, empty = tmp_path / "notes.txt", tmp_path / "empty.txt"
    notes.write_text("my precious notes")
    empty.write_text("")
    new = str(tmp_path / "sub" / "new.json")
    refuse = {"stats": lambda path: "is not ours", "new": lambda path: "is not ours"}
    with pytest.raises(ValueError, match=r"stats=\S*notes.txt is not ours; it is not overwritten: delete the file or"):
        guard_outputs({"new": new, "stats": str(notes)}, {}, own=refuse)
    assert sorted(os.listdir(tmp_path)) == ["empty.txt", "notes.txt"]
    assert notes.read_text() == "my precious notes"
    with guard_outputs({"new": new, "stats": str(empty)}, {}, own=refuse) as targets:
        assert targets["stats"].path == empty


@pytest.mark.parametrize(
    ("name", "head", "ours"),
    [
        ("plot.png", b"\x89PNG\r\n\x1a\n\x00\x00", True),
        ("plot.PNG", b"\x89PNG\r\n\x1a\n\x00\x00", True),
        ("plot.png", b"my precious notes", False),
        ("plot.pdf", b"%PDF-1.4\n", True),
        ("plot.pdf", b"\x89PNG\r\n\x1a\n", False),
        ("plot.svg", b'<?xml version="1.0"', True),
        ("plot.raw", b"anything: a raw bitmap has no signature", True),
    ],
)
def test_a_plot_is_told_by_the_signature_of_its_format(tmp_path, name, head, ours):
    path = tmp_path / name
    path.write_bytes(head)
    problem = image_file_problem(path)
    assert (problem is None) == ours
    if not ours:
        assert problem.startswith(f"is not a .{path.suffix[1:].lower()} image")
