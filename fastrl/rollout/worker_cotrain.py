"""A rollout worker's co-training: its feature buffer, held-out features, the drafter copy it trains, and the
schedule that makes the training reproducible (fastrl.cotrain.schedule)."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from fastrl.cotrain.buffer import FeatureBuffer, sequences_from_state, sequences_state
from fastrl.cotrain.cotrainer import CoTrainer, SliceMetrics
from fastrl.cotrain.drafter_trainer import make_batches
from fastrl.cotrain.eagle_loss import eagle_loss
from fastrl.cotrain.feature_sequence import FeatureBatch, FeatureSequence
from fastrl.cotrain.schedule import BATCH_STREAM, NOISE_STREAM, CotrainSchedule, step_seed
from fastrl.models.decoder import CausalLM
from fastrl.speculative.drafter import EagleDrafter


@dataclass
class RoundReport:
    """One worker's co-training in one rollout: steps and token-weighted sums of loss / top-1 over them (in step
    order), and the live drafter's top-1 on the rollout's held-out features (sums over ``heldout_tokens``)."""

    steps: int = 0
    tokens: int = 0
    loss_sum: float = 0.0
    top1_sum: float = 0.0
    heldout_tokens: int = 0
    heldout_top1_sum: float = 0.0
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0  # wall time of the updates taken after the tail (not reproducible)
    buffer_sequences: int = 0  # the worker's buffer after the round (what its loss before the next one costs)


@dataclass(frozen=True)
class _Boundary:
    """What a worker's co-training held at a step boundary (its last policy push)."""

    sequences: list[FeatureSequence]
    heldout: list[FeatureSequence]
    heldout_version: int
    trainer: tuple[dict[str, Tensor], dict]


@dataclass
class CotrainState:
    """A worker's co-training state for a checkpoint: tensors (buffer ``buffer.*``, held-out set ``heldout.*``,
    optimiser ``optim.*``) and a JSON-serialisable dict (their layouts, step counters, optimiser scalars)."""

    tensors: dict[str, Tensor]
    meta: dict


