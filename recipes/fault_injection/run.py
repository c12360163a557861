"""Fault injection for `fastrl train` on a local Ray: kill -9 and SIGSTOP a rollout worker mid-rollout and between
rollouts, SIGINT the driver and resume from its last checkpoint; every run's metrics must equal an undisturbed
run's (the token-determined ones: rewards, lengths, losses, gradient norms; not times or accept lengths).

    PYTHONPATH=. python recipes/fault_injection/run.py [--steps 5] [--out runs/faults]

Prints each fault tried and whether it was survived (the run finished, the worker was replaced, the metrics are
identical), then "faults tried: N, survived: M"; exits 1 unless every fault was survived. About 6 minutes on a
2-core CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from out_dir import fresh_out

from fastrl.rollout.listeners import listeners, process_tree

EXACT_KEYS = (
    "step",
    "policy_version",
    "reward_mean",
    "reward_std",
    "accuracy",
    "accuracy_by_bucket",
    "response_len_mean",
    "response_len_max",
    "response_tokens",
    "truncated_fraction",
    "loss",
    "pg_loss",
    "kl",
    "clip_fraction",
    "grad_norm",
)
WORKER_MARK = b"RolloutWorkerActor"
TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


@dataclass
class Fault:
    """One injected fault: the signal, when (during step `step`'s rollout or after it), and what came of it."""

    signal: str
    phase: str  # "mid-rollout" | "between rollouts"
    step: int
    pid: int | None = None
    survived: bool = False


def train_command(run_dir: Path, steps: int, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "fastrl.cli",
        "train",
        f"rl.steps={steps}",
        "rl.prompts_per_step=8",
        "rl.max_new_tokens=256",
        "rl.checkpoint_every=1",
        "rollout.round_timeout_s=6",
        "logger=none",
        "report=false",
        f"hydra.run.dir={run_dir}",
        *extra,
    ]


def metrics(run_dir: Path) -> list[dict]:
    file = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in file.read_text().splitlines()] if file.exists() else []


def exact(rows: list[dict]) -> list[dict]:
    return [{k: r[k] for k in EXACT_KEYS} for r in rows]


def worker_pids(driver: int) -> list[int]:
    pids = []
    for pid in sorted(process_tree(driver)):
        try:
            if WORKER_MARK in Path(f"/proc/{pid}/cmdline").read_bytes():
                pids.append(pid)
        except OSError:
            continue
    return pids


def cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) * TICK_S


def busy(pids: list[int], window_s: float = 0.3) -> list[int]:
    """The workers that used CPU in the next ``window_s`` seconds, busiest first."""
    before = {p: cpu_seconds(p) for p in pids}
    time.sleep(window_s)
    used = {p: cpu_seconds(p) - before[p] for p in pids}
    return sorted((p for p in pids if used[p] > 0.05 * window_s), key=lambda p: -used[p])


