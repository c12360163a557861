"""RolloutBackend over Ray worker actors: balanced dispatch, co-training in the tail, versioned weight pushes,
recovery from dead workers."""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import random
import time
from collections.abc import Callable
from typing import Concatenate, ParamSpec, TypeVar

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayError, RayTaskError
from torch import Tensor

from fastrl.rollout.cluster import ensure_ray, shutdown_ray
from fastrl.rollout.dispatch import AffinitySnapshot, PromptAffinity, check_request_ids, with_seeds
from fastrl.rollout.drafter_round import DrafterAtBoundary, DrafterRounds
from fastrl.rollout.errors import short_error
from fastrl.rollout.liveness import LivenessMonitor, LivenessPolicy, probe
from fastrl.rollout.manager_config import RolloutManagerConfig, check_fit
from fastrl.rollout.ray_worker import await_started, start_worker
from fastrl.rollout.rollout_run import RolloutRun, WorkerHandle, adopt_replacements, count_slices, require_ray
from fastrl.rollout.types import DrafterTrainingStats, RolloutBatch, RolloutRequest, RoundRecord, WorkerReplacement
from fastrl.rollout.worker_cotrain import CotrainState
from fastrl.rollout.worker_loss import log_loss, loss_record
from fastrl.rollout.worker_stats import WorkerStats
from fastrl.speculative.history import HistoryState, merge_history_states

LOG = logging.getLogger("fastrl.rollout")

P = ParamSpec("P")
R = TypeVar("R")
Manager = TypeVar("Manager", bound="RayRolloutManager")


def _needs_ray(method: Callable[Concatenate[Manager, P], R]) -> Callable[Concatenate[Manager, P], R]:
    """An entry point that calls Ray: RuntimeError first when Ray was shut down under the manager (any Ray call
    would otherwise start a fresh local Ray, where none of its workers exist)."""

    @functools.wraps(method)
    def checked(self: Manager, *args: P.args, **kwargs: P.kwargs) -> R:
        if self.closed:
            raise RuntimeError("this RayRolloutManager was shut down (shutdown()): start a new one")
        require_ray()
        return method(self, *args, **kwargs)

    return checked