class WorkerCoTraining:
    """Buffer, held-out set and trainer of one worker (slot ``worker_index``). Not thread-safe on its own: the
    EngineWorker serialises access (``lock`` guards the buffer against the stepping loop)."""

    def __init__(
        self,
        policy: CausalLM,
        buffer: FeatureBuffer,
        cotrainer: CoTrainer,
        schedule: CotrainSchedule,
        seed: int,
        worker_index: int = 0,
    ) -> None:
        self.policy = policy
        self.buffer = buffer
        self.cotrainer = cotrainer
        self.schedule = schedule
        self.seed = seed
        self.worker_index = worker_index
        self._pending: list[tuple[str, FeatureSequence, bool]] = []  # (request id, features, held out)
        self._non_finite = 0  # sequences dropped for a non-finite feature since the last round report
        self._heldout: list[FeatureSequence] = []
        self._heldout_version = -1
        self._boundary: _Boundary | None = None

    # ---- data -------------------------------------------------------------------------------------------------
    def add(self, request_id: str, seq: FeatureSequence, prompt: Sequence[int]) -> None:
        """Keep a finished request's features until the next commit (those of a held-out ``prompt`` go to the
        held-out set)."""
        self._pending.append((request_id, seq, self.schedule.is_heldout(prompt)))

    def commit(self) -> None:
        """Move pending sequences into the buffer (or the held-out set) in request-id order, so the buffer's order
        does not depend on which request finished first."""
        for _, seq, heldout in sorted(self._pending, key=lambda item: item[0]):
            if not seq.finite:  # one NaN would fail every slice (or held-out measure) that reads it
                self._non_finite += 1
            elif heldout:
                if seq.policy_version > self._heldout_version:
                    self._heldout, self._heldout_version = [], seq.policy_version
                self._heldout.append(seq)
            else:
                self.buffer.add(seq)
        self._pending.clear()

    def discard(self, request_ids: Sequence[str]) -> None:
        """Unstage the pending features of ``request_ids`` (a call that failed: its results were never returned,
        and a retry stages them again)."""
        dropped = set(request_ids)
        self._pending = [item for item in self._pending if item[0] not in dropped]

    @property
    def pending(self) -> int:
        return len(self._pending)

    # ---- training ---------------------------------------------------------------------------------------------
    def train(
        self,
        live: EagleDrafter,
        version: int,
        seconds: float,
        should_stop: Callable[[], bool],
        rng_devices: list[int],
    ) -> SliceMetrics:
        """One slice: at most ``seconds``, and (``steps`` mode) at most the steps still due this rollout."""
        due = self.schedule.quota(self.cotrainer.rollout.steps)
        if due == 0:
            return SliceMetrics(skipped="this rollout's updates are done")
        if self.cotrainer.rollout.failed:
            return SliceMetrics(skipped="a slice failed this rollout")
        with torch.random.fork_rng(devices=rng_devices):  # training noise stays private
            self.cotrainer.prepare(live, version)
            return self.cotrainer.train_slice(self._next_batch, seconds, should_stop, max_steps=due)

    def _next_batch(self, step: int) -> list[FeatureSequence]:
        """The batch of the worker's step ``step``, and its noise seed: both from (seed, worker slot, step)."""
        torch.manual_seed(step_seed(self.seed, NOISE_STREAM, self.worker_index, step))
        rng = random.Random(step_seed(self.seed, BATCH_STREAM, self.worker_index, step))
        return self.buffer.sample(self.cotrainer.config.max_tokens_per_batch, rng)

    def take_round(self) -> RoundReport:
        """This rollout's training totals (and reset them); none after a failed slice (its copy was discarded, and
        the failure is in that slice's metrics)."""
        totals = self.cotrainer.take_rollout_totals()
        dropped, self._non_finite = self._non_finite, 0
        failures = [f"{dropped} rollouts' features were not finite: left out of co-training"] if dropped else []
        if totals.failed:
            return RoundReport(failures=failures)
        return RoundReport(totals.steps, totals.tokens, totals.loss_sum, totals.top1_sum, failures=failures)

    @torch.no_grad()
    def heldout_top1(self, drafter: EagleDrafter) -> tuple[int, float]:
        """(tokens, summed top-1 agreement) of ``drafter`` with the policy on the newest held-out features."""
        if not self._heldout:
            return 0, 0.0
        dtype = drafter.fc.weight.dtype
        device = drafter.fc.weight.device
        tokens, top1 = 0, 0.0
        hidden = drafter.config.hidden_size
        for group in make_batches(self._heldout, self.cotrainer.config.max_tokens_per_batch):
            loss = eagle_loss(drafter, self.policy, FeatureBatch.collate(group, device, dtype, target_size=hidden))
            tokens += loss.count
            top1 += float(loss.top1) * loss.count
        return tokens, top1

    # ---- checkpoints ------------------------------------------------------------------------------------------
    def mark_boundary(self) -> None:
        """Remember the state now, at a step boundary (the worker's policy push, after the step's drafter round):
        what ``state()`` returns until the next boundary, so that a checkpoint taken while the next rollout runs or
        after its drafter round, before its update (Ctrl-C), holds none of that rollout's sequences, updates or
        optimiser moments, and resumes exactly as one taken between the steps would."""
        self.commit()
        trainer = self.cotrainer.state()  # the optimiser's tensors are cloned: later steps do not reach them
        self._boundary = _Boundary(self.buffer.sequences(), list(self._heldout), self._heldout_version, trainer)

    def state(self) -> CotrainState:
        """Buffer, held-out set and trainer state at the last step boundary (``mark_boundary``); before the first
        one, now (pending sequences committed first)."""
        boundary = self._boundary
        if boundary is None:
            self.commit()
            current = self.buffer.sequences(), self._heldout, self._heldout_version, self.cotrainer.state()
            boundary = _Boundary(*current)
        buffer_tensors, buffer_meta = sequences_state(boundary.sequences)
        heldout_tensors, heldout_meta = sequences_state(boundary.heldout)
        trainer_tensors, trainer_meta = boundary.trainer
        tensors = {f"buffer.{k}": v for k, v in buffer_tensors.items()}
        tensors.update({f"heldout.{k}": v for k, v in heldout_tensors.items()})
        tensors.update(trainer_tensors)
        meta = {
            "worker_index": self.worker_index,
            "buffer": buffer_meta,
            "heldout": heldout_meta | {"version": boundary.heldout_version},
            "trainer": trainer_meta,
        }
        return CotrainState(tensors, meta)

    def load_state(self, live: EagleDrafter, version: int, state: CotrainState) -> None:
        """Restore ``state()`` (the live drafter must already be the checkpoint's); it is the new boundary. A
        checkpoint without a held-out set (written before it was kept) starts with none."""
        buffer_tensors = {k.split(".", 1)[1]: v for k, v in state.tensors.items() if k.startswith("buffer.")}
        self.buffer.load_state(buffer_tensors, state.meta["buffer"])
        trainer_tensors = {k: v for k, v in state.tensors.items() if k.startswith("optim.")}
        self.cotrainer.load_state(live, version, trainer_tensors, state.meta["trainer"])
        self._pending.clear()
        self._heldout, self._heldout_version = [], -1
        heldout = state.meta.get("heldout")
        if heldout is not None:
            heldout_tensors = {k.split(".", 1)[1]: v for k, v in state.tensors.items() if k.startswith("heldout.")}
            self._heldout = sequences_from_state(heldout_tensors, heldout, "co-training held-out set")
            self._heldout_version = int(heldout.get("version", -1))
        self.mark_boundary()
