"""What crosses the boundary between the RL trainer and the rollout system."""

from __future__ import annotations

from dataclasses import dataclass, field

from fastrl.sampling.params import SamplingParams


@dataclass
class RolloutRequest:
    """One sample to generate. `group` is the index of its prompt in the GRPO batch (n samples share a group)."""

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    group: int = 0


@dataclass
class RolloutResult:
    """One generated sample, with the versions of the weights that produced it. ``error`` is set (and
    ``finish_reason`` is ``"error"``) when the request was invalid, e.g. a prompt longer than the context.
    ``drafted_tokens``, ``accepted_tokens``: the draft tokens its rounds proposed to it and those their
    verification accepted (``RequestOutput``'s)."""

    request_id: str
    group: int
    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    accept_lengths: list[int]
    worker_id: str
    policy_version: int
    drafter_version: int
    latency_s: float
    error: str | None = None
    drafted_tokens: int = 0
    accepted_tokens: int = 0


@dataclass
class WorkerTiming:
    """How one worker spent a rollout: busy generating, then idle (while others ran the tail), and the drafter
    co-training its idle time started (seconds and steps of its tail slices; without ``overlap_drafter_round`` a
    slice that outran the tail counts once its step ends, with it the batch counts only the slices done within)."""

    worker_id: str
    requests: int
    busy_s: float
    idle_s: float
    cotrain_s: float = 0.0
    cotrain_steps: int = 0


@dataclass
class DrafterTrainingStats:
    """Co-training during one rollout (empty when no worker trained): optimiser steps summed over workers, the
    token-weighted training loss and top-1, the wall seconds spent, and the drafter's top-1 agreement with the
    policy on the rollout's held-out features before and after the rollout's update (None without held-out data)."""

    steps: int = 0
    tokens: int = 0
    loss: float | None = None
    top1: float | None = None
    seconds: float = 0.0
    failures: list[str] = field(default_factory=list)
    heldout_top1_before: float | None = None
    heldout_top1: float | None = None
    heldout_tokens: int = 0


@dataclass
class RoundRecord:
    """One decode round of one worker (the adaptive policy's view), for telemetry."""

    worker_id: str
    strategy: str
    batch_size: int
    mean_accept_length: float
    emitted_tokens: int
    wall_time_s: float
    plain_time_estimate_s: float = 0.0  # RoundStats.plain_time_estimate_s (0: no estimate)


@dataclass
class WorkerReplacement:
    """A rollout worker that was lost and replaced. ``rollout``: the manager's rollout index (0-based; the trainer's
    step when it runs one rollout per step) during or before which it was lost; ``reason``: why (died, hung, failed);
    ``rerun_request_ids``: its unfinished requests, re-run elsewhere; ``cotrain_sequences_lost``: co-training
    sequences (the hidden states of the requests it had served this rollout) that died with it;
    ``replacement_id``: the fresh worker in its slot (None when ``restart_failed_workers`` is off)."""

    worker_id: str
    rollout: int
    reason: str
    rerun_request_ids: list[str] = field(default_factory=list)
    cotrain_sequences_lost: int = 0
    replacement_id: str | None = None


@dataclass
class RolloutBatch:
    """Results in request order plus how the rollout went."""

    results: list[RolloutResult]
    wall_time_s: float
    tail_time_s: float  # from the moment the first worker ran out of work to the end
    workers: list[WorkerTiming]
    rounds: list[RoundRecord]
    drafter: DrafterTrainingStats
    drafter_version: int
    retried_requests: int = 0
    replacements: list[WorkerReplacement] = field(default_factory=list)


DRAFT_VOCAB_KEY = "draft_vocab"  # a drafter state's entry for its reduced draft vocabulary (ids, not a weight)
EXTRA_LAYERS_KEY = "extra_layers"  # a fused drafter state's policy layers ([m-1] long, not a weight)
