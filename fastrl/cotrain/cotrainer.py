"""Time-sliced drafter co-training on a private copy of a worker's live drafter, and merging the copies."""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from fastrl.cotrain.drafter_trainer import DrafterMetrics, DrafterTrainer, DrafterTrainerConfig
from fastrl.cotrain.feature_sequence import FeatureSequence
from fastrl.models.decoder import CausalLM
from fastrl.speculative.drafter import EagleDrafter


@dataclass
class SliceMetrics:
    """What one co-training slice did. ``error`` is set when it failed (its training is then discarded);
    ``skipped`` names why it did nothing (e.g. an empty buffer); ``stopped`` when it was asked to end early."""

    steps: int = 0
    tokens: int = 0
    loss: float | None = None
    top1: float | None = None
    seconds: float = 0.0
    error: str | None = None
    skipped: str | None = None
    stopped: bool = False


@dataclass
class TrainedDrafter:
    """Weights a worker trained since it last received a drafter: the published ``base_version`` plus ``steps``
    optimiser steps over ``tokens`` entries. ``state`` holds CPU float32 tensors."""

    state: dict[str, Tensor]
    steps: int
    tokens: int
    base_version: int


@dataclass
class RolloutTotals:
    """Steps a worker took since its last ``take_rollout_totals``, with token-weighted sums of loss and top-1
    added step by step (so the sums do not depend on how the steps were split into slices)."""

    steps: int = 0
    tokens: int = 0
    loss_sum: float = 0.0
    top1_sum: float = 0.0
    failed: bool = False

    def add(self, metrics: DrafterMetrics) -> None:
        self.steps += 1
        self.tokens += metrics.tokens
        self.loss_sum += metrics.loss * metrics.tokens
        self.top1_sum += metrics.top1 * metrics.tokens


TRAIN_DTYPE = torch.float32
"""The training copy's dtype, whatever the engine's: float64 rollouts (CPU) would double every step's cost, bf16
ones (GPU) would lose AdamW's small updates; what is published is float32 either way (``trained``)."""


