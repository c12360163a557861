"""The bad-input and fault campaign of issues 25 and 27, run through the real CLI on the bundled model: every case
is a command a new or hostile user would type (or a fault they would cause), the behaviour it must show, what it
did, and a verdict. With --train-faults the worker and driver faults of `run.py` (kill -9 / SIGSTOP of a rollout
worker, SIGINT and resume of `fastrl train`) are run too and added to the table.

    PYTHONPATH=. python recipes/fault_injection/campaign.py [--out runs/campaign] [--train-faults]

Prints the table (case, expected, observed, verdict) and the counts; exits 1 unless every case passed.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from out_dir import fresh_out

from fastrl.assets_path import bundled_drafter_dir, bundled_model_dir


@dataclass
class Case:
    """One campaign row: ``check`` runs the case and returns (observed, passed)."""

    name: str
    expected: str
    check: Callable[[Path], tuple[str, bool]]


def fastrl(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fastrl.cli", *args], capture_output=True, text=True, timeout=timeout)


def first_error(proc: subprocess.CompletedProcess) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    return f"exit {proc.returncode}: " + (lines[-1] if lines else "(no message)")


def one_clear_error(proc: subprocess.CompletedProcess, must_contain: str) -> bool:
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    return proc.returncode == 2 and len(lines) == 1 and must_contain in lines[0] and "Traceback" not in proc.stderr


def prompts_file(d: Path, lines: list[str], name: str = "p.jsonl") -> Path:
    path = d / name
    path.write_text("".join(line + "\n" for line in lines))
    return path


SMALL = ["max_new_tokens=8", "progress=false"]
P = ['{"prompt": "3+4="}', '{"prompt": "12+5="}']


def report_is_prompts(d: Path) -> tuple[str, bool]:
    p = prompts_file(d, P)
    before = p.read_bytes()
    proc = fastrl("check-exact", f"prompts={p}", f"report={p}", "strategy=8_4_32", *SMALL)
    return first_error(proc), one_clear_error(proc, "is the prompts file") and p.read_bytes() == before


def report_is_directory(d: Path) -> tuple[str, bool]:
    proc = fastrl("check-exact", f"prompts={prompts_file(d, P)}", f"report={d}", *SMALL)
    return first_error(proc), one_clear_error(proc, "is a directory")


def export_over_a_model(d: Path) -> tuple[str, bool]:
    victim = d / "victim"
    shutil.copytree(bundled_model_dir(), victim)
    before = {f.name: f.read_bytes() for f in victim.iterdir()}
    proc = fastrl("export-drafter", str(bundled_drafter_dir()), str(victim), "--format", "sglang")
    return first_error(proc), one_clear_error(proc, "not empty") and before == {
        f.name: f.read_bytes() for f in victim.iterdir()
    }


def export_bad_bandit_state(d: Path) -> tuple[str, bool]:
    bad = d / "bad.json"
    bad.write_text('{"config": 1}')
    proc = fastrl("export-drafter", str(bundled_drafter_dir()), str(d / "out"), f"bandit_state={bad}")
    return first_error(proc), one_clear_error(proc, "bandit_state=") and not (d / "out").exists()


def two_writers(d: Path) -> tuple[str, bool]:
    many = prompts_file(d, [json.dumps({"prompt": f"{i}+{i}="}) for i in range(200)], "many.jsonl")
    few = prompts_file(d, P[:1] * 3, "few.jsonl")
    out = d / "out.jsonl"
    cmd = [sys.executable, "-m", "fastrl.cli", "generate", f"prompts={many}", f"output={out}", "max_new_tokens=32"]
    first = subprocess.Popen([*cmd, "progress=false"], stderr=subprocess.PIPE, text=True)
    lock = d / ".out.jsonl.lock"
    deadline = time.monotonic() + 120
    while not lock.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    second = fastrl("generate", f"prompts={few}", f"output={out}", *SMALL)
    first.communicate(timeout=600)
    kept = len(out.read_text().splitlines())
    ok = one_clear_error(second, "is being written by another fastrl command") and first.returncode == 0
    return f"second {first_error(second)}; first exit {first.returncode}, {kept} results kept", ok and kept == 200


def check_exact_default_strategy(d: Path) -> tuple[str, bool]:
    proc = fastrl("check-exact", f"prompts={prompts_file(d, P)}", *SMALL)
    last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else first_error(proc)
    return f"exit {proc.returncode}: {last}", proc.returncode == 0 and "8_4_32" in last


def train_static_composes(d: Path) -> tuple[str, bool]:
    code = (
        "from hydra import compose, initialize_config_dir\n"
        "from hydra.core.config_store import ConfigStore\n"
        "from omegaconf import OmegaConf\n"
        "from fastrl.commands.train_config import TrainConfig\n"
        "from fastrl.commands.train_setup import worker_config\n"
        "from fastrl.adaptive.factory import build_selector\n"
        "from fastrl.config_compose import conf_dir\n"
        "ConfigStore.instance().store(name='train_schema', node=TrainConfig)\n"
        "with initialize_config_dir(config_dir=str(conf_dir() / 'train'), version_base='1.3'):\n"
        f"    c = OmegaConf.to_object(compose('train', ['strategy=static', 'rl.checkpoint_dir={d}']))\n"
        "w = worker_config(c)\n"
        "print(build_selector(w.strategy, bandit=w.bandit, ema=w.ema).strategies[0])\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    out = proc.stdout.strip() or first_error(proc)
    return f"exit {proc.returncode}: strategy {out}", proc.returncode == 0 and out == "5_1_6"


def train_drafter_existing_output(d: Path) -> tuple[str, bool]:
    out = d / "drafter"
    out.mkdir()
    (out / "drafter_config.json").write_text("{}")
    start = time.monotonic()
    proc = fastrl("train-drafter", f"output={out}")
    took = time.monotonic() - start
    ok = one_clear_error(proc, "not empty") and (out / "drafter_config.json").read_text() == "{}"
    return f"{first_error(proc)} (after {took:.0f} s)", ok


def huge_n(d: Path) -> tuple[str, bool]:
    proc = fastrl("generate", f"prompts={prompts_file(d, P)}", f"output={d / 'o.jsonl'}", "n=100000000", timeout=60)
    return first_error(proc), one_clear_error(proc, "generate.n")


def disk_full(d: Path) -> tuple[str, bool]:
    proc = fastrl("generate", f"prompts={prompts_file(d, P)}", "output=/dev/full", *SMALL)
    return first_error(proc), one_clear_error(proc, "no space left writing /dev/full; 0 of 2 results are kept")


def unknown_prompt_key(d: Path) -> tuple[str, bool]:
    p = prompts_file(d, [P[0], '{"prompt": "1+1=", "sed": 4}'])
    proc = fastrl("generate", f"prompts={p}", f"output={d / 'o.jsonl'}", *SMALL)
    return first_error(proc), one_clear_error(proc, f"{p}:2: unknown key 'sed'")


def blank_line_seeds(d: Path) -> tuple[str, bool]:
    seeds = []
    for name, lines in (("plain.jsonl", P), ("gappy.jsonl", [P[0], "", P[1]])):
        out = d / f"{name}.out"
        proc = fastrl("generate", f"prompts={prompts_file(d, lines, name)}", f"output={out}", *SMALL)
        seeds.append([json.loads(x)["seed"] for x in out.read_text().splitlines()] if proc.returncode == 0 else None)
    return f"seeds without blank lines {seeds[0]}, with {seeds[1]}", seeds[0] is not None and seeds[0] == seeds[1]


def bad_model_config(d: Path) -> tuple[str, bool]:
    model = d / "model"
    shutil.copytree(bundled_model_dir(), model)
    config = json.loads((model / "config.json").read_text())
    config["hidden_size"] += 1
    (model / "config.json").write_text(json.dumps(config))
    proc = fastrl("generate", f"model={model}", f"prompts={prompts_file(d, P)}", f"output={d / 'o.jsonl'}", *SMALL)
    return first_error(proc), one_clear_error(proc, "config.json: hidden_size")


def rerun_keeps_stats(d: Path) -> tuple[str, bool]:
    args = [f"prompts={prompts_file(d, P)}", f"output={d / 'o.jsonl'}", f"stats_output={d / 's.json'}"]
    args += [f"plot_output={d / 'p.png'}", "strategy=bandit", *SMALL]
    first = fastrl("generate", *args)
    before = ((d / "s.json").read_bytes(), (d / "p.png").read_bytes())
    second = fastrl("generate", *args)
    same = before == ((d / "s.json").read_bytes(), (d / "p.png").read_bytes())
    rounds = json.loads(before[0])["rounds"]
    return f"exits {first.returncode}, {second.returncode}; {rounds} rounds; unchanged: {same}", same and rounds > 0


def empty_prompts(d: Path) -> tuple[str, bool]:
    proc = fastrl("generate", f"prompts={prompts_file(d, [''])}", f"output={d / 'o.jsonl'}", *SMALL)
    return first_error(proc), one_clear_error(proc, "has no prompt lines") and not (d / "o.jsonl").exists()


CASES = [
    Case("27.1 check-exact report=PROMPTS", "one error; prompts unchanged", report_is_prompts),
    Case("27.1 check-exact report=DIR", "one error before the run", report_is_directory),
    Case("27.2 export-drafter OUT=a model dir", "one error; model files unchanged", export_over_a_model),
    Case("27.2 export-drafter bandit_state=bad", "one error; nothing written", export_bad_bandit_state),
    Case("27.4 two generate, same output", "second refused; first's 200 kept", two_writers),
    Case("27.5 check-exact default strategy", "8_4_32 parses, exit 0", check_exact_default_strategy),
    Case("27.5 train strategy=static", "composes to 5_1_6", train_static_composes),
    Case("27.6 train-drafter output=EXISTING", "one error before any work", train_drafter_existing_output),
    Case("27.7 generate n=100000000", "one error naming generate.n", huge_n),
    Case("27.8 generate to a full disk", "one line: N of M kept, run again", disk_full),
    Case('27.10 prompts line with "sed"', "one error naming key and file:line", unknown_prompt_key),
    Case("27.10 blank lines in prompts", "same seeds as without", blank_line_seeds),
    Case("27.10 hidden_size % heads != 0", "one error naming file and key", bad_model_config),
    Case("25 finished generate re-run", "stats and plot byte-identical", rerun_keeps_stats),
    Case("25 empty prompts file", "one error; no output", empty_prompts),
]


def train_fault_rows(out: Path) -> list[tuple[str, str, str, bool]]:
    """Run run.py (the worker and driver faults of `fastrl train`) and turn its per-fault lines into rows."""
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("run.py")), "--out", str(out)], text=True,
                          capture_output=True, timeout=3600)  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    (out / "run_py.txt").write_text(proc.stdout + proc.stderr)
    rows = []
    for m in re.finditer(r"^\s+(SIG\w+)\s+(mid-rollout|between rollouts)\s+step (\d+): (\w+)", proc.stdout, re.M):
        signal, phase, step, verdict = m.groups()
        rows.append(
            (f"27.9 {signal} {phase}, step {step}", "replaced; metrics identical", verdict, verdict == "survived")
        )
    if not rows:
        rows.append(("27.9 train faults", "run.py completes", first_error(proc), False))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("runs/campaign"))
    parser.add_argument("--train-faults", action="store_true", help="also run run.py (about 7 minutes on 2 cores)")
    args = parser.parse_args(argv)
    try:
        fresh_out(args.out, "campaign.py")  # an earlier campaign.py campaign's files go, nobody else's
    except ValueError as err:
        parser.error(str(err))
    rows = []
    for i, case in enumerate(CASES):
        work = args.out / f"case{i:02d}"
        work.mkdir(parents=True)
        observed, ok = case.check(work.resolve())
        rows.append((case.name, case.expected, observed, ok))
        print(f"{'pass' if ok else 'FAIL'}  {case.name}", file=sys.stderr, flush=True)
    if args.train_faults:
        rows += train_fault_rows(args.out / "train_faults")
    print("| case | expected | observed | verdict |\n| --- | --- | --- | --- |")
    for name, expected, observed, ok in rows:
        print(f"| {name} | {expected} | {observed.replace('|', '/')} | {'pass' if ok else 'FAIL'} |")
    passed = sum(ok for *_, ok in rows)
    print(f"\ncases: {len(rows)}, passed: {passed}, failed: {len(rows) - passed}")
    return 0 if passed == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
