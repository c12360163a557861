"""The plain-Python core of a rollout worker: an Engine with versioned policy and drafter weights, a feature buffer
filled by rollouts, and time-sliced drafter co-training. Ray actors and the in-process backend wrap it."""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import Tensor

from fastrl.cotrain.buffer import FeatureBuffer
from fastrl.cotrain.cotrainer import CoTrainer, SliceMetrics, TrainedDrafter
from fastrl.cotrain.feature_sequence import FeatureSequence
from fastrl.engine.calibration import calibrate_engine
from fastrl.engine.engine import Engine
from fastrl.engine.request import RequestOutput
from fastrl.models.checkpoint import (
    IGNORED_SUFFIXES,
    check_cast,
    check_tensors,
    check_weights,
    drop_tied_copy,
    load_model,
)
from fastrl.models.decoder import CausalLM
from fastrl.rollout.types import DRAFT_VOCAB_KEY, EXTRA_LAYERS_KEY, RolloutRequest, RolloutResult, RoundRecord
from fastrl.rollout.worker_config import RolloutWorkerConfig
from fastrl.rollout.worker_cotrain import CotrainState, RoundReport, WorkerCoTraining
from fastrl.rollout.worker_stats import WorkerHealth, WorkerStats
from fastrl.speculative.draft_vocab import wider_than
from fastrl.speculative.drafter import EagleDrafter
from fastrl.speculative.drafter_checkpoint import load_drafter
from fastrl.speculative.history import HistoryState
from fastrl.strategy.round_stats import RoundStats, RoundTotals

LOG = logging.getLogger(__name__)


