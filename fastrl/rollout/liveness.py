"""Liveness of rollout worker actors: asynchronous health pings and the per-round deadline.

A worker is hung when, while it holds work, it does not answer a health ping within ``round_timeout_s`` (a stopped or
wedged process), or it answers that no engine step has ended (or, in a co-training call, no drafter step has started)
for longer than ``round_timeout_s`` (a stuck step).
A worker whose stepping loop failed (``health().ok`` False) is reported too: it can serve no more.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import ray
from ray.exceptions import RayActorError, RayError

from fastrl.rollout.worker_stats import WorkerHealth


@dataclass
class LivenessPolicy:
    """round_timeout_s: the per-round deadline (seconds); check_interval_s: how often busy workers are pinged."""

    round_timeout_s: float
    check_interval_s: float


@dataclass
class Verdict:
    """A worker found unable to serve, and why (one line for the log); ``hung`` False: it answers, but its stepping
    loop failed."""

    worker_id: str
    reason: str
    hung: bool = True


@dataclass
class LivenessMonitor:
    """Pings the workers it is given at most every ``check_interval_s`` and returns those past the deadline.
    Never blocks: answers are collected with ``ray.wait(timeout=0)``."""

    policy: LivenessPolicy
    pings: dict[str, tuple[ray.ObjectRef, float]] = field(default_factory=dict)
    last_check: float = field(default_factory=time.monotonic)

    def poll(self, busy: dict[str, ray.actor.ActorHandle]) -> list[Verdict]:
        """``busy``: worker id -> actor of every worker that holds work now. Returns the hung or failed ones."""
        now = time.monotonic()
        for wid in [w for w in self.pings if w not in busy]:
            del self.pings[wid]  # no work left there: its answer no longer matters
        verdicts = []
        for wid, (ref, sent) in list(self.pings.items()):
            done, _ = ray.wait([ref], timeout=0)
            if done:
                del self.pings[wid]
                verdict = _judge(wid, ref, self.policy.round_timeout_s)
                if verdict is not None:
                    verdicts.append(verdict)
            elif now - sent > self.policy.round_timeout_s:
                del self.pings[wid]
                verdicts.append(Verdict(wid, f"no answer to a health check in {self.policy.round_timeout_s:g} s"))
        if now - self.last_check >= self.policy.check_interval_s:
            self.last_check = now
            for wid, actor in busy.items():
                if wid not in self.pings and wid not in {v.worker_id for v in verdicts}:
                    self.pings[wid] = (actor.health.remote(), now)
        return verdicts

    def forget(self, worker_id: str) -> None:
        """Stop tracking a worker (it was replaced)."""
        self.pings.pop(worker_id, None)


def _judge(worker_id: str, ref: ray.ObjectRef, deadline: float) -> Verdict | None:
    try:
        health: WorkerHealth = ray.get(ref, timeout=0)
    except RayActorError:
        return None  # died: its generation calls fail too, and the rollout handles that
    except RayError as err:
        return Verdict(worker_id, f"health check failed: {type(err).__name__}")
    if not health.ok:
        return Verdict(worker_id, f"stepping loop failed: {health.error}", hung=False)
    if health.stalled_s > deadline:
        return Verdict(worker_id, f"no decode round finished in {health.stalled_s:.0f} s (deadline {deadline:g} s)")
    if health.training_stalled_s > deadline:
        stalled = health.training_stalled_s
        return Verdict(worker_id, f"no co-training step started in {stalled:.0f} s (deadline {deadline:g} s)")
    return None


def probe(actors: dict[str, ray.actor.ActorHandle], timeout_s: float) -> dict[str, str]:
    """Ping every worker at once and wait up to ``timeout_s``: worker id -> why it cannot serve, for the dead, the
    unresponsive and the failed (between rollouts, where no work is pending)."""
    refs = {wid: actor.health.remote() for wid, actor in actors.items()}
    ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
    problems = {}
    for wid, ref in refs.items():
        try:
            health: WorkerHealth = ray.get(ref, timeout=0)
        except RayActorError as err:
            problems[wid] = f"died ({type(err).__name__})"
            continue
        except RayError:
            problems[wid] = f"no answer to a health check in {timeout_s:g} s"
            continue
        if not health.ok:
            problems[wid] = f"stepping loop failed: {health.error}"
    return problems
