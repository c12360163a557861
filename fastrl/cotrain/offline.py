"""Offline drafter training: stream the policy's rollouts of training prompts into the drafter, measure it on
held-out prompts (loss, top-1 and accept length after every epoch, accept lengths per strategy at the end)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from fastrl.cotrain.accept_eval import AcceptResult, accept_text, measure_rounds
from fastrl.cotrain.drafter_trainer import MAX_SEED, DrafterTrainer, DrafterTrainerConfig
from fastrl.cotrain.features import policy_features
from fastrl.cotrain.rollout_plan import GREEDY_PASS, RolloutPlan, RolloutShards, cast_copy
from fastrl.cotrain.stream_trainer import Canonical, EpochReport, StreamRun, open_stream
from fastrl.engine.config import ENGINE_DTYPES, check_dtype, default_dtype
from fastrl.engine.engine import GenerateInput
from fastrl.models.decoder import CausalLM
from fastrl.rl.seeding import ACCEPT_STREAM, derive_seed
from fastrl.rl.tasks.task import ArithChainTask
from fastrl.sampling.params import SamplingParams
from fastrl.speculative.drafter import EagleDrafter
from fastrl.speculative.fused_drafter import check_extra_layers
from fastrl.strategy.round_stats import RoundTotals
from fastrl.strategy.strategy import Strategy, check_strategy_names

# Settings a resumed run may change: they choose how the drafter is measured, or where and how fast rollouts run,
# not what they are (gen_batch_size: the same rollouts in float32; in bfloat16 another batch composition rounds
# otherwise, and a few of its rollouts, equally the policy's, differ, as the held-out ones a restart generates again).
RESUMABLE_KEYS = ("accept_strategies", "accept_requests", "accept_batch_size", "device", "gen_batch_size")


@dataclass
class OfflineDrafterConfig:
    """What to generate, how long to train, and how to measure."""

    num_prompts: int = 1024
    eval_prompts: int = 64
    temperature: float = 1.0
    rollout_temperatures: list[float] = field(default_factory=list)  # one pass per temperature; [] = [temperature]
    samples_per_prompt: int = 1
    max_new_tokens: int = 1024
    gen_batch_size: int = 64
    shard_requests: int = 256  # requests generated, featurized and trained on at a time (bounds memory)
    epochs: int = 4
    seed: int = 0
    accept_strategies: list[str] = field(default_factory=lambda: ["3_1_4", "8_4_32"])
    accept_requests: int = 16
    accept_batch_size: int = 16
    device: str = "cpu"
    rollout_dtype: str = ""  # what rollouts and accept lengths run in; "" = bfloat16 on a GPU, float32 on a CPU
    draft_vocab_size: int = 0  # > 0: draft over the K most frequent tokens of the first shard's rollouts
    extra_layers: list[int] = field(default_factory=list)  # EAGLE-3 fused input: these decoder layers + the last
    trainer: DrafterTrainerConfig = field(default_factory=DrafterTrainerConfig)

    def __post_init__(self) -> None:
        positive = ("num_prompts", "eval_prompts", "samples_per_prompt", "shard_requests", "epochs", "accept_requests")
        for key in positive + ("accept_batch_size", "gen_batch_size"):
            if getattr(self, key) < 1:
                raise ValueError(f"train_drafter.{key} must be >= 1, got {getattr(self, key)}")
        if not 0 <= self.seed < MAX_SEED:  # the rollouts' seeds derive from it (RolloutPlan.request): int64 range
            raise ValueError(f"train_drafter.seed must be an integer in [0, 2**40), got {self.seed}")
        if self.rollout_dtype:
            check_dtype("train_drafter.rollout_dtype", self.rollout_dtype)
        try:
            check_extra_layers(tuple(self.extra_layers))
        except ValueError as err:
            raise ValueError(f"train_drafter.{err}") from None
        # checked before any rollout: a bad one would end the run after training
        check_strategy_names("train_drafter.accept_strategies", self.accept_strategies)
        if any(Strategy.parse(name).is_disabled for name in self.accept_strategies):
            raise ValueError("train_drafter.accept_strategies: 'disable' drafts nothing; name speculative ones")
        history = [name for name in self.accept_strategies if not Strategy.parse(name).uses_drafter]
        if history:
            raise ValueError(
                f"train_drafter.accept_strategies: {history} draft from the rollouts' history, not from the drafter "
                "this measures; name EAGLE strategies (a hybrid S_K_N+suffix_M is taken)"
            )
        given = {"rollout_temperatures": list(self.rollout_temperatures), "temperature": [self.temperature]}
        for key, values in given.items():
            bad = [t for t in values if isinstance(t, bool) or not isinstance(t, int | float) or not 0 <= t < math.inf]
            if bad:  # each named by its own key (an infinite rollout temperature was blamed on `temperature`)
                raise ValueError(f"train_drafter.{key} must be finite numbers >= 0, got {bad[0]!r}")
        repeated = sorted({t for t in self.rollout_temperatures if list(self.rollout_temperatures).count(t) > 1})
        if repeated:  # a second pass at one temperature: the same rollouts again at T=0, generated and trained twice
            raise ValueError(
                f"train_drafter.rollout_temperatures names {repeated} more than once; for more rollouts a prompt at "
                "one temperature, raise samples_per_prompt"
            )

    @property
    def temperatures(self) -> list[float]:
        return list(self.rollout_temperatures) or [self.temperature]

    @property
    def engine_dtype(self) -> str:
        """The dtype rollouts and accept lengths run in: `rollout_dtype`, else what an RL rollout on the device
        runs in (bfloat16 on a GPU, float32 on a CPU). Features and training stay in the policy's own dtype."""
        return self.rollout_dtype or default_dtype(self.device)