class EngineWorker:
    """One worker's engine and weights. Thread-safe: the stepping loop, weight pushes and co-training slices may
    run on different threads (a slice holds the engine lock only to copy weights and draw a batch).

    Streaming use: ``submit`` requests, ``step`` until ``has_unfinished()`` is False (each step returns the results
    that finished). Batch use: ``generate`` (single caller). Every finished output's hidden states become a
    FeatureSequence for co-training when it is on (committed to the buffer in request-id order before training);
    they are a by-product of verification. ``worker_index`` is the worker's slot: it seeds its co-training steps.
    """

    def __init__(self, worker_id: str, config: RolloutWorkerConfig, worker_index: int = 0) -> None:
        torch.set_num_threads(config.torch_threads)
        self.worker_id = worker_id
        self.config = config
        self._lock = threading.RLock()  # engine, weights, buffer, counters
        self._train_lock = threading.Lock()  # one slice at a time; policy pushes wait for it
        self._training_at: float | None = None  # last progress of the co-training call in flight (monotonic)
        engine_config = config.engine
        self.policy = load_model(config.model_dir, engine_config.torch_dtype, engine_config.device)
        self.drafter, self.drafter_version = self._initial_drafter()
        self.policy_version = 0
        self.engine = Engine(
            self.policy, engine_config, drafter=self.drafter, selector=config.build_strategy_selector()
        )
        calibrate_engine(self.engine)  # the bandit's round costs; its state then lives as long as the worker
        # Entries are as wide as the drafter's input: H, or (len(extra_layers) + 1) * H for a fused drafter.
        width = self.drafter.feature_size if self.drafter is not None else None
        self.buffer = FeatureBuffer(config.buffer_tokens, config.retention_versions, config.recency_decay, width)
        self.cotrainer = CoTrainer(self.policy, config.trainer) if config.cotrain and self.drafter is not None else None
        self.cotraining = (
            WorkerCoTraining(
                self.policy, self.buffer, self.cotrainer, config.schedule, config.engine.seed, worker_index
            )
            if self.cotrainer is not None
            else None
        )
        self.worker_index = worker_index
        self._history_at_boundary: HistoryState | None = None  # the history index at the last policy push
        self._selector_at_boundary: dict | None = None  # the strategy selector's state then
        self._running: dict[str, RolloutRequest] = {}
        self._rounds: deque[RoundRecord] = deque(maxlen=config.max_round_records)
        self._served = 0
        self._round_totals = RoundTotals()
        self._strategy_rounds: Counter[str] = Counter()

    def _initial_drafter(self) -> tuple[EagleDrafter | None, int]:
        c = self.config
        if c.drafter_dir:
            drafter, info = load_drafter(c.drafter_dir, self.policy, c.engine.device)
            return drafter, info.version
        if not c.needs_drafter():
            return None, 0
        with torch.random.fork_rng(devices=[]):  # every worker initialises the same weights; global RNG untouched
            torch.manual_seed(c.engine.seed)
            drafter = EagleDrafter(self.policy.config)
        return drafter.to(device=c.engine.device, dtype=c.engine.torch_dtype).eval(), 0

    # ---- generation -------------------------------------------------------------------------------------------
    def submit(self, request: RolloutRequest) -> None:
        """Queue a request (ValueError when its id is already running here)."""
        with self._lock:
            self.engine.add_request(
                request.prompt_ids, request.params, request.request_id, return_hidden_states=self.cotrainer is not None
            )
            self._running[request.request_id] = request

    def abort(self, request_ids: list[str] | None = None) -> list[str]:
        """Abort ``request_ids`` (None: every unfinished request): each ends at the next step, its result holding
        the tokens it had and finish reason ``abort``. Returns the ids aborted (an unknown or finished one is not)."""
        ids = abort_ids(request_ids)
        with self._lock:
            return [rid for rid in (list(self._running) if ids is None else ids) if self.engine.abort(rid)]

    def has_unfinished(self) -> bool:
        with self._lock:
            return self.engine.has_unfinished()

    def can_step(self) -> bool:
        """Whether a step has work to do and the memory to do it (one lock acquisition: the stepping loop asks it
        between steps, when report calls wait for the lock)."""
        with self._lock:
            return self.engine.can_step()

    def release_memory(self, parts: list[str]) -> int:
        """``Engine.release_memory`` (between rollouts; waits for a co-training slice in progress, which reads the
        live drafter's weights); the device bytes given back."""
        with self._train_lock, self._lock:
            return self.engine.release_memory(parts)

    def restore_memory(self, parts: list[str]) -> None:
        """``Engine.restore_memory``."""
        with self._train_lock, self._lock:
            self.engine.restore_memory(parts)

    def step(self) -> list[RolloutResult]:
        """One engine step; the results of the requests that finished in it."""
        with self._lock:
            outputs = self.engine.step()
            self._collect_rounds()
            return [self._finish(out) for out in outputs if out.finished]

    def generate(self, requests: list[RolloutRequest]) -> list[RolloutResult]:
        """Run ``requests`` to completion; results in request order (for a single caller). Every request is checked
        before any is queued (``Engine.check_request``): a bad one leaves none behind."""
        with self._lock:
            for request in requests:
                self.engine.check_request(request.prompt_ids, request.params, request.request_id)
        done: dict[str, RolloutResult] = {}
        try:
            for request in requests:
                self.submit(request)
            while self.has_unfinished():
                for result in self.step():
                    done[result.request_id] = result
        except BaseException:
            # Every id of the call (none ran here before it: checked above): an interrupt inside submit can leave
            # a request queued in the engine that the worker has not recorded yet.
            self._drop_call([r.request_id for r in requests])
            raise
        if self.cotraining is not None:
            with self._train_lock, self._lock:
                self.cotraining.commit()
        return [done[r.request_id] for r in requests]

    def _drop_call(self, ids: list[str]) -> None:
        """After a ``generate`` call raised (an interrupt, a fault): its requests are aborted and stepped out here,
        their outputs dropped (no co-training features either: those of requests that finished before the error
        are unstaged), so the worker is as before the call: its ids free, nothing of it left to run inside the next
        call. A step that raises again leaves the rest as they are; a signal ``Engine.drop`` held to its end is
        raised after the worker has forgotten the requests it delivered."""
        with self._lock:
            try:
                self.engine.drop(ids)
            except Exception:
                return  # the first error is the one raised
            finally:
                self._forget_call(ids)

    def _forget_call(self, ids: list[str]) -> None:
        """Forget what a failed call left here: its unstaged co-training features, the running entries of its
        requests the engine no longer holds (delivered, or never queued), the decode rounds it ran."""
        if self.cotraining is not None:
            self.cotraining.discard(ids)
        for request_id in ids:
            if request_id in self._running and not self.engine.holds(request_id):
                del self._running[request_id]
        self._collect_rounds()

    def take_rounds(self) -> list[RoundRecord]:
        """The decode rounds recorded since the last call."""
        with self._lock:
            rounds = list(self._rounds)
            self._rounds.clear()
            return rounds

    def _finish(self, out: RequestOutput) -> RolloutResult:
        request = self._running.pop(out.request_id)
        self._served += 1
        if self.cotraining is not None and out.hidden_states is not None and len(out.token_ids) >= 2:
            # The whole sequence, prompt included (the drafter reads the prompt's entries at inference too):
            # entry p reads token x_p and feature f_{p-1}, p = 1 .. len(prompt) + len(output) - 1.
            tokens = torch.tensor(out.prompt_ids[1:] + out.token_ids, dtype=torch.long)
            features = torch.cat([out.prompt_hidden_states, out.hidden_states]).to("cpu", torch.float32)
            sequence = FeatureSequence(tokens, features, 1, self.policy_version)
            self.cotraining.add(out.request_id, sequence, out.prompt_ids)
        latency = out.timings.latency
        return RolloutResult(
            request_id=out.request_id,
            group=request.group,
            prompt_ids=list(out.prompt_ids),
            token_ids=list(out.token_ids),
            logprobs=list(out.logprobs),
            finish_reason=out.finish_reason.value if out.finish_reason is not None else "error",
            accept_lengths=list(out.accept_lengths),
            worker_id=self.worker_id,
            policy_version=self.policy_version,
            drafter_version=self.drafter_version,
            latency_s=latency if latency is not None else 0.0,
            error=out.error,
            drafted_tokens=out.drafted_tokens,
            accepted_tokens=out.accepted_tokens,
        )

    def _collect_rounds(self) -> None:
        stats: list[RoundStats] = self.engine.round_stats
        for s in stats:
            name = str(s.strategy)
            self._rounds.append(
                RoundRecord(
                    self.worker_id,
                    name,
                    s.batch_size,
                    s.mean_accept_length,
                    s.total_emitted,
                    s.wall_time_s,
                    s.plain_time_estimate_s,
                )
            )
            self._round_totals.add(s)
            self._strategy_rounds[name] += 1
        stats.clear()

    # ---- weights ----------------------------------------------------------------------------------------------
    def update_policy(self, version: int, state: dict[str, Tensor]) -> None:
        """Load policy weights (HF names; tied models with or without lm_head.weight) in place as ``version``.
        Only between rollouts: while a request is unfinished a push is refused (ValueError; nothing changes), since
        that request's tokens would come from two versions under the newer one's name (abort such requests first, as
        verl's weight sync does). A push is a step boundary: what ``history_state``, ``selector_state`` and
        ``cotrain_state`` return until the next one is the history index, the selector and the co-training state as
        they stand now."""
        with self._train_lock, self._lock:
            if self.engine.has_unfinished():
                raise ValueError(
                    f"worker {self.worker_id}: policy version {version} refused: requests are unfinished (their "
                    "tokens would come from two versions); push between rollouts or abort them first"
                )
            load_policy_weights(self.policy, state)
            self.policy_version = int(version)
            self._mark_boundary()

    def update_drafter(self, version: int, state: dict[str, Tensor]) -> None:
        """Load drafter weights in place as ``version`` (and the draft vocabulary when ``state`` holds
        ``DRAFT_VOCAB_KEY``); the co-training copy restarts from them. A state with ``EXTRA_LAYERS_KEY`` must name
        the live drafter's extra layers (ValueError otherwise: a drafter cannot change the layers it reads). Every
        tensor is checked first (names, shapes, floating point, finite; the draft vocabulary's ids): a refused state
        is one ValueError naming what is wrong, and the drafter and its version stay as they were."""
        with self._lock:
            if self.drafter is None:
                raise ValueError(f"worker {self.worker_id} runs without a drafter; cannot load drafter weights")
            if EXTRA_LAYERS_KEY in state and tuple(state[EXTRA_LAYERS_KEY].tolist()) != self.drafter.extra_layers:
                raise ValueError(
                    f"drafter state's {EXTRA_LAYERS_KEY} {state[EXTRA_LAYERS_KEY].tolist()} differ from the live "
                    f"drafter's {list(self.drafter.extra_layers)}"
                )
            weights = {k: v for k, v in state.items() if k not in (DRAFT_VOCAB_KEY, EXTRA_LAYERS_KEY)}
            try:  # the policy path's checks (load_policy_weights); check_tensors reads state_dict() and config
                check_weights(weights, "pushed drafter weights")
                check_tensors(self.drafter, weights, "pushed drafter weights")
                check_cast(self.drafter, weights, "pushed drafter weights")
            except ValueError as err:
                raise ValueError(f"worker {self.worker_id}: drafter version {version} refused: {err}") from None
            if DRAFT_VOCAB_KEY in state:  # checks the ids before it changes anything
                self._check_draft_vocab_size(version, state[DRAFT_VOCAB_KEY])
                self.drafter.set_draft_vocab(state[DRAFT_VOCAB_KEY])
            with torch.no_grad():
                self.drafter.load_state_dict(weights)
            self.drafter_version = int(version)

    def _check_draft_vocab_size(self, version: int, ids: Tensor) -> None:
        """ValueError when a pushed draft vocabulary is narrower than a strategy's candidates a step (every round of
        it would fail), or its size differs from the live one's while the engine runs CUDA graphs: they were captured
        over the live vocabulary's shapes (one of its size is copied in place)."""
        if wide := wider_than(self.engine.runner.runtimes, ids.numel()):
            raise ValueError(
                f"worker {self.worker_id}: drafter version {version} refused: its draft vocabulary ({ids.numel()} "
                f"ids) is narrower than strategy {wide[0]}'s topk {wide[0].topk}"
            )
        live = self.drafter.draft_vocab
        if self.engine.runner.graphs is not None and (live is None or live.shape != ids.shape):
            have = "none" if live is None else f"{live.numel()} ids"
            raise ValueError(
                f"worker {self.worker_id}: drafter version {version} refused: its draft vocabulary ({ids.numel()} "
                f"ids) differs in size from the live one ({have}), which the captured CUDA graphs are built for"
            )

    def drafter_state(self) -> tuple[int, dict[str, Tensor]]:
        """The live drafter's version and CPU float32 weights ({} without a drafter), with its reduced draft
        vocabulary under ``DRAFT_VOCAB_KEY`` when it has one and a fused drafter's layers under ``EXTRA_LAYERS_KEY``."""
        with self._lock:
            if self.drafter is None:
                return self.drafter_version, {}
            state = {k: v.detach().to("cpu", torch.float32).clone() for k, v in self.drafter.state_dict().items()}
            if self.drafter.draft_vocab is not None:
                state[DRAFT_VOCAB_KEY] = self.drafter.draft_vocab.detach().to("cpu").clone()
            if self.drafter.extra_layers:
                state[EXTRA_LAYERS_KEY] = torch.tensor(self.drafter.extra_layers, dtype=torch.long)
            return self.drafter_version, state

    def selector_state(self) -> dict:
        """The strategy selector's state (JSON-serialisable) at the last step boundary (the last policy push; before
        the first one, now), as ``history_state``: a checkpoint taken after a rollout, before its update, holds the
        selector that the resumed run's repeat of that rollout starts from, as the uninterrupted run's did."""
        with self._lock:
            boundary = self._selector_at_boundary
            return copy.deepcopy(boundary) if boundary is not None else self.engine.selector.state_dict()

    def load_selector_state(self, state: dict) -> None:
        """Restore ``selector_state()`` (a new step boundary)."""
        with self._lock:
            self.engine.selector.load_state_dict(state)
            self._selector_at_boundary = copy.deepcopy(self.engine.selector.state_dict())

    def history_state(self) -> HistoryState | None:
        """The history index's prompts and kept responses at the last step boundary (the last policy push; before
        the first one, now), for a checkpoint (None when no strategy drafts from history). A checkpoint taken after
        a rollout's responses went in but before the step's update (Ctrl-C) holds none of them: the resumed run,
        repeating that rollout, keeps each response once, as the uninterrupted run does."""
        with self._lock:
            if self.engine.history is None:
                return None
            boundary = self._history_at_boundary
            return boundary if boundary is not None else self.engine.history.state()

    def load_history_state(self, state: HistoryState) -> None:
        """Restore ``history_state()`` before the first rollout (the new step boundary); a worker without a history
        index leaves it unused."""
        with self._lock:
            if self.engine.history is not None:
                self.engine.history.load_state(state)
                self._history_at_boundary = self.engine.history.state()

    def _mark_boundary(self) -> None:
        """Remember the history index, the selector and the co-training state as they stand (a step boundary),
        copies: later rollouts, and a drafter round that ends after one before the step's update, do not reach
        them."""
        if self.engine.history is not None:
            self._history_at_boundary = self.engine.history.state()
        self._selector_at_boundary = copy.deepcopy(self.engine.selector.state_dict())
        if self.cotraining is not None:
            self.cotraining.mark_boundary()

    # ---- co-training ------------------------------------------------------------------------------------------
    def train_drafter_slice(self, seconds: float, should_stop: Callable[[], bool] = lambda: False) -> SliceMetrics:
        """Train a copy of the live drafter on this worker's buffer for up to ``seconds`` (and, on the ``steps``
        schedule, at most the updates still due this rollout); never raises (failures are in the metrics'
        ``error``). Rollouts keep using the live drafter."""
        if self.cotraining is None:
            return SliceMetrics(skipped="co-training is off")

        def stop() -> bool:  # asked before every drafter step: the call is making progress
            self._training_at = time.monotonic()
            return should_stop()

        with self._train_lock, self._training():
            try:
                with self._lock:
                    self.cotraining.commit()
                    live, version = self.drafter, self.drafter_version
                return self.cotraining.train(live, version, seconds, stop, self._rng_devices())
            except Exception as err:  # a slice reports its failure, it never raises into rollouts
                self.cotrainer.invalidate()
                return SliceMetrics(error=describe(err))

    @contextmanager
    def _training(self) -> Iterator[None]:
        """Mark a co-training call in flight (``health().training_stalled_s`` counts from its last progress); a
        nested one (a slice inside ``finish_drafter_round``) leaves the mark to the outer call."""
        outer = self._training_at is None
        self._training_at = time.monotonic()
        try:
            yield
        finally:
            if outer:
                self._training_at = None

    def finish_drafter_round(self) -> RoundReport:
        """End this rollout's co-training: on the ``steps`` schedule, take the updates the tail left undone; then
        report the rollout's totals and the live drafter's held-out top-1 (and reset the totals). Never raises: a
        failure is in the report's ``failures`` (``"<worker id>: <error>"``), the round's training is dropped (no
        trained copy is left to publish) and the live drafter stays as it was."""
        if self.cotraining is None:
            return RoundReport()
        with self._training():
            return self._finish_round()

    def _finish_round(self) -> RoundReport:
        extra = self.train_drafter_slice(float("inf")) if self.config.schedule.deterministic else SliceMetrics()
        self._training_at = time.monotonic()  # the held-out measure runs next
        with self._train_lock:
            with self._lock:  # the rollout's sequences: its held-out set for the measure below, the rest for slices
                self.cotraining.commit()
            try:
                report = self._round_report(extra)
            except Exception as err:  # a round reports its failure, it never raises into rollouts
                earlier = [self._failure(extra.error)] if extra.error is not None else []
                report = self._failed_round(extra.seconds, earlier, err)
            report.buffer_sequences = self.cotraining.buffer.num_sequences
        return report

    def _round_report(self, extra: SliceMetrics) -> RoundReport:
        """The rollout's totals (reset) and the live drafter's held-out top-1, or ``extra``'s failure."""
        report = self.cotraining.take_round()
        report.failures = [self._failure(f) for f in report.failures]
        report.seconds = extra.seconds
        if extra.error is not None:
            report.failures.append(self._failure(extra.error))
        else:
            with self._lock:
                report.heldout_tokens, report.heldout_top1_sum = self.cotraining.heldout_top1(self.drafter)
        return report

    def _failed_round(self, seconds: float, failures: list[str], err: Exception) -> RoundReport:
        """A round that failed with ``err``: its training copy and totals are dropped (nothing of it is published)
        and the report holds no totals, only ``failures`` and this one."""
        self.cotrainer.invalidate()
        self.cotrainer.take_rollout_totals()  # when take_round itself failed: they must not reach the next round
        return RoundReport(seconds=seconds, failures=[*failures, self._failure(describe(err))])

    def _failure(self, error: str) -> str:
        """A co-training failure line as every report gives it: ``"<worker id>: <error>"``."""
        return f"{self.worker_id}: {error}"

    def heldout_top1(self) -> tuple[int, float]:
        """(tokens, summed top-1) of the live drafter on the newest held-out features ((0, 0.0) without any). Never
        raises: a failing measure is logged and counts no tokens."""
        if self.cotraining is None:
            return 0, 0.0
        with self._train_lock, self._lock:
            try:
                return self.cotraining.heldout_top1(self.drafter)
            except Exception as err:  # a co-training measure never raises into rollouts
                LOG.warning("%s: held-out top-1 measure failed: %s", self.worker_id, describe(err))
                return 0, 0.0

    def trained_drafter(self) -> TrainedDrafter | None:
        """The weights co-trained since the live drafter last changed (None when no step was taken). A copy that
        cannot be handed over (an allocation that fails) is dropped before the error is raised: the next round
        starts afresh instead of failing the same way."""
        if self.cotrainer is None:
            return None
        with self._train_lock:
            try:
                trained = self.cotrainer.trained()
            except Exception:
                self.cotrainer.invalidate()
                raise
        return trained if trained is not None and trained.base_version == self.drafter_version else None

    def cotrain_state(self) -> CotrainState | None:
        """Buffer, held-out set, optimiser and step counters at the last step boundary, for a checkpoint (None when
        co-training is off)."""
        if self.cotraining is None:
            return None
        with self._train_lock, self._lock:
            return self.cotraining.state()

    def load_cotrain_state(self, state: CotrainState) -> None:
        """Restore ``cotrain_state()`` (after the checkpoint's drafter was loaded)."""
        if self.cotraining is None:
            raise ValueError(f"worker {self.worker_id} runs without co-training (drafter.cotrain=false)")
        with self._train_lock, self._lock:
            self.cotraining.load_state(self.drafter, self.drafter_version, state)

    def _rng_devices(self) -> list[int]:
        device = torch.device(self.config.engine.device)
        return [device.index or 0] if device.type == "cuda" else []

    # ---- reports ----------------------------------------------------------------------------------------------
    def stats(self) -> WorkerStats:
        with self._lock:
            totals = self._round_totals
            return WorkerStats(
                worker_id=self.worker_id,
                policy_version=self.policy_version,
                drafter_version=self.drafter_version,
                requests_served=self._served,
                running_requests=len(self._running),
                rounds=totals.rounds,
                tokens_emitted=totals.emitted,
                mean_batch_size=totals.mean_batch_size,
                mean_accept_length=totals.mean_accept_length,
                strategy_rounds=dict(self._strategy_rounds),
                buffer_sequences=self.buffer.num_sequences + (self.cotraining.pending if self.cotraining else 0),
                buffer_tokens=self.buffer.num_tokens,
                cotrain_steps=self.cotrainer.total_steps if self.cotrainer is not None else 0,
                memory_released=sorted(self.engine.memory_released),
            )

    def health(self, error: str | None = None, stalled_s: float = 0.0) -> WorkerHealth:
        """Counts only (no engine lock: a report must answer while a long engine step or drafter step runs)."""
        at = self._training_at
        training = 0.0 if at is None else time.monotonic() - at
        return WorkerHealth(self.worker_id, error is None, len(self._running), error, stalled_s, training)