class RayRolloutManager:
    """N rollout worker actors behind the RolloutBackend interface.

    ``generate`` spreads the batch (groups kept together, balanced by max_new_tokens) and returns results in request
    order. Workers whose share is done while others run the tail train the drafter in short slices; on the
    ``steps`` schedule every worker then takes the updates the tail left undone (fastrl.cotrain.schedule); the
    copies trained this rollout are averaged (weighted by steps) into drafter version v + 1, pushed to every worker.
    A worker lost mid-rollout (dead; hung: no round in ``round_timeout_s``; failed: its stepping loop raised; the
    last two killed) or before a rollout or push is replaced at once (``restart_failed_workers``) at the current
    weights and selector state; its unfinished requests re-run. Each loss is logged (``fastrl.rollout``) and reported
    in the next ``RolloutBatch.replacements``.

    Weight pushes are all or nothing (``_push``): the manager records a version (and keeps its weights for
    replacements) only once every live worker has installed it, so replacements always start from weights the
    workers accepted. Every public method that calls Ray raises one RuntimeError when Ray was shut down under it.
    """

    def __init__(self, config: RolloutManagerConfig) -> None:
        self.config = config
        self.closed = False  # set by shutdown()
        config.worker.check_files()
        self._owns_ray = ensure_ray(config.ray_address or None, config.ray_num_cpus)
        self._spawned = 0
        self.workers: list[WorkerHandle] = []
        try:
            check_fit(config.num_workers, config.worker.num_cpus, config.worker.num_gpus, ray.cluster_resources())
            self.workers = [self._spawn(i) for i in range(config.num_workers)]
            first = await_started(self.workers, self._spawn, config.worker_start_timeout_s, LOG)
        except (RayError, ValueError) as err:
            self.shutdown()
            if isinstance(err, ValueError):
                raise
            waited = (
                f" within worker_start_timeout_s={config.worker_start_timeout_s:g} s (a model that loads slower "
                "needs more)"
                if isinstance(err, GetTimeoutError)
                else ""
            )
            raise RuntimeError(f"rollout workers failed to start{waited}: {short_error(err)}") from None
        self.policy_version = first.policy_version
        self.drafter_version = first.drafter_version
        self.replaced_workers = 0
        self.rollouts = 0  # rollouts run so far: the index of the next one
        self._replacements: list[WorkerReplacement] = []  # since the last RolloutBatch
        self._policy_ref: ray.ObjectRef | None = None
        self._drafter_ref: ray.ObjectRef | None = None
        self._seed_rng = random.Random(config.seed)
        self._slice_ids = itertools.count(1)
        self._affinity = PromptAffinity()  # prompt -> worker slot that served it last (cross-step history)
        self._affinity_at_boundary: AffinitySnapshot | None = None  # the table at the last policy push (None: now)
        self._selector_states: dict[str, dict] = {}  # worker id -> its strategy-selector state after the last rollout
        self._liveness = LivenessPolicy(config.round_timeout_s, config.liveness_interval_s)
        self._rounds = DrafterRounds(
            self._call_all, self._gather_training, lambda: self.drafter_version, self._push_merged_drafter
        )
        self._boundary_drafter = DrafterAtBoundary()

    # ---- RolloutBackend ---------------------------------------------------------------------------------------
    @_needs_ray
    def generate(self, requests: list[RolloutRequest]) -> RolloutBatch:
        """Generate every request; results in request order, with per-worker timing, rounds and co-training."""
        start = time.perf_counter()
        if not requests:
            return RolloutBatch([], 0.0, 0.0, [], [], DrafterTrainingStats(), self.drafter_version)
        check_request_ids(requests)
        requests = with_seeds(requests, self._seed_rng)
        self._check_workers()
        cotrain, slice_s = self.config.cotrain_in_tail and self.config.worker.cotrain, self.config.worker.slice_seconds
        workers, ids, liveness, replace = self._alive(), self._slice_ids, self._liveness, self._replace_in_run
        calls = self.config.worker.max_concurrent_calls
        run = RolloutRun(requests, workers, cotrain, slice_s, ids, liveness, replace, LOG, calls, self._affinity)
        try:
            outcome = run.run()
        except BaseException:  # a refusal, no worker left, Ctrl-C: the surviving workers' requests end here
            try:
                self._abort_everywhere(run.workers)
            except Exception as err:  # the rollout's own error is the one to raise
                LOG.warning("aborting the failed rollout's requests failed: %s", short_error(err))
            raise
        finally:
            self._adopt(run.workers)
        rounds = self._take_rounds()
        drafter, timings = DrafterTrainingStats(), outcome.timings
        if self.config.worker.cotrain:
            finish = [(w, w.actor.finish_drafter_round.remote()) for w in self._alive()]
            self._rounds.start(finish, outcome.slices, outcome.running_slices)
            if not self.config.overlap_drafter_round:  # the tail's slices that outran it count for their workers
                drafter = self._rounds.close()
                timings = count_slices(timings, self._rounds.late_slices)
        self._remember_selector_states()
        self._replace_dead()
        self.rollouts += 1
        replacements, self._replacements = self._replacements, []
        wall, tail, retried = time.perf_counter() - start, outcome.tail_time_s, outcome.retried_requests
        version, lost = self.drafter_version, replacements
        return RolloutBatch(outcome.results, wall, tail, timings, rounds, drafter, version, retried, lost)

    @_needs_ray
    def update_policy(self, version: int, state: dict[str, Tensor]) -> None:
        """Put ``state`` in the object store once and install it as ``version`` on every worker; a push a worker
        refuses (ValueError) leaves every worker, and ``policy_version``, at the last accepted weights (``_push``)."""
        self._check_workers()
        ref = self._push("policy", "update_policy", int(version), self.policy_version, state)
        self._policy_ref, self.policy_version = ref, int(version)
        self._boundary_drafter.mark()  # a step boundary: what checkpoints hold until the next push
        self._affinity_at_boundary = self._affinity.snapshot()
        self._replace_dead()

    @_needs_ray
    def drafter_state(self) -> tuple[int, dict[str, Tensor]]:
        """The drafter version and (CPU float32) weights (with the draft vocabulary, see EngineWorker) at the last
        step boundary (the last policy push: ``DrafterAtBoundary``), for checkpoints; {} when the workers run without
        a drafter."""
        self._await_ready()
        return self._boundary_drafter.state(self._live_drafter_state)

    @_needs_ray
    def load_drafter_state(self, version: int, state: dict[str, Tensor]) -> None:
        """Install drafter weights as ``version`` on every worker (resume)."""
        self._await_ready()
        self._push_drafter(int(version), state)

    @_needs_ray
    def selector_state(self) -> dict:
        """Each worker's strategy-selector state: ``{"workers": [state, ...]}`` in worker order (a lost worker is
        replaced first, so every slot is there), and ``"affinity"``: which worker served each prompt, as the last
        finished rollout left it (a resume sends a repeated prompt where the uninterrupted run would)."""
        affinity = self._affinity.state(self._affinity_at_boundary)
        return {"workers": self._state_by_slot("selector_state"), "affinity": affinity}

    def check_selector_state(self, state: dict) -> None:
        self.config.worker.checked_selector_states(state)

    @_needs_ray
    def load_selector_state(self, state: dict) -> None:
        """Worker i loads ``state["workers"][i % n]`` (a resumed run may have a different worker count)."""
        states = self.config.worker.checked_selector_states(state)
        self._await_ready()
        if "affinity" in state:  # absent from checkpoints written before it was kept
            self._affinity.load_state(state["affinity"])
            self._affinity.fold(len(self._alive()))  # fewer workers: slot j's history is slot j % n's now
            self._affinity_at_boundary = self._affinity.snapshot()
        refs = [(w, w.actor.load_selector_state.remote(states[i % len(states)])) for i, w in enumerate(self._alive())]
        self._gather(refs)
        self._selector_states = {w.worker_id: states[i % len(states)] for i, w in enumerate(self._alive())}

    @_needs_ray
    def history_state(self) -> list[HistoryState | None]:
        """Each worker's history index (prompts and kept responses), in slot order; None without one."""
        return self._state_by_slot("history_state")

    @_needs_ray
    def load_history_state(self, states: list[HistoryState | None]) -> None:
        """Worker slot i restores ``states[i]`` (the prompt affinity sends a repeated prompt back to its slot); slots
        beyond the checkpoint's start with an empty index. A checkpoint of more slots than this run's n workers
        folds slot j into slot j % n (``merge_history_states``; the affinity is folded alike), none dropped."""
        self._await_ready()
        alive = self._alive()
        if len(states) > len(alive):
            folded = [[s for s in states[i :: len(alive)] if s is not None] for i in range(len(alive))]
            states = [merge_history_states(held) if held else None for held in folded]
        self._gather([(w, w.actor.load_history_state.remote(st)) for w, st in zip(alive, states, strict=False)])

    @_needs_ray
    def cotrain_state(self) -> list[CotrainState]:
        """Each worker's co-training state (buffer, optimiser, step counters), in slot order ([] when off)."""
        return [s for s in self._state_by_slot("cotrain_state") if s is not None]

    @_needs_ray
    def load_cotrain_state(self, states: list[CotrainState]) -> None:
        """Worker i restores ``states[i]``; ValueError when the counts differ (exactness needs the same split). A run
        without co-training (``drafter=frozen``) has nothing to restore them into and leaves them."""
        if not self.config.worker.cotrain:
            return
        self._await_ready()
        alive = self._alive()
        if len(states) != len(alive):
            raise ValueError(
                f"the checkpoint holds co-training state for {len(states)} workers, this run has "
                f"rollout.num_workers={len(alive)}: resume with the checkpoint's rollout.num_workers"
            )
        self._gather([(w, w.actor.load_cotrain_state.remote(st)) for w, st in zip(alive, states, strict=True)])

    def shutdown(self) -> None:
        """Kill every worker actor (and Ray itself when this manager started it); with Ray already shut down under
        it there is nothing left to kill (a Ray call would start a fresh Ray)."""
        for w in self.workers if ray.is_initialized() else []:
            with contextlib.suppress(RayActorError, ValueError):
                ray.kill(w.actor)
        self.workers = []
        self.closed = True  # every later call says so, not that Ray or the workers went away
        if self._owns_ray and ray.is_initialized():
            shutdown_ray()
            self._owns_ray = False

    # ---- reports ----------------------------------------------------------------------------------------------
    @_needs_ray
    def worker_stats(self) -> list[WorkerStats]:
        """Every live worker's stats (versions, requests served, rounds, buffer, co-training steps)."""
        self._await_ready()
        return self._call_all("stats")

    # ---- internals --------------------------------------------------------------------------------------------
    def _spawn(self, slot: int) -> WorkerHandle:
        worker_id = f"worker-{self._spawned}"
        self._spawned += 1
        return WorkerHandle(worker_id, start_worker(worker_id, self.config.worker, slot), slot=slot)

    def _alive(self) -> list[WorkerHandle]:
        alive = [w for w in self.workers if w.alive]
        if not alive:
            raise RuntimeError("no rollout worker is alive")
        return alive

    def _gather(self, calls: list[tuple[WorkerHandle, ray.ObjectRef]]) -> list:
        """Results of per-worker calls, in order, skipping (and marking) the dead and the hung (killed); a call that
        raised raises its error, once every worker is judged."""
        return [answer for _, answer in self._answered(calls)]

    def _answered(self, calls: list[tuple[WorkerHandle, ray.ObjectRef]]) -> list[tuple[WorkerHandle, object]]:
        """``_gather``'s results as (worker, result) pairs: whose each result is, whatever was marked meanwhile."""
        answers = self._settle(calls)
        for _, answer in answers:
            if isinstance(answer, RayError):
                raise answer
        return answers

    def _settle(
        self, calls: list[tuple[WorkerHandle, ray.ObjectRef]], during: str = ""
    ) -> list[tuple[WorkerHandle, object]]:
        """Wait up to ``round_timeout_s`` for per-worker calls and judge each worker: one that died is marked lost
        (``died``, or ``died during <during>``), one that did not answer is killed as hung; the others' answers, in
        call order, as (worker, result), a call that raised as (worker, its RayError)."""
        refs = [ref for _, ref in calls]
        ray.wait(refs, num_returns=len(refs), timeout=self.config.round_timeout_s)
        answers: list[tuple[WorkerHandle, object]] = []
        for worker, ref in calls:
            try:
                answers.append((worker, ray.get(ref, timeout=0)))
            except RayActorError:
                if worker.alive:  # else killed as hung: its reason stays
                    worker.alive, worker.lost_reason = False, f"died during {during}" if during else "died"
            except GetTimeoutError:
                to = f" to {during}" if during else ""
                self._kill_hung(worker, f"no answer{to} in {self.config.round_timeout_s:g} s")
            except RayError as err:
                answers.append((worker, err))
        return answers

    def _gather_training(self, calls: list[tuple[WorkerHandle, ray.ObjectRef]]) -> list[tuple[WorkerHandle, object]]:
        """Results of co-training calls, in order, as (worker, result) pairs. Such a call lasts as long as its drafter
        steps do (many updates per rollout on a slow CPU run for minutes), so a worker is judged by its progress, not
        by one deadline for the whole call: at every liveness interval it is pinged, and killed as hung when it does
        not answer, or has started no drafter step, within ``round_timeout_s``; the dead are skipped. A worker killed
        as hung just as its call ended is not alive and still has its answer here."""
        monitor = LivenessMonitor(self._liveness)
        pending = {ref: worker for worker, ref in calls}
        while pending:
            require_ray()
            done, _ = ray.wait(list(pending), num_returns=len(pending), timeout=self.config.liveness_interval_s)
            for ref in done:
                del pending[ref]
            by_id = {w.worker_id: w for w in pending.values()}
            for verdict in monitor.poll({wid: w.actor for wid, w in by_id.items()}):
                self._kill_hung(by_id[verdict.worker_id], verdict.reason)
                pending = {ref: w for ref, w in pending.items() if w.worker_id != verdict.worker_id}
        return self._answered(calls)

    def _kill_hung(self, worker: WorkerHandle, reason: str) -> None:
        self._kill(worker, f"hung ({reason})", f"is hung ({reason})")

    def _kill(self, worker: WorkerHandle, reason: str, logged: str | None = None) -> None:
        """Kill a worker that cannot go on serving (``reason``, its ``lost_reason``; ``logged``, what the log says of
        it, the reason by default), so that the next call replaces it."""
        LOG.warning("rollout worker %s %s: killed", worker.worker_id, logged or reason)
        ray.kill(worker.actor, no_restart=True)
        worker.alive, worker.lost_reason = False, reason

    def _abort_everywhere(self, workers: list[WorkerHandle]) -> None:
        """Abort every request on the live ``workers`` and wait (up to ``round_timeout_s``) until none runs: a rollout
        that raised leaves no request decoding into the next (a worker refuses a policy push while one does)."""
        during = "the failed rollout's abort"
        self._settle([(w, w.actor.abort.remote(None)) for w in workers if w.alive], during)
        deadline = time.monotonic() + self.config.round_timeout_s
        while time.monotonic() < deadline:
            answers = self._settle([(w, w.actor.stats.remote()) for w in workers if w.alive], during)
            if all(isinstance(s, RayError) or s.running_requests == 0 for _, s in answers):
                return
            time.sleep(0.01)

    def _state_by_slot(self, method: str) -> list:
        """Every live worker's answer to ``method`` (a state for checkpoints), one per worker in slot order. A worker
        lost during the call is replaced (it takes its last selector state and the current weights, as between
        rollouts) and everyone is asked again, so that the answers stay with their slots and are the states the run
        goes on from; without replacement the lost worker's slot is gone from the run and from the answers."""
        for _ in range(len(self.workers) + 1):
            self._check_workers()
            alive = self._alive()
            answers = self._gather([(w, getattr(w.actor, method).remote()) for w in alive])
            if all(w.alive for w in alive):
                return answers
        raise RuntimeError(f"rollout workers kept failing while answering {method} ({len(self.workers) + 1} tries)")

    def _call_all(self, method: str, *args: object) -> list:
        return self._gather([(w, getattr(w.actor, method).remote(*args)) for w in self._alive()])

    def _take_rounds(self) -> list[RoundRecord]:
        return [r for rounds in self._call_all("take_rounds") for r in rounds]

    @_needs_ray
    def finish_rollout(self) -> tuple[DrafterTrainingStats, int]:
        """The last rollout's co-training stats and the drafter version after it, finishing it first when
        ``overlap_drafter_round`` left it running (any other call finishes it too, before it acts)."""
        self._rounds.close()
        return self._rounds.last

    def _push_merged_drafter(self, version: int, state: dict[str, Tensor]) -> None:
        """Install a drafter round's merged version, the boundary's drafter kept first (``DrafterAtBoundary``)."""
        self._boundary_drafter.before_change(self._live_drafter_state)
        self._push_drafter(version, state)

    def _live_drafter_state(self) -> tuple[int, dict[str, Tensor]]:
        """The drafter the workers run now (every worker runs the same version: the first one's)."""
        return self._call_all("drafter_state")[0]

    def _push_drafter(self, version: int, state: dict[str, Tensor]) -> None:
        """Install drafter weights as ``version`` on every worker; all or nothing, as ``_push``."""
        self._drafter_ref = self._push("drafter", "update_drafter", version, self.drafter_version, state)
        self.drafter_version = version

    def _push(self, what: str, method: str, version: int, current: int, state: dict[str, Tensor]) -> ray.ObjectRef:
        """Put ``state`` (``what`` weights) in the object store and install it as ``version`` on every live worker
        (``method``), replacing ``current``; the caller records the returned ref and version only when this returns,
        so a replacement always starts from weights that the workers accepted.

        All or nothing, so that every worker ends on one version. Workers that die or hang during the push are
        lost as in any call (replaced later at the weights then recorded); so is a worker whose push failed with any
        error but a refusal (an OOM or RuntimeError while loading, past its checks, which may leave a partial copy;
        Ray's own errors, such as fetching the pushed object): it is killed. If every live worker that answered took
        the push, it stands. If any refused it (its checks raised ValueError), it is refused as a whole: the workers
        that took it are killed (replaced by the next call at the ``current`` weights), and a ValueError names the
        refusing worker and its reason. A push that no worker answered is refused too (RuntimeError): none installed
        it."""
        ref = ray.put(state)
        calls = [(w, getattr(w.actor, method).remote(version, ref)) for w in self._alive()]
        took, refused = [], []
        for worker, answer in self._settle(calls, f"the {what} push"):
            if not isinstance(answer, RayError):
                took.append(worker)
            elif is_refusal(answer):
                refused.append((worker, short_error(answer)))
            else:  # it failed past its checks (a partial copy, maybe) or could not run: replaced, not refusing
                self._kill(worker, f"failed the {what} push ({short_error(answer)})")
        if refused:
            self._revert(took, f"{what} version {version}")
            (first, reason), others = refused[0], len(refused) - 1
            also = f" (and {others} more)" if others else ""
            raise ValueError(
                f"{what} version {version} refused by rollout worker {first.worker_id}{also}: {reason}; "
                f"every worker keeps {what} version {current}"
            )
        if not took:
            raise RuntimeError(
                f"no rollout worker answered the push of {what} version {version} (all lost during it); "
                f"the workers keep {what} version {current}"
            )
        return ref

    def _revert(self, took: list[WorkerHandle], pushed: str) -> None:
        """Kill the workers that installed a refused push (``pushed`` names it): the next call replaces them at the
        weights the manager recorded, so that every worker ends on one version."""
        for worker in took:
            taken = f"took {pushed}, which other workers refused"
            self._kill(worker, f"reverted: {taken}", taken)

    def _check_workers(self) -> None:
        """Kill and replace workers lost since the last call (dead, hung, failed); wait until replacements serve."""
        self._await_ready()
        problems = probe({w.worker_id: w.actor for w in self.workers}, self.config.round_timeout_s)
        for w in self.workers:
            if w.worker_id in problems:
                LOG.warning("rollout worker %s was lost between rollouts: %s", w.worker_id, problems[w.worker_id])
                ray.kill(w.actor, no_restart=True)
                w.alive, w.lost_reason = False, f"lost between rollouts ({problems[w.worker_id]})"
        self._replace_dead()
        self._await_ready()

    def _replace_dead(self) -> None:
        """Start a fresh actor for each dead worker, with the current policy and drafter weights pushed to it."""
        if not self.config.restart_failed_workers:  # the loss is reported all the same (replacement None)
            for w in self.workers:
                if not w.alive and not w.loss_recorded:
                    self._record_loss(w, None)
            return
        for i, w in enumerate(self.workers):
            if not w.alive:
                self.workers[i] = self._replacement(w)

    def _replacement(self, dead: WorkerHandle) -> WorkerHandle:
        """A fresh actor in ``dead``'s place, brought to the current weights and to ``dead``'s last strategy-selector
        state (its ``ready`` calls must finish before it serves; calls sent after them run after them)."""
        fresh = self._spawn(dead.slot)
        if self._policy_ref is not None:
            fresh.ready.append(fresh.actor.update_policy.remote(self.policy_version, self._policy_ref))
        if self._drafter_ref is not None:
            fresh.ready.append(fresh.actor.update_drafter.remote(self.drafter_version, self._drafter_ref))
        if dead.worker_id in self._selector_states:
            fresh.ready.append(fresh.actor.load_selector_state.remote(self._selector_states.pop(dead.worker_id)))
        fresh.ready.append(fresh.actor.health.remote())
        self.replaced_workers += 1
        self._record_loss(dead, fresh.worker_id)
        return fresh

    def _record_loss(self, dead: WorkerHandle, replacement_id: str | None) -> None:
        dead.loss_recorded = True
        log_loss(LOG, loss_record(dead, self.rollouts, self.config.worker.cotrain, replacement_id), self._replacements)

    def _replace_in_run(self, dead: WorkerHandle) -> WorkerHandle | None:
        """A replacement for ``dead`` that serves now (None: replacement is off, or it failed to start)."""
        if not self.config.restart_failed_workers:
            self._record_loss(dead, None)
            return None
        fresh = self._replacement(dead)  # a threaded actor may run calls out of order: no work before its weights
        return fresh if self._started(fresh) else None

    def _adopt(self, run_workers: list[WorkerHandle]) -> None:
        """Take over the replacements a rollout started (``adopt_replacements``)."""
        self.workers = adopt_replacements(self.workers, run_workers)

    def _remember_selector_states(self) -> None:
        """Each live worker's strategy-selector state, for a replacement should it be lost."""
        answers = self._settle([(w, w.actor.selector_state.remote()) for w in self._alive()], "its selector state")
        # updated, not replaced: a worker lost earlier in this call, or now, keeps its last entry; the others answered
        self._selector_states.update({w.worker_id: s for w, s in answers if not isinstance(s, RayError)})

    def _await_ready(self) -> None:
        """Finish a co-training round left running; replace the workers it lost and wait for replacements to start
        (one that fails is replaced again, as many times as there are slots; without replacement the dead go)."""
        self._rounds.close()
        for _ in range(len(self.workers) + 1):
            self._replace_dead()
            for w in [w for w in self.workers if w.ready]:
                self._started(w)
        self.workers = [w for w in self.workers if w.alive]

    def _started(self, w: WorkerHandle) -> bool:
        """Wait for ``w``'s start-up calls; one that dies, raises (a weight push it refuses) or times out is killed
        (False)."""
        try:
            ray.get(w.ready, timeout=self.config.worker_start_timeout_s)
        except (RayError, GetTimeoutError) as err:
            LOG.warning("replacement rollout worker %s failed to start: %s", w.worker_id, short_error(err))
            w.alive, w.lost_reason = False, f"failed to start ({short_error(err)})"
            ray.kill(w.actor, no_restart=True)
        w.ready = []
        return w.alive


def is_refusal(err: RayError) -> bool:
    """Whether a worker's call failed because the worker refused it: its checks raised ValueError in the task (Ray
    wraps it in a RayTaskError whose cause it is). Any other error (a RuntimeError or OOM in the task, Ray's own
    errors) is a failure, not a refusal."""
    return isinstance(err, RayTaskError) and isinstance(err.cause, ValueError)
