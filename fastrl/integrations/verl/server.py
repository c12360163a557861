"""The verl-facing server actor of one fastrl replica: verl's token-in/token-out ``generate`` and lifecycle calls
over fastrl's threaded rollout-worker actor (``RolloutWorkerActor``), which batches every concurrent request into
shared decode rounds. The server co-trains the drafter while it is idle and merges drafters at ``sleep``."""

from __future__ import annotations

import asyncio
import json
import logging
import os
from pathlib import Path

import ray
import torch
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from torch import Tensor
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.config import HFModelConfig, RolloutConfig
from verl.workers.rollout.replica import TokenOutput

from fastrl.atomic_files import write_atomic
from fastrl.cotrain.cotrainer import TrainedDrafter
from fastrl.engine.device_memory import MEMORY_PARTS
from fastrl.integrations.verl.admission import AdmissionGate
from fastrl.integrations.verl.options import FastrlRolloutOptions
from fastrl.integrations.verl.requests import (
    RequestLimits,
    SpecCounts,
    parse_sampling,
    request_seed,
    stop_reason,
    token_ids,
)
from fastrl.integrations.verl.server_report import ServerReport
from fastrl.rollout.errors import short_error
from fastrl.rollout.manager import is_refusal
from fastrl.rollout.ray_worker import RolloutWorkerActor
from fastrl.rollout.types import RolloutResult
from fastrl.sampling.params import SamplingParams

LOG = logging.getLogger("fastrl.verl")

ABORT_RETRY_S = 0.1  # an abort is sent again after this long while its requests are still in flight
RELEASE_WAIT_S = 30.0  # how long an idle server retries a memory release the engine refuses for unfinished requests
DRAIN_WAIT_S = 300.0  # how long an abort or a memory release waits for the requests in flight to end (a hung engine)


def _failed(task: asyncio.Future) -> bool:
    """True when ``task`` is over and raised (or was cancelled)."""
    return task.done() and (task.cancelled() or task.exception() is not None)