def abort_ids(request_ids: object) -> list[str] | None:
    """The ids an abort names, as a list (None: every request); ValueError for one id given bare (a string would
    be read as its characters) or anything else that is not a collection of ids."""
    if request_ids is None:
        return None
    if isinstance(request_ids, (str, bytes)) or not hasattr(request_ids, "__iter__"):
        raise ValueError(f"abort: request_ids must be a list of ids or None, got {type(request_ids).__name__}")
    return list(request_ids)


def describe(err: Exception) -> str:
    """``"<ErrorType>: <message>"``, how co-training failures are reported."""
    return f"{type(err).__name__}: {err}"


def load_policy_weights(model: CausalLM, state: dict[str, Tensor]) -> None:
    """Copy ``state`` into ``model`` in place (parameters keep their identity; tied weights stay tied).
    ValueError listing missing, unexpected, mis-shaped, non-floating-point or non-finite tensors."""
    tensors = {k: v for k, v in state.items() if not k.endswith(IGNORED_SUFFIXES)}
    check_weights(tensors, "pushed policy weights")
    if model.config.tie_word_embeddings:
        drop_tied_copy(tensors, "pushed policy weights")
    check_tensors(model, tensors, "pushed policy weights")
    check_cast(model, tensors, "pushed policy weights")
    with torch.no_grad():
        model.load_state_dict(tensors, strict=False)
    model.tie_weights()