class CoTrainer:
    """Trains a float32 copy of the live drafter in short slices; the live drafter (used by rollouts) is never
    touched.

    ``prepare(live, version)`` makes the copy start from the live weights whenever the live version changed (the
    optimiser state is kept across versions). ``train_slice`` runs DrafterTrainer steps until its time is up, the
    caller asks it to stop, or the data runs out; any exception (or a non-finite loss or weight) is reported in the
    slice's metrics and discards the copy, so a failed slice can never publish broken weights.
    """

    def __init__(self, policy: CausalLM, config: DrafterTrainerConfig) -> None:
        self.policy = policy
        self.config = config
        self._drafter: EagleDrafter | None = None
        self._trainer: DrafterTrainer | None = None
        self._base_version: int | None = None
        self.round_steps = 0
        self.round_tokens = 0
        self.total_steps = 0
        self.rollout = RolloutTotals()

    def prepare(self, live: EagleDrafter, version: int) -> None:
        """Copy the live weights and draft vocabulary (not in the state dict: a buffer that is not persistent) into
        the training copy unless it already trains on top of ``version``."""
        if self._drafter is not None and self._base_version == version:
            return
        if self._drafter is None:
            self._drafter = copy.deepcopy(live).to(TRAIN_DTYPE)
            self._trainer = None
        else:
            with torch.no_grad():
                self._drafter.load_state_dict(live.state_dict())
            self._drafter.set_draft_vocab(None if live.draft_vocab is None else live.draft_vocab.clone())
        self._base_version = version
        self.round_steps = 0
        self.round_tokens = 0

    def invalidate(self) -> None:
        """Drop the copy and its optimiser (after a failure); the next ``prepare`` starts afresh."""
        self._drafter = None
        self._trainer = None
        self._base_version = None
        self.round_steps = 0
        self.round_tokens = 0

    def train_slice(
        self,
        next_batch: Callable[[int], list[FeatureSequence]],
        seconds: float,
        should_stop: Callable[[], bool] = lambda: False,
        max_steps: int | None = None,
    ) -> SliceMetrics:
        """Train until ``seconds`` pass, ``should_stop()``, or ``max_steps`` steps are taken (None: no cap).
        ``next_batch(k)`` supplies the sequences of step ``k`` (``total_steps`` counts the steps taken before it,
        whatever slice they were in); it is called right before the step, so it may also seed the step's noise."""
        start = time.perf_counter()
        steps: list[DrafterMetrics] = []
        stopped = False
        try:
            if self._drafter is None:
                raise RuntimeError("CoTrainer.train_slice called before prepare()")
            if self._trainer is None:
                self._trainer = DrafterTrainer(self._drafter, self.policy, self.config)
            while time.perf_counter() - start < seconds and (max_steps is None or len(steps) < max_steps):
                if should_stop():
                    stopped = True
                    break
                batch = next_batch(self.total_steps + len(steps))
                if not batch:
                    break
                metrics = self._trainer.train_step(batch)  # FloatingPointError on a non-finite loss
                steps.append(metrics)
                self.rollout.add(metrics)
            if steps:
                self._trainer.check_finite()
        except Exception as err:  # a slice reports its failure, it never raises into rollouts
            self.invalidate()
            self.rollout.failed = True
            return SliceMetrics(seconds=time.perf_counter() - start, error=f"{type(err).__name__}: {err}")
        seconds_used = time.perf_counter() - start
        if not steps:
            skipped = None if stopped else "no training data"
            return SliceMetrics(seconds=seconds_used, skipped=skipped, stopped=stopped)
        tokens = sum(m.tokens for m in steps)
        self.round_steps += len(steps)
        self.round_tokens += tokens
        self.total_steps += len(steps)
        return SliceMetrics(
            steps=len(steps),
            tokens=tokens,
            loss=sum(m.loss * m.tokens for m in steps) / max(tokens, 1),
            top1=sum(m.top1 * m.tokens for m in steps) / max(tokens, 1),
            seconds=seconds_used,
            stopped=stopped,
        )

    def take_rollout_totals(self) -> RolloutTotals:
        """The steps taken since the last call (and reset them)."""
        totals, self.rollout = self.rollout, RolloutTotals()
        return totals

    def state(self) -> tuple[dict[str, Tensor], dict]:
        """What an exact resume needs besides the live drafter: the optimiser's tensors (``optim.<param>.<key>``)
        and a JSON-serialisable dict (step counters, base version, the optimiser's scalars and param groups).
        The copy's weights are not kept: they equal the live drafter's until a step is taken in a new round."""
        meta: dict = {"total_steps": self.total_steps, "base_version": self._base_version, "has_trainer": False}
        tensors: dict[str, Tensor] = {}
        if self._trainer is not None:
            opt = self._trainer.optimizer.state_dict()
            scalars: dict[str, dict] = {}
            for pid, entries in opt["state"].items():
                for key, value in entries.items():
                    if isinstance(value, Tensor):
                        tensors[f"optim.{pid}.{key}"] = value.detach().to("cpu").clone().contiguous()
                    else:
                        scalars.setdefault(str(pid), {})[key] = value
            meta.update(
                has_trainer=True,
                trainer_steps=self._trainer.step_count,
                param_groups=opt["param_groups"],
                scalars=scalars,
            )
        return tensors, meta

    def load_state(self, live: EagleDrafter, version: int, tensors: dict[str, Tensor], meta: dict) -> None:
        """Restore ``state()`` on top of the live drafter at ``version`` (the copy starts from its weights)."""
        self.invalidate()
        self.total_steps = int(meta["total_steps"])
        if not meta.get("has_trainer"):
            return
        self.prepare(live, version)
        if self._drafter is None:
            raise RuntimeError("CoTrainer.load_state: prepare() made no copy")
        self._trainer = DrafterTrainer(self._drafter, self.policy, self.config)
        self._trainer.step_count = int(meta["trainer_steps"])
        state: dict[int, dict] = {}
        for name, tensor in tensors.items():
            if name.startswith("optim."):
                _, pid, key = name.split(".", 2)
                state.setdefault(int(pid), {})[key] = tensor
        for pid, entries in meta["scalars"].items():
            state.setdefault(int(pid), {}).update(entries)
        groups = [dict(g, betas=tuple(g["betas"])) if "betas" in g else g for g in meta["param_groups"]]
        self._trainer.optimizer.load_state_dict({"state": state, "param_groups": groups})

    def trained(self) -> TrainedDrafter | None:
        """The copy's weights when it trained since the last ``prepare``; None otherwise."""
        if self._drafter is None or self._base_version is None or self.round_steps == 0:
            return None
        state = {k: v.detach().to("cpu", torch.float32).clone() for k, v in self._drafter.state_dict().items()}
        return TrainedDrafter(state, self.round_steps, self.round_tokens, self._base_version)