class FastrlServer:
    """Made a Ray actor by ``FastrlReplica`` (async methods, so thousands of ``generate`` calls wait at once).

    ``generate`` forwards each request to the engine actor, whose stepping loop decodes all of them together.
    Admission is open while nothing holds it: ``abort_all_requests`` holds it until ``resume_generation``, and each
    ``commit_weights`` while it installs weights (a commit that ends never reopens what an abort closed). Waiting
    requests fail as soon as an abort with ``reject_request`` holds admission. ``abort_all_requests`` ends the
    requests in flight at the engine's next step (each returns its tokens so far, ``stop_reason="aborted"``); a
    caller that cancels its call aborts its request the same way (it counts as in flight until the engine ends it).
    ``sleep`` ends a rollout: the idle-time co-training stops and the servers' trained drafters are merged into the
    next version (``DrafterHub``); the engine, its strategy selector and its weights stay alive, so nothing is lost
    across ``sleep``/``wake_up``. A rollout starts at ``wake_up`` or ``commit_weights``; a repeated ``sleep`` before
    that is a no-op.
    """

    def __init__(
        self,
        config: RolloutConfig,
        model_config: HFModelConfig,
        name: str,
        cuda_visible_devices: str | None = None,
        hub: ray.actor.ActorHandle | None = None,
        rollout_mode: str = "STANDALONE",
    ) -> None:
        self.config: RolloutConfig = omega_conf_to_dataclass(config)
        self.model_config: HFModelConfig = omega_conf_to_dataclass(model_config, dataclass_type=HFModelConfig)
        self.options = FastrlRolloutOptions.from_custom(self.config.custom)
        self._release_at_sleep = self.options.releases_at_sleep(self.config.free_cache_engine, rollout_mode)
        self.name = name
        if cuda_visible_devices:
            os.environ["CUDA_VISIBLE_DEVICES"] = cuda_visible_devices
        device = self.options.resolved_device(torch.cuda.is_available())
        max_len = self.config.max_model_len or self.config.prompt_length + self.config.response_length
        worker_config = self.options.worker_config(
            model_dir=self.model_config.local_path,
            rollout_dtype=self.config.dtype,
            max_model_len=max_len,
            rollout_seed=self.config.seed,
            device=device,
            calls=self.config.max_num_seqs,
        )
        self._seed = worker_config.engine.seed
        self._limits = RequestLimits(self.config.prompt_length, self.config.response_length, self.config.ignore_eos)
        env = {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1", "CUDA_VISIBLE_DEVICES": cuda_visible_devices}
        self._worker = RolloutWorkerActor.options(
            num_cpus=worker_config.num_cpus,
            num_gpus=0,
            max_concurrency=worker_config.max_concurrent_calls,
            runtime_env={"env_vars": env} if cuda_visible_devices else None,
            scheduling_strategy=NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False),
        ).remote(name, worker_config)
        self._hub = hub if self.options.cotrain else None
        self.global_steps: int | None = None
        self._policy_version = 0
        self._pending: dict[str, Tensor] = {}
        self._in_flight = 0
        self._running: set[str] = set()  # the ids of the requests in flight (until the engine ends each)
        self._leaving: set[asyncio.Task] = set()  # aborts of cancelled calls' requests, until the engine ends them
        self._idle = asyncio.Event()
        self._gate = AdmissionGate()
        self._commits = 0
        self._asleep: asyncio.Future | None = None  # the sleep that ended the last rollout; None while awake
        self._merged: asyncio.Future | None = None  # that sleep's merge round (a retried sleep does not redo it)
        self._rollouts = 0
        self._slice_id = 0
        self._cotrain_steps = 0
        self._cotrain_task: asyncio.Task | None = None
        self._cotrain_stop = False

    async def ready(self) -> str:
        """Wait until the engine has loaded its models (and joined the drafter hub); returns the server's name."""
        self._idle.set()
        stats = await self._worker.stats.remote()
        if self._hub is not None:
            self._rollouts = await self._hub.join.remote(self.name, stats.drafter_version)
        return self.name

    # ---- generation ---------------------------------------------------------------------------------------------
    async def generate(
        self,
        prompt_ids: list[int],
        sampling_params: dict,
        request_id: str,
        image_data: list | None = None,
        video_data: list | None = None,
        **kwargs: object,
    ) -> TokenOutput:
        """Generate one response (sharing decode rounds with every concurrent request); per-token log-probs when
        ``sampling_params["logprobs"]``; ``extra_fields`` carry ``global_steps``, the spec counts and fastrl's
        weight versions. ValueError for multimodal input or an invalid request."""
        if image_data or video_data or kwargs.get("audio_data"):
            raise ValueError("the fastrl rollout serves text only; multimodal data is not supported")
        prompt = token_ids(prompt_ids)
        parsed = parse_sampling(dict(sampling_params), len(prompt), self._limits, request_seed(self._seed, request_id))
        if not await self._gate.enter():  # this server left the rotation (an abort that rejects): re-route, as vLLM's
            return await self._no_tokens("aborted", parsed.return_logprobs)
        if parsed.params is None:  # the budget is spent
            return await self._no_tokens("length", parsed.return_logprobs)
        self._check_new_id(request_id)
        extra: dict[str, object] = {"global_steps": self.global_steps}
        self._enter()
        self._running.add(request_id)
        run = asyncio.ensure_future(self._run(prompt, parsed.params, request_id))
        try:  # shielded: the request counts as in flight until the engine has ended it
            result = await asyncio.shield(run)
        except asyncio.CancelledError:  # the caller gave up: the engine ends the request at its next step
            task = asyncio.get_running_loop().create_task(self._abort_left(run, request_id))
            self._leaving.add(task)
            task.add_done_callback(self._leaving.discard)
            raise
        if result.error is not None:
            raise ValueError(f"fastrl server {self.name}: {result.error}")
        counts = SpecCounts.of(result)
        extra.update(counts.fields())
        extra.update(fastrl_policy_version=result.policy_version, fastrl_drafter_version=result.drafter_version)
        return TokenOutput(
            token_ids=result.token_ids,
            log_probs=result.logprobs if parsed.return_logprobs else None,
            stop_reason=stop_reason(result.finish_reason),
            extra_fields=extra,
        )

    def _check_new_id(self, request_id: str) -> None:
        """ValueError when ``request_id`` is still in flight here. verl reuses request ids only with
        ``rollout.full_determinism`` (``det-<priority>``) under its v1 trainer, whose agent loop sets no priority:
        every request is then ``det-0``, and the siblings of a GRPO group would share one seed."""
        if request_id in self._running:
            raise ValueError(
                f"fastrl server {self.name}: request id {request_id!r} is already running on this server; with "
                "actor_rollout_ref.rollout.full_determinism=true verl 0.9.1's v1 trainer (trainer.use_v1=true, its "
                "default) gives every request the id 'det-0' (its agent loop sets no priority): set "
                "trainer.use_v1=false, or full_determinism=false"
            )

    async def _no_tokens(self, stop_reason: str, logprobs: bool) -> TokenOutput:
        """An answer without tokens that carries every column verl's metrics read (spec counts, versions)."""
        stats = await self._worker.stats.remote()
        extra: dict[str, object] = {"global_steps": self.global_steps, **SpecCounts(0, 0, 0).fields()}
        extra.update(fastrl_policy_version=stats.policy_version, fastrl_drafter_version=stats.drafter_version)
        empty = [] if logprobs else None
        return TokenOutput(token_ids=[], log_probs=empty, stop_reason=stop_reason, extra_fields=extra)

    async def _abort_left(self, run: asyncio.Future, request_id: str) -> None:
        """Abort the request of a caller that cancelled, again until the engine has ended it (an abort that comes
        before the engine actor has queued the request finds nothing); its answer, or error, is dropped."""
        while not run.done():
            try:
                await self._worker.abort.remote([request_id])
            except ray.exceptions.RayError:  # the engine actor ended: its calls, this one's too, fail on their own
                pass
            await asyncio.wait({run}, timeout=ABORT_RETRY_S)
        if not run.cancelled():
            run.exception()  # retrieved: nobody waits for it, and asyncio would log it as an error

    async def _run(self, prompt: list[int], params: SamplingParams, request_id: str) -> RolloutResult:
        """The engine's answer to one request; the request counts as in flight until it comes."""
        try:
            return await self._worker.generate.remote(prompt, params, request_id)
        finally:
            self._running.discard(request_id)
            self._leave()

    def _enter(self) -> None:
        self._in_flight += 1
        self._idle.clear()
        if self._in_flight == 1 and self._hub is not None:
            self._hub.mark.remote(self.name, True)
        if self._cotrain_task is not None and not self._cotrain_task.done():
            self._worker.stop_training.remote(self._slice_id)

    def _leave(self) -> None:
        self._in_flight -= 1
        if self._in_flight == 0:
            self._idle.set()
            if self._hub is not None:
                self._hub.mark.remote(self.name, False)
            running = self._cotrain_task is not None and not self._cotrain_task.done()
            if self._hub is not None and self._asleep is None and not running:
                self._cotrain_stop = False
                self._cotrain_task = asyncio.get_running_loop().create_task(self._cotrain())

    async def _cotrain(self) -> None:
        """Idle time during the tail: back-to-back co-training slices while another server still runs requests,
        until a request arrives here or the server sleeps."""
        while self._in_flight == 0 and self._asleep is None and not self._cotrain_stop:
            try:
                others_busy = await self._hub.others_busy.remote(self.name)
            except ray.exceptions.RayActorError:  # the hub ended (every other server shut down): no tail to fill
                return
            if not others_busy or self._in_flight or self._asleep is not None or self._cotrain_stop:
                return  # a request, a sleep or a stop came while the hub answered: its stop named the last slice
            self._slice_id += 1
            metrics = await self._worker.train_drafter_slice.remote(self.options.slice_seconds, self._slice_id)
            self._cotrain_steps += metrics.steps
            if metrics.skipped or metrics.error or metrics.steps == 0:
                return

    # ---- lifecycle ----------------------------------------------------------------------------------------------
    async def sleep(self) -> None:
        """End of a rollout: stop co-training, merge the servers' trained drafters, install the merged version. A
        sleep before the next ``wake_up`` or weight commit (verl's wake-up when it frees no cache) ends nothing: it
        waits for the sleep that did. A sleep that failed is run again from where it failed: a merge that went
        through is not offered again (every server offers each merge round once, or the servers' rounds part), only
        the release that followed it is retried."""
        if self._asleep is None or _failed(self._asleep):
            self._asleep = asyncio.ensure_future(self._end_rollout())
        await asyncio.shield(self._asleep)

    async def _end_rollout(self) -> None:
        if self._merged is None or _failed(self._merged):  # once per rollout (``_wake`` starts the next)
            self._merged = asyncio.ensure_future(self._merge_drafters())
        await self._merged
        if self._release_at_sleep:  # last: the merged drafter is installed, the trainer gets the device
            freed = await self._release(MEMORY_PARTS)
            LOG.info("fastrl server %s: sleep gave back %.1f MiB of device memory", self.name, freed / 2**20)

    async def _merge_drafters(self) -> None:
        """This rollout's merge round: co-training stopped, the trained drafter offered to the hub and the merged
        version installed, the rollout counted, the bandit's state exported."""
        await self._stop_cotrain()
        if self._hub is not None:
            trained = await self._trained_drafter()
            release = await self._hub.exchange.remote(self.name, self._rollouts, trained)
            if release is not None:
                await self._worker.update_drafter.remote(release.version, release.state)
        self._rollouts += 1
        if self.options.export_dir:
            state = await self._worker.selector_state.remote()
            path = Path(self.options.export_dir) / f"bandit_state_{self.name}.json"
            try:  # renamed into place: a reader never sees half a state; a failed export never fails the step
                path.parent.mkdir(parents=True, exist_ok=True)
                write_atomic(path, json.dumps(state, allow_nan=False) + "\n")
            except (OSError, ValueError) as err:  # ValueError: a full disk, or a NaN JSON cannot hold
                LOG.warning("fastrl server %s: custom.fastrl.export_dir: %s not written (%s)", self.name, path, err)

    async def _trained_drafter(self) -> TrainedDrafter | None:
        """The drafter copy co-trained here, or None when the engine cannot hand it over: the failure is logged in
        one line and the round goes on without this copy (the peers do not wait for it, and verl's step does not
        fail), as a failed drafter round does under fastrl's own rollout manager."""
        try:
            return await self._worker.trained_drafter.remote()
        except ray.exceptions.RayError as err:  # a task error (the copy failed) or an engine actor that died
            LOG.warning("fastrl server %s: co-trained drafter not merged: %s", self.name, short_error(err))
            return None

    async def _release(self, parts: frozenset[str]) -> int:
        """The engine's release of ``parts`` once no request is in flight here (verl releases between rollouts; a
        request that arrives meanwhile is waited for); the device bytes given back. RuntimeError when requests are
        still in flight after ``DRAIN_WAIT_S``, or the engine still holds unfinished requests after ``RELEASE_WAIT_S``
        of this server being idle (never a silent hang)."""
        loop = asyncio.get_running_loop()
        deadline = None
        while True:
            await self._drained("memory not released", loop.time() + DRAIN_WAIT_S)
            try:
                return await self._worker.release_memory.remote(sorted(parts))
            except ValueError as err:  # a request reached the engine after the wait: release once it is done
                deadline = deadline or loop.time() + RELEASE_WAIT_S
                if loop.time() > deadline:
                    raise RuntimeError(f"fastrl server {self.name}: memory not released: {err}") from None
                await asyncio.sleep(ABORT_RETRY_S)

    async def wake_up(self, tags: list[str] | None = None) -> None:
        """Start of a rollout: what ``sleep`` released comes back, the parts ``tags`` names ("weights",
        "kv_cache"; None: all) now, so that a trainer can bring the weights back, sync them and offload its own
        before the KV pools return (requests arriving before the rest comes back wait for it)."""
        await self._wake()
        await self._worker.restore_memory.remote(sorted(MEMORY_PARTS if tags is None else set(tags) & MEMORY_PARTS))

    async def _wake(self) -> None:
        """Awake: the next ``sleep`` ends a rollout (once the sleep in progress, if any, is over)."""
        if self._asleep is not None:
            await asyncio.wait([self._asleep])
        self._asleep = self._merged = None

    async def _stop_cotrain(self) -> None:
        self._cotrain_stop = True
        task = self._cotrain_task
        if task is not None and not task.done():
            self._worker.stop_training.remote(self._slice_id)
            await task

    async def abort_all_requests(self, reject_request: bool = False) -> dict[str, object]:
        """Close admission (new and waiting requests wait, or fail when ``reject_request``) and abort the requests
        in flight: each returns at the engine's next step with the tokens it has (``stop_reason="aborted"``, as
        vLLM's, so that verl's partial rollout resumes it). Returns when none is in flight, with verl's
        ``aborted_count`` and ``request_ids``."""
        await self._gate.close_for_abort(bool(reject_request))
        aborted: list[str] = []
        deadline = asyncio.get_running_loop().time() + DRAIN_WAIT_S
        while self._in_flight:  # again until idle: a request admitted just now may reach the engine after an abort
            aborted += await self._before("abort_all_requests", deadline, self._worker.abort.remote(None))
            await self._drained("abort_all_requests", deadline, ABORT_RETRY_S)
        return {"aborted_count": len(aborted), "request_ids": aborted}

    async def _drained(self, what: str, deadline: float, retry_s: float | None = None) -> None:
        """Wait until no request is in flight here, or ``retry_s`` has passed (None: no retry, until idle).
        RuntimeError naming this server and ``what`` waited when the loop's clock passes ``deadline`` first (an
        engine that never ends its requests: a hung step)."""
        try:
            await self._before(what, deadline, self._idle.wait(), retry_s)
        except asyncio.TimeoutError:  # the retry is due (not the builtin TimeoutError before Python 3.11)
            pass

    async def _before(self, what: str, deadline: float, step: object, retry_s: float | None = None) -> object:
        """The result of awaiting ``step`` within ``retry_s`` (asyncio.TimeoutError after it); RuntimeError when
        ``deadline`` comes first: the requests in flight here did not end in ``DRAIN_WAIT_S``."""
        left = deadline - asyncio.get_running_loop().time()
        try:
            return await asyncio.wait_for(step, timeout=max(left, 0.0) if retry_s is None else min(left, retry_s))
        except asyncio.TimeoutError:
            if asyncio.get_running_loop().time() < deadline:
                raise
        raise RuntimeError(
            f"fastrl server {self.name}: {what}: {self._in_flight} request(s) still in flight after waiting "
            f"{DRAIN_WAIT_S:g} s for the engine to end them (is its engine step hung?)"
        )

    async def resume_generation(self) -> None:
        """Lift the abort's hold (admission opens unless a weight commit is in progress)."""
        await self._gate.reopen()

    async def set_global_steps(self, global_steps: int) -> None:
        self.global_steps = global_steps

    async def clear_kv_cache(self) -> None:
        """No-op: fastrl keeps no cache across requests (no prefix cache); entries are overwritten by position."""

    async def release_kv_cache(self) -> None:
        """Give the KV pools back (verl calls it before a weight sync, after aborting the requests in flight; the
        weights stay in place for the sync to write into); requests wait for ``resume_kv_cache``."""
        await self._release(frozenset({"kv_cache"}))

    async def resume_kv_cache(self) -> None:
        """Bring back the KV pools ``release_kv_cache`` gave back."""
        await self._worker.restore_memory.remote(["kv_cache"])

    async def start_profile(self, **kwargs: object) -> None:
        """No-op: fastrl has no profiler hook here."""

    async def stop_profile(self) -> None:
        """No-op."""

    # ---- weights ------------------------------------------------------------------------------------------------
    async def receive_weights(self, bucket: dict[str, Tensor]) -> int:
        """Stage one bucket of HF-named policy tensors; returns how many are staged."""
        self._pending.update(bucket)
        return len(self._pending)

    async def commit_weights(self, global_steps: int | None = None) -> int:
        """Install the staged tensors as the policy, between requests: admission closes until requests in flight
        finish, so no response mixes weights. The version is ``global_steps`` when given; without it the version
        (and ``global_steps``) stay as they are: verl commits without steps only to re-install the weights it last
        pushed (its v1 trainer's validation), so the same weights keep their version and the next step's weights
        get theirs. New weights start a rollout, as ``wake_up`` does (verl wakes its replicas by a weight update).
        ValueError naming this server when the engine refuses the weights (each server keeps its version)."""
        version = int(global_steps) if global_steps is not None else self._policy_version
        state, self._pending = self._pending, {}
        self._commits += 1
        hold = f"commit {self._commits}"
        await self._gate.hold(hold, True)
        try:
            await self._idle.wait()
            await self._stop_cotrain()
            await self._install_policy(version, state)
        finally:
            await self._gate.hold(hold, False)
        self._policy_version = version
        if global_steps is not None:
            self.global_steps = int(global_steps)
        await self._wake()
        return version

    async def _install_policy(self, version: int, state: dict[str, Tensor]) -> None:
        """The engine's install of ``state`` as policy ``version``. ValueError naming this server when the engine
        refuses the weights (its checks: missing, unexpected or mis-shaped tensors), with the engine's own one-line
        reason rather than Ray's wrapped traceback, as fastrl's rollout manager says a refused push."""
        try:
            await self._worker.update_policy.remote(version, state)
        except ray.exceptions.RayError as err:
            if not is_refusal(err):
                raise
            raise ValueError(f"fastrl server {self.name}: weight commit refused: {short_error(err)}") from None

    # ---- reports ------------------------------------------------------------------------------------------------
    async def report(self) -> ServerReport:
        stats = await self._worker.stats.remote()
        return ServerReport(
            name=self.name,
            policy_version=stats.policy_version,
            drafter_version=stats.drafter_version,
            global_steps=self.global_steps,
            in_flight=self._in_flight,
            cotrain_steps=self._cotrain_steps,
            rollouts=self._rollouts,
            strategy_rounds=dict(stats.strategy_rounds),
            memory_released=list(stats.memory_released),
        )

    async def strategy_selector_state(self) -> dict:
        """The bandit's (or other policy's) state, JSON-serialisable."""
        return await self._worker.selector_state.remote()

    async def shutdown(self) -> None:
        """Stop the engine actor (before this actor is killed) and leave the drafter hub (the last server to leave
        ends it, so that a later job in the same Ray session starts from a fresh hub)."""
        try:
            await self._stop_cotrain()
            await self._worker.close.remote()
        except ray.exceptions.RayError:  # the engine actor died: nothing to close, the hub must still be left
            pass
        finally:
            ray.kill(self._worker)
            if self._hub is not None and await self._hub.leave.remote(self.name) == 0:
                ray.kill(self._hub)
