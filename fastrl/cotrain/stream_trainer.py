"""Drafter training streamed from generation: shard by shard, rollouts are generated (or read back), turned into
policy features, trained on and dropped; after every shard the run's state is saved so a restart resumes there.

Memory holds one shard's features and the held-out set. Batches and feature noise are seeded by (seed, epoch,
shard), so a resumed run takes exactly the steps an uninterrupted one would.
"""

from __future__ import annotations

import dataclasses
import json
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from fastrl.cotrain.drafter_trainer import DrafterMetrics, DrafterTrainer, make_batches
from fastrl.cotrain.feature_sequence import FeatureSequence
from fastrl.cotrain.features import policy_features
from fastrl.cotrain.rollout_plan import RolloutShards
from fastrl.models.decoder import CausalLM
from fastrl.speculative.draft_vocab import most_frequent_tokens
from fastrl.speculative.drafter_checkpoint import (
    read_draft_vocab,
    read_drafter_info,
    read_drafter_weights,
    save_drafter,
)

STATE_FILE = "state.json"
OPTIMIZER_FILE = "optimizer.pt"
CHECKPOINT_DIR = "drafter"


@dataclass
class EpochReport:
    """Held-out metrics after one epoch, and the held-out accept length (0 when not measured)."""

    metrics: DrafterMetrics
    accept_length: float
    train_tokens: int


@dataclass
class StreamState:
    """Where a streamed run stands: the next (epoch, shard), the trainer's step count, the step budget of the
    learning-rate schedule (fixed after the first shard), tokens trained on, and the finished epochs' reports."""

    fingerprint: dict
    epoch: int = 0
    shard: int = 0
    steps: int = 0
    total_steps: int = 0
    tokens: int = 0
    epochs: list[EpochReport] = field(default_factory=list)

    @classmethod
    def load(cls, directory: Path, fingerprint: dict) -> StreamState | None:
        """The saved state in `directory` (None when there is none); ValueError when it belongs to other settings."""
        path = directory / STATE_FILE
        if not path.is_file():
            return None
        raw = json.loads(path.read_text())
        differ = sorted(
            k for k in set(fingerprint) | set(raw["fingerprint"]) if fingerprint.get(k) != raw["fingerprint"].get(k)
        )
        if differ:
            raise ValueError(
                f"{directory} holds a run with other settings ({', '.join(differ)}): resume with the same ones, or "
                "give another stream_dir"
            )
        epochs = [
            EpochReport(DrafterMetrics(**e["metrics"]), e["accept_length"], e["train_tokens"]) for e in raw["epochs"]
        ]
        return cls(**{**raw, "epochs": epochs})


@dataclass
class StreamRun:
    """One streamed training run: the shards, the trainer, the held-out set and how to measure accept length."""

    policy: CausalLM
    trainer: DrafterTrainer
    shards: RolloutShards
    held_out: list[FeatureSequence]
    accept_length: Callable[[], float]
    epochs: int
    draft_vocab_size: int
    gen_batch_size: int
    device: str
    policy_name: str

    def run(self, fingerprint: dict, stop_after_shards: int | None = None) -> StreamState:
        """Train to the end (or for `stop_after_shards` shards), resuming from the shards' directory when it holds
        this run's state; returns the state reached."""
        directory = self.shards.directory
        state = StreamState.load(directory, fingerprint)
        if state is None:
            state = StreamState(fingerprint)
        else:
            self.restore(state)
        total = self.shards.count * self.epochs
        bar = tqdm(total=total, initial=state.epoch * self.shards.count + state.shard, desc="drafter", unit="shard")
        done = 0
        while state.epoch < self.epochs and (stop_after_shards is None or done < stop_after_shards):
            self.train_shard(state, bar)
            done += 1
            state.shard += 1
            if state.shard == self.shards.count:
                state.epoch, state.shard = state.epoch + 1, 0
                state.epochs.append(self.evaluate(state))
                report = state.epochs[-1]
                bar.write(
                    f"epoch {state.epoch}: held-out loss {report.metrics.loss:.4f}, top-1 {report.metrics.top1:.3f}, "
                    f"accept length {report.accept_length:.2f}, {state.tokens} tokens trained"
                )
            self.save(state)
            bar.update(1)
        bar.close()
        return state

    def train_shard(self, state: StreamState, bar: tqdm) -> None:
        """Generate or read shard `state.shard`, train one pass over it."""
        ids = self.shards.ids(state.shard, self.policy, self.gen_batch_size, self.device)
        drafter = self.trainer.drafter
        if self.draft_vocab_size > 0 and drafter.draft_vocab is None:
            drafter.set_draft_vocab(most_frequent_tokens(ids, self.draft_vocab_size, self.policy.config.vocab_size))
        seqs = policy_features(self.policy, ids, extra_layers=drafter.extra_layers)
        seed = self.trainer.config.seed * 1_000_003 + state.epoch * 10_007 + state.shard
        batches = make_batches(seqs, self.trainer.config.max_tokens_per_batch, random.Random(seed))
        if state.total_steps == 0:  # cosine over the whole run, sized by the first shard
            state.total_steps = self.trainer.config.total_steps or len(batches) * self.shards.count * self.epochs
        self.trainer.config = dataclasses.replace(self.trainer.config, total_steps=state.total_steps)
        torch.manual_seed(seed)
        start, tokens = time.perf_counter(), 0
        for batch in batches:
            metrics = self.trainer.train_step(batch)
            tokens += metrics.tokens
            rate = tokens / max(time.perf_counter() - start, 1e-9)
            bar.set_postfix(
                epoch=state.epoch + 1, loss=f"{metrics.loss:.3f}", top1=f"{metrics.top1:.3f}", tok_s=f"{rate:.0f}"
            )
        state.tokens += tokens
        state.steps = self.trainer.step_count

    def evaluate(self, state: StreamState) -> EpochReport:
        """Held-out loss and top-1, and the held-out accept length."""
        return EpochReport(self.trainer.evaluate(self.held_out), self.accept_length(), state.tokens)

    def save(self, state: StreamState) -> None:
        """The drafter, the optimizer and the state, the state last (it is what a restart trusts)."""
        directory = self.shards.directory
        save_drafter(self.trainer.drafter, directory / CHECKPOINT_DIR, self.policy_name)
        torch.save(self.trainer.optimizer.state_dict(), directory / OPTIMIZER_FILE)
        raw = asdict(state)
        tmp = directory / (STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(raw, indent=1) + "\n")
        tmp.replace(directory / STATE_FILE)

    def restore(self, state: StreamState) -> None:
        """Load the saved drafter, optimizer and step count into this run's trainer."""
        directory = self.shards.directory
        checkpoint = directory / CHECKPOINT_DIR
        drafter = self.trainer.drafter
        weights = read_drafter_weights(checkpoint)
        drafter.load_state_dict({k: v.to(drafter.fc.weight.dtype) for k, v in weights.items()})
        drafter.set_draft_vocab(read_draft_vocab(checkpoint, read_drafter_info(checkpoint)))
        optim = torch.load(directory / OPTIMIZER_FILE, weights_only=True, map_location=drafter.fc.weight.device)
        self.trainer.optimizer.load_state_dict(optim)
        self.trainer.step_count = state.steps