def non_finite_key(state: dict[str, Tensor]) -> str | None:
    """The first floating tensor of ``state`` holding a NaN or an infinity (None: all finite)."""
    return next((k for k, v in state.items() if v.is_floating_point() and not bool(torch.isfinite(v).all())), None)


def mergeable(copies: dict[str, TrainedDrafter], version: int) -> tuple[dict[str, TrainedDrafter], list[str]]:
    """The copies (by holder name, in the dict's order) trained on top of drafter ``version`` with at least one
    step, and one failure line per such copy left out because a tensor is not finite: a diverged copy must never
    be published, and it must not cost the healthy copies their merge."""
    kept, failures = {}, []
    for holder, trained in copies.items():
        if trained.base_version != version or trained.steps <= 0:
            continue
        if (key := non_finite_key(trained.state)) is not None:
            failures.append(f"merge: {holder}'s copy holds non-finite values in {key}: left out")
        else:
            kept[holder] = trained
    return kept, failures


def merge_weights(copies: dict[str, TrainedDrafter]) -> dict[str, Tensor]:
    """``average_drafters`` of ``copies`` weighted by their steps, in the dict's order."""
    return average_drafters([(t.state, float(t.steps)) for t in copies.values()])


def average_drafters(items: list[tuple[dict[str, Tensor], float]]) -> dict[str, Tensor]:
    """Weighted mean of drafter state dicts (weights: e.g. training steps), in the first state's dtypes.

    ValueError when the list is empty, a weight is not positive, the states differ in keys or shapes, or a tensor
    is not finite (a diverged copy must never be published).
    """
    if not items:
        raise ValueError("average_drafters: nothing to average")
    for _, weight in items:
        if not (isinstance(weight, int | float) and math.isfinite(weight) and weight > 0):
            raise ValueError(f"average_drafters: weights must be finite and > 0, got {weight!r}")
    first = items[0][0]
    for state, _ in items:
        if set(state) != set(first):
            raise ValueError(f"average_drafters: key sets differ ({sorted(set(state) ^ set(first))})")
        for k, v in state.items():
            if v.shape != first[k].shape:
                raise ValueError(f"average_drafters: {k} has shape {tuple(v.shape)} vs {tuple(first[k].shape)}")
        if (key := non_finite_key(state)) is not None:
            raise ValueError(f"average_drafters: {key} holds non-finite values")
    total = float(sum(w for _, w in items))
    out: dict[str, Tensor] = {}
    for k, ref in first.items():
        if not ref.is_floating_point():
            out[k] = ref.clone()
            continue
        acc = torch.zeros(ref.shape, dtype=torch.float64)
        for state, weight in items:
            acc += state[k].detach().to("cpu", torch.float64) * (weight / total)
        out[k] = acc.to(ref.dtype)
    return out