def wait_for(condition, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise TimeoutError(f"timed out waiting for {what}")


def inject(proc: subprocess.Popen, run_dir: Path, fault: Fault) -> None:
    """Wait for the fault's moment in step ``fault.step`` and send its signal to one worker."""
    log = run_dir.with_suffix(".log")
    wait_for(lambda: "grpo:" in log.read_text() or proc.poll() is not None, 600, "training to start")
    wait_for(lambda: len(metrics(run_dir)) >= fault.step or proc.poll() is not None, 600, f"step {fault.step}")
    if proc.poll() is not None:
        return
    workers = wait_for(lambda: worker_pids(proc.pid), 120, "rollout workers")
    active = wait_for(lambda: busy(worker_pids(proc.pid)), 120, "a rollout to start")
    if fault.phase == "mid-rollout":
        victim = active[0]
    else:  # the rollout is over when every worker has been idle for a while (the trainer is updating the policy)
        wait_for(lambda: not busy(worker_pids(proc.pid), 0.6), 120, "the rollout to end")
        victim = worker_pids(proc.pid)[0] if worker_pids(proc.pid) else workers[0]
    fault.pid = victim
    os.kill(victim, getattr(signal, fault.signal))
    print(f"  sent {fault.signal} to worker pid {victim} {fault.phase} (step {fault.step})", flush=True)


def launch(run_dir: Path, steps: int, *extra: str) -> subprocess.Popen:
    """Start `fastrl train`; its output goes to <run_dir>.log."""
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    log = run_dir.with_suffix(".log").open("w")
    return subprocess.Popen(train_command(run_dir, steps, *extra), stdout=log, stderr=subprocess.STDOUT)


def run_with_faults(out: Path, steps: int, faults: list[Fault]) -> list[dict]:
    run_dir = out / "faulted"
    proc = launch(run_dir, steps)
    try:
        for fault in faults:
            inject(proc, run_dir, fault)
        proc.wait(timeout=900)
    finally:
        proc.kill()
    text = run_dir.with_suffix(".log").read_text()
    if proc.returncode != 0:
        print(text[-3000:], file=sys.stderr)
    replaced = text.count("replaced by")
    print(f"  run exit code {proc.returncode}; workers replaced: {replaced}", flush=True)
    ok = proc.returncode == 0 and replaced >= len(faults)
    for fault in faults:
        fault.survived = ok and not Path(f"/proc/{fault.pid}").exists()
    return metrics(run_dir)


def run_interrupted(out: Path, steps: int, fault: Fault) -> list[dict]:
    """SIGINT the driver during step ``fault.step``'s rollout, check that Ray went with it, resume."""
    first, second = out / "interrupted", out / "resumed"
    proc = launch(first, steps)
    try:
        log = first.with_suffix(".log")
        wait_for(lambda: "grpo:" in log.read_text(), 600, "training to start")
        wait_for(lambda: len(metrics(first)) >= fault.step, 600, f"step {fault.step}")
        wait_for(lambda: busy(worker_pids(proc.pid)), 120, "a rollout to start")
        tree = process_tree(proc.pid)
        proc.send_signal(signal.SIGINT)
        fault.pid = proc.pid
        print(f"  sent SIGINT to the driver pid {proc.pid} mid-rollout (step {fault.step})", flush=True)
        proc.wait(timeout=120)
    finally:
        proc.kill()
    time.sleep(2)
    left = [p for p in tree if Path(f"/proc/{p}").exists()]
    still_listening = listeners(set(left))
    print(f"  driver exit code {proc.returncode}; processes left: {len(left)}; listeners left: {len(still_listening)}")
    # the latest complete checkpoint (the signal may land while the next one is still being written)
    done = max((int(c.name[5:]) for c in (first / "checkpoints").glob("step_*") if c.name[5:].isdigit()), default=0)
    checkpoint = first / "checkpoints" / f"step_{done:06d}"
    resumed = launch(second, steps, f"resume={checkpoint}")
    resumed.wait(timeout=900)
    print(f"  resumed from {checkpoint.name}: exit code {resumed.returncode}", flush=True)
    fault.survived = resumed.returncode == 0 and not still_listening
    return metrics(first)[:done] + metrics(second)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("runs/faults"))
    args = parser.parse_args(argv)
    try:
        fresh_out(args.out, "run.py")  # an earlier run.py campaign's files go, nobody else's
    except ValueError as err:
        parser.error(str(err))
    print("undisturbed run ...", flush=True)
    if launch(args.out / "baseline", args.steps).wait() != 0:
        raise SystemExit(f"the undisturbed run failed; see {args.out / 'baseline.log'}")
    baseline = exact(metrics(args.out / "baseline"))
    worker_faults = [
        Fault("SIGKILL", "mid-rollout", 0),
        Fault("SIGKILL", "between rollouts", 1),
        Fault("SIGSTOP", "mid-rollout", 2),
        Fault("SIGSTOP", "between rollouts", 3),
    ]
    print("worker faults ...", flush=True)
    faulted = exact(run_with_faults(args.out, args.steps, worker_faults))
    print("driver interrupt and resume ...", flush=True)
    interrupt = Fault("SIGINT", "mid-rollout", 2)
    resumed = exact(run_interrupted(args.out, args.steps, interrupt))
    for run, name, faults in ((faulted, "worker faults", worker_faults), (resumed, "interrupt + resume", [interrupt])):
        same = run == baseline
        print(f"{name}: {len(run)} steps, metrics identical to the undisturbed run: {same}")
        for fault in faults:
            fault.survived = fault.survived and same
    faults = [*worker_faults, interrupt]
    for f in faults:
        print(f"  {f.signal:8s} {f.phase:17s} step {f.step}: {'survived' if f.survived else 'FAILED'}")
    survived = sum(f.survived for f in faults)
    print(f"faults tried: {len(faults)}, survived: {survived}")
    return 0 if survived == len(faults) else 1


if __name__ == "__main__":
    sys.exit(main())