@dataclass
class OfflineDrafterReport:
    """Per-epoch held-out evaluation and the final accept lengths (per strategy and temperature); the training
    sequences and tokens of one epoch (each epoch passes over the same ones)."""

    epochs: list[EpochReport]
    accept_lengths: list[AcceptResult]
    train_sequences: int
    train_tokens: int


def task_prompts(tokenizer: Any, count: int, seed: int) -> list[list[int]]:
    """`count` prompts of the bundled arithmetic task, drawn with `seed`."""
    task, rng = ArithChainTask(), random.Random(seed)
    return [tokenizer(task.sample_problem(rng).prompt)["input_ids"] for _ in range(count)]


def accept_inputs(prompts: list[list[int]], temperature: float, cfg: OfflineDrafterConfig) -> list[GenerateInput]:
    """The held-out requests accept length is measured on, their seeds drawn apart from every rollout's (seeds 0..n-1
    were the first training rollouts' own: a held-out prompt of the same length drew the same noise at every
    position, a near twin of a response the drafter trained on)."""
    return [
        GenerateInput(
            p,
            SamplingParams(
                max_new_tokens=cfg.max_new_tokens, temperature=temperature, seed=derive_seed(cfg.seed, ACCEPT_STREAM, i)
            ),
        )
        for i, p in enumerate(prompts[: cfg.accept_requests])
    ]


def fingerprint(cfg: OfflineDrafterConfig, extra: dict) -> dict:
    """The settings a resumed run must share with the run it resumes."""
    raw = dataclasses.asdict(cfg) | {"rollout_dtype": cfg.engine_dtype}  # the device is resumable, its dtype not
    return {**{k: v for k, v in raw.items() if k in {f.name for f in dataclasses.fields(OfflineDrafterConfig)}
               and k not in RESUMABLE_KEYS}, **extra}  # fmt: skip


def token_digest(prompts: list[list[int]]) -> str:
    """A digest of the training prompts' token ids: a resume notices a prompts file, chat template or tokenizer that
    changed since the stream's shards were generated (its path and count alone did not)."""
    return hashlib.sha256(json.dumps(prompts, separators=(",", ":")).encode()).hexdigest()


def nothing_to_train(kind: str, rollouts: int, cfg: OfflineDrafterConfig) -> ValueError:
    """The error of a run whose rollouts leave the loss no position (each is its prompt and a response that stopped
    at once, or max_new_tokens=1)."""
    return ValueError(
        f"train_drafter: the {rollouts} {kind} rollouts leave no position to train on (a drafter learns from a "
        f"sequence's tokens after its first two; max_new_tokens={cfg.max_new_tokens} and the responses' early stops "
        "leave none): raise max_new_tokens or give longer prompts"
    )


def train_offline(
    policy: CausalLM,
    drafter: EagleDrafter,
    train_prompts: list[list[int]],
    held_prompts: list[list[int]],
    cfg: OfflineDrafterConfig,
    stream_dir: str | Path,
    policy_name: str,
    identity: dict | None = None,
    canonical: Canonical | None = None,
) -> OfflineDrafterReport:
    """Stream rollouts of `train_prompts` (samples_per_prompt each, one pass per rollout temperature) into
    `drafter` (trained in place) for cfg.epochs, resuming from `stream_dir` when it holds this run; held-out
    rollouts of `held_prompts` for loss and top-1, accept length on them after each epoch (first strategy, at
    `temperature`) and at the end (every strategy, T=0 and T=`temperature`). `identity`: what else a resumed run
    must match (the prompts' source, the initial drafter); `canonical`: how a saved stream's settings read now
    (``stream_trainer.check_settings``). A stream of other settings is refused before any rollout."""
    torch.manual_seed(cfg.seed)
    temperatures = cfg.temperatures
    dtype = cfg.engine_dtype
    plan = RolloutPlan(train_prompts, temperatures, cfg.samples_per_prompt, cfg.max_new_tokens, cfg.seed, dtype)
    shards = RolloutShards(plan, cfg.shard_requests, Path(stream_dir))
    prompts = {"prompts": len(train_prompts), "prompt_ids_sha256": token_digest(train_prompts)}
    if any(plan.samples_at(t) < plan.samples for t in temperatures):  # a greedy pass drew them all before
        prompts["greedy_pass"] = GREEDY_PASS
    settings = fingerprint(cfg, {**prompts, **(identity or {})})
    open_stream(shards, settings, canonical)  # refused before the held-out rollouts; run.run checks it again
    held_plan = RolloutPlan(held_prompts, temperatures, 1, cfg.max_new_tokens, cfg.seed + 1, dtype)
    rollout_policy = cast_copy(policy, ENGINE_DTYPES[dtype])  # once: the policy is frozen
    held_ids = held_plan.generate(rollout_policy, range(len(held_plan)), cfg.gen_batch_size, cfg.device)
    measured = min(cfg.accept_requests, len(held_prompts))
    fewer = f" (accept_requests={cfg.accept_requests}: there are no more)" if measured < cfg.accept_requests else ""
    print(
        f"{len(plan)} training requests in {shards.count} shards, {len(held_ids)} held out; accept length on "
        f"{measured} held-out prompts{fewer}",
        flush=True,
    )
    if not any(len(ids) > 2 for ids in held_ids):  # the loss learns from a sequence's tokens after its first two
        raise nothing_to_train("held-out", len(held_ids), cfg)
    trainer = DrafterTrainer(drafter, policy, dataclasses.replace(cfg.trainer))

    def epoch_accept() -> float:
        inputs = accept_inputs(held_prompts, cfg.temperature, cfg)
        return measure(rollout_policy, drafter, held_plan, inputs, cfg.accept_strategies[0], cfg).mean_accept_length

    held_features = [s for s in policy_features(policy, held_ids, extra_layers=drafter.extra_layers) if s.finite]
    if dropped := len(held_ids) - len(held_features):  # evaluation refuses a non-finite loss, as training does
        print(f"train-drafter: {dropped} held-out rollouts' policy features are not finite: left out", flush=True)
    run = StreamRun(
        policy, trainer, shards, held_features, epoch_accept, cfg.epochs, cfg.draft_vocab_size,
        cfg.gen_batch_size, cfg.device, policy_name, rollout_policy, canonical,
    )  # fmt: skip
    state = run.run(settings)
    if state.tokens == 0:
        raise nothing_to_train("training", len(plan), cfg)
    accept = []
    for temperature in dict.fromkeys((0.0, cfg.temperature)):  # once at T=0 when that is the run's too
        inputs = accept_inputs(held_prompts, temperature, cfg)
        for strategy in cfg.accept_strategies:
            totals = measure(rollout_policy, drafter, held_plan, inputs, strategy, cfg)
            accept.append(AcceptResult(strategy, temperature, totals.mean_accept_length, totals.mean_accepted_drafts))
            print(f"accept length {strategy} T={temperature}: {accept_text(totals.mean_accept_length)}", flush=True)
    return OfflineDrafterReport(state.epochs, accept, len(plan), state.tokens // max(1, cfg.epochs))


def measure(
    policy: CausalLM,
    drafter: EagleDrafter,
    plan: RolloutPlan,
    inputs: list[GenerateInput],
    strategy: str,
    cfg: OfflineDrafterConfig,
) -> RoundTotals:
    """The decode rounds of `strategy` on `inputs` (``measure_rounds``), in an engine sized like the plan's and in
    its dtype (on copies of the policy and the drafter in training where that dtype is not theirs: an engine casts
    what it is given)."""
    config = plan.engine_config(max(1, min(cfg.accept_batch_size, len(inputs))), cfg.device)
    dtype = config.torch_dtype
    return measure_rounds(cast_copy(policy, dtype), cast_copy(drafter, dtype), inputs, strategy, config)
