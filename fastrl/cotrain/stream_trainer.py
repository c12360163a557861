"""Drafter training streamed from generation: shard by shard, rollouts are generated (or read back), turned into
policy features, trained on and dropped; after every shard the run's state is saved so a restart resumes there.

Memory holds one shard's features and the held-out set. Batches and feature noise are seeded by (seed, epoch,
shard), so a resumed run takes exactly the steps an uninterrupted one would.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import random
import re
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from fastrl.cotrain.accept_eval import accept_text
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
RESUME_DIR = "resume"
"""The saved run under the shards' directory: drafter/, optimizer.pt and state.json, written together into
``resume.tmp`` and swapped into place, so a run killed while saving leaves the previous shard's state whole."""


FINGERPRINT_FILE = "fingerprint.json"
"""The settings the stream's shards are generated with, written (atomically) before its first shard: shards are only
ever read back by a run with these settings."""
SHARD_NAME = re.compile(r"shard_\d{5,}\.json")
OWN_NAMES = re.compile(r"shard_\d{5,}\.(json|tmp)|resume(\.old|\.tmp)?|fingerprint\.json")
"""What a stream writes in its directory (besides hidden temporary files and the layout before the swap)."""
LEGACY_NAMES = (STATE_FILE, OPTIMIZER_FILE, CHECKPOINT_DIR)
"""A stream saved before the swap kept these at its top; they are its own only beside its top-level state.json."""


LATER_KEYS: dict[str, str | None] = {
    "prompt_ids_sha256": None,
    "rollout_dtype": "float32",
    "greedy_pass": "samples_per_prompt samples a prompt",
    "policy_weights": None,
    "policy_config": None,
}
"""Fingerprint keys added after streams were saved without them, with what such a stream held: None, unknown (it
resumes unchecked on the key); a value, what every stream of that time had (its rollouts ran in float32)."""


TRAINING_KEYS = frozenset({"epochs", "trainer", "draft_vocab_size", "extra_layers", "init_drafter"})
"""Fingerprint keys of the training alone: the shards do not depend on them, so a run that changes them trains the
kept shards again (after its saved training is deleted) instead of generating them again."""


SETTING_NAMES: dict[str, str] = {
    "source": "prompts",
    "prompts": "training prompt count",
    "trainer": "drafter_trainer",
}
"""How a refusal names a fingerprint key that is not the user's own key of that name."""

Canonical = Callable[[dict], dict]
"""A fingerprint as this version spells it (an earlier version's raw path spellings resolved); applied to the saved
and the new fingerprint before they are compared."""


def setting_changes(saved: dict, fingerprint: dict, prefix: str = "") -> list[tuple[str, Any, Any]]:
    """(the user's name of the key, saved value, new value) of every setting that differs, nested settings
    (drafter_trainer's) key by key."""
    changes = []
    for key in sorted(set(saved) | set(fingerprint)):
        old, new = saved.get(key), fingerprint.get(key)
        name = prefix + SETTING_NAMES.get(key, key)
        if isinstance(old, dict) and isinstance(new, dict):
            changes += setting_changes(old, new, f"{name}.")
        elif old != new:
            changes.append((name, old, new))
    return changes


def check_settings(
    directory: Path, saved: dict, fingerprint: dict, canonical: Canonical | None = None, training: Path | None = None
) -> None:
    """ValueError naming every setting (the user's key, the stream's value and this run's) in which ``fingerprint``
    differs from the ``saved`` one of the stream in ``directory``: the settings its shards were generated with, and
    with ``training`` (the saved training's directory, ``saved_run``) those of the training too (``TRAINING_KEYS``),
    which keep the shards. A key added since the stream was saved is taken as ``LATER_KEYS`` says."""
    if canonical is not None:
        saved, fingerprint = canonical(saved), canonical(fingerprint)
    saved, fingerprint = _measured_only(saved), _measured_only(fingerprint)
    unknown = {k for k, then in LATER_KEYS.items() if k not in saved and then is None}
    saved = {**{k: then for k, then in LATER_KEYS.items() if then is not None and k in fingerprint}, **saved}
    known = {k: v for k, v in saved.items() if k not in unknown}
    new = {k: v for k, v in fingerprint.items() if k not in unknown}
    rollouts = setting_changes(*({k: v for k, v in d.items() if k not in TRAINING_KEYS} for d in (known, new)))
    trained = setting_changes(*({k: v for k, v in d.items() if k in TRAINING_KEYS} for d in (known, new)))
    if rollouts:  # named with the training's changes, if any: one refusal says all a resume must match
        names, shown = _changes_text(setting_changes(known, new))
        raise ValueError(
            f"{directory} holds a run with other settings ({names}): {shown}; its shards were generated with those. "
            "Resume with the stream's settings, give another stream_dir, or delete the stream's shard_*.json files "
            f"and {RESUME_DIR}/ to generate them again with these"
        )
    if training is not None and trained:
        names, shown = _changes_text(trained)
        raise ValueError(
            f"{directory} holds a training of its shards with other settings ({names}): {shown}. Resume with those, "
            f"or {restart_hint(training)}: it then trains with these"
        )


def _measured_only(settings: dict) -> dict:
    """The settings without ``temperature`` where ``rollout_temperatures`` sets every pass's: then it only chooses
    the temperature held-out accept length is measured at, which no shard depends on (resumable, as
    ``accept_strategies`` is)."""
    if settings.get("rollout_temperatures"):
        return {k: v for k, v in settings.items() if k != "temperature"}
    return settings


def _changes_text(changes: list[tuple[str, Any, Any]]) -> tuple[str, str]:
    """The changed settings' names, and each one's change."""
    names = ", ".join(dict.fromkeys(name for name, _, _ in changes))
    return names, ", ".join(_change_text(name, old, new) for name, old, new in changes)


def _change_text(name: str, old: Any, new: Any) -> str:
    if name == "prompt_ids_sha256":  # no key of the user's: the training prompts' token ids
        return f"{name}={str(old)[:12]}… (now {str(new)[:12]}…: other training prompts or token ids)"
    if name in ("policy_weights", "policy_config"):  # the model's files changed (a checkpoint saved over them)
        what = "weights" if name == "policy_weights" else "config.json or generation_config.json"
        return f"{name}={str(old)[:19]}… (now {str(new)[:19]}…: the model's {what} changed)"
    return f"{name}={old!r} (now {new!r})"


def check_stream_dir(key: str, directory: Path, beside: tuple[Path, ...] = ()) -> None:
    """ValueError naming ``key`` when ``directory`` holds entries a stream does not write: a stream replaces and
    deletes its own files, so it must not share a directory with anything else (an earlier drafter, notes).
    ``beside``: the command's other outputs, which may lie inside it (the stream never touches them)."""
    if not directory.is_dir():
        return
    legacy = (directory / STATE_FILE).is_file()
    kept = {p.resolve() for p in beside}
    foreign = sorted(
        p.name
        for p in directory.iterdir()
        if not (
            OWN_NAMES.fullmatch(p.name)
            or p.name.startswith(".")
            or (legacy and p.name in LEGACY_NAMES)
            or p.resolve() in kept
        )
    )
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise ValueError(
            f"{key}={directory} holds what a train-drafter stream does not write ({shown}); a stream replaces and "
            "deletes files in its directory: give it a directory of its own (new, empty, or an earlier stream's)"
        )


def restart_hint(saved: Path) -> str:
    """How to drop a damaged save (``saved_run``'s directory) and train the stream over from its first shard."""
    target = saved if saved.name.startswith(RESUME_DIR) else saved / STATE_FILE
    return f"delete {target} to train this stream from its first shard again (its generated shards are kept)"


def read_fingerprint(directory: Path) -> dict | None:
    """The settings recorded in ``directory`` (``FINGERPRINT_FILE``; None when there is none); ValueError naming the
    file when it is not one this code wrote."""
    path = directory / FINGERPRINT_FILE
    if not path.is_file():
        return None
    try:
        saved = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as err:
        saved = err
    if not isinstance(saved, dict):
        raise ValueError(
            f"{path}: not a train-drafter stream's settings ({saved}); the shards beside it cannot be checked: "
            f"give another stream_dir, or delete it, the shard_*.json files and {RESUME_DIR}/ to start the stream over"
        )
    return saved


def record_fingerprint(directory: Path, fingerprint: dict) -> None:
    """Write ``fingerprint`` into ``directory`` (created if needed) through a hidden temporary file renamed into
    place: a run killed while writing leaves the previous record or none, never half of one."""
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".{FINGERPRINT_FILE}.tmp"
    tmp.write_text(json.dumps(fingerprint, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, directory / FINGERPRINT_FILE)


def open_stream(shards: RolloutShards, fingerprint: dict, canonical: Canonical | None = None) -> StreamState | None:
    """The saved state of the stream in ``shards.directory`` to resume (None: none), after checking, before any work
    and writing nothing, that what the directory holds was made with ``fingerprint``: its recorded settings (when it
    holds shards or a state: a record beside nothing made is replaced), its state's, and that shards without any
    record (a run stopped before its first save, by a fastrl version that kept none) are not read back."""
    directory = shards.directory
    made = sorted(p.name for p in directory.glob("shard_*.json") if SHARD_NAME.fullmatch(p.name))
    state = StreamState.load(directory)
    if made or state is not None:
        recorded = read_fingerprint(directory)
        if recorded is None and state is None:
            shown = ", ".join(made[:3]) + (f" and {len(made) - 3} more" if len(made) > 3 else "")
            raise ValueError(
                f"{directory} holds rollout shards ({shown}) but no record of the settings they were generated with "
                "(a run stopped before its first save, by a fastrl version that kept none): they may come from other "
                "settings and are not read back; delete them to generate them again, or give another stream_dir"
            )
        if recorded is not None:
            check_settings(directory, recorded, fingerprint, canonical)
    if state is None:
        return None
    saved = saved_run(directory)
    assert saved is not None  # a state was loaded from it
    check_settings(directory, state.fingerprint, fingerprint, canonical, training=saved)
    if state.shard >= shards.count or len(state.epochs) != state.epoch:
        raise ValueError(
            f"{saved / STATE_FILE}: not a state of this stream (shard {state.shard} of {shards.count}, "
            f"{len(state.epochs)} epoch reports at epoch {state.epoch}); {restart_hint(saved)}"
        )
    state.fingerprint = fingerprint  # the same settings; keys added since are saved with the next save
    return state


def saved_run(directory: Path) -> Path | None:
    """The directory of the last complete save under ``directory``: ``resume``; ``resume.old`` when a run was killed
    between the two renames of a swap; ``directory`` itself for a stream saved before the swap (files at its top);
    None when nothing was saved."""
    for candidate in (directory / RESUME_DIR, directory / f"{RESUME_DIR}.old", directory):
        if (candidate / STATE_FILE).is_file():
            return candidate
    return None


@dataclass
class EpochReport:
    """Held-out metrics after one epoch, the held-out accept length (0 when not measured), and the tokens trained
    on from the start of the run through this epoch (cumulative)."""

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
    def load(cls, directory: Path) -> StreamState | None:
        """The state saved under `directory` (``saved_run``; None when there is none), with the fingerprint it was
        saved under (``open_stream`` compares it); ValueError naming the file when it is not a state this code
        wrote."""
        saved = saved_run(directory)
        if saved is None:
            return None
        path = saved / STATE_FILE
        try:
            raw = json.loads(path.read_text())
            if not isinstance(raw["fingerprint"], dict):
                raise ValueError("its fingerprint is not a mapping")
            epochs = [
                EpochReport(DrafterMetrics(**e["metrics"]), float(e["accept_length"]), int(e["train_tokens"]))
                for e in raw["epochs"]
            ]
            state = cls(**{**raw, "epochs": epochs})
            counts = (state.epoch, state.shard, state.steps, state.total_steps, state.tokens)
            if not all(isinstance(n, int) and n >= 0 for n in counts):
                raise ValueError("epoch, shard, steps, total_steps and tokens must be integers >= 0")
        except (KeyError, TypeError, ValueError, AttributeError, UnicodeDecodeError) as err:
            raise ValueError(f"{path}: not a train-drafter stream state ({err}); {restart_hint(saved)}") from None
        return state


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
    rollout_policy: CausalLM | None = None  # what generates the shards (the policy cast to the rollout dtype)
    canonical: Canonical | None = None  # how fingerprints compare (``check_settings``)

    def run(self, fingerprint: dict, stop_after_shards: int | None = None) -> StreamState:
        """Train to the end (or for `stop_after_shards` shards), resuming from the shards' directory when it holds
        this run's state (``open_stream``: a stream of other settings is refused); returns the state reached. The
        settings are recorded in the directory before its first shard is generated."""
        state = open_stream(self.shards, fingerprint, self.canonical)
        record_fingerprint(self.shards.directory, fingerprint)
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
            if state.shard >= self.shards.count:
                state.epoch, state.shard = state.epoch + 1, 0
                state.epochs.append(self.evaluate(state))
                report = state.epochs[-1]
                bar.write(
                    f"epoch {state.epoch}: held-out loss {report.metrics.loss:.4f}, top-1 {report.metrics.top1:.3f}, "
                    f"accept length {accept_text(report.accept_length)}, {state.tokens} tokens trained"
                )
            self.save(state)
            bar.update(1)
        bar.close()
        return state

    def train_shard(self, state: StreamState, bar: tqdm) -> None:
        """Generate or read shard `state.shard`, train one pass over it."""
        ids = self.shards.ids(state.shard, self.rollout_policy or self.policy, self.gen_batch_size, self.device)
        drafter = self.trainer.drafter
        if self.draft_vocab_size > 0 and drafter.draft_vocab is None:  # the tokens the policy emits most often
            responses = self.shards.responses(state.shard, ids)  # (a prompt's are the user's, counted per sample)
            drafter.set_draft_vocab(
                most_frequent_tokens(responses, self.draft_vocab_size, self.policy.config.vocab_size)
            )
        seqs = policy_features(self.policy, ids, extra_layers=drafter.extra_layers)
        if dropped := sum(not s.finite for s in seqs):  # one NaN would fail every step that samples it
            seqs = [s for s in seqs if s.finite]
            bar.write(
                f"train-drafter: shard {state.shard + 1}: {dropped} rollouts' policy features are not finite: left out"
            )
        seed = self.trainer.config.seed * 1_000_003 + state.epoch * 10_007 + state.shard
        batches = make_batches(seqs, self.trainer.config.max_tokens_per_batch, random.Random(seed))
        if state.total_steps == 0:  # cosine over the whole run, sized by the first shard
            state.total_steps = self.trainer.config.total_steps or len(batches) * self.shards.count * self.epochs
        self.trainer.config = dataclasses.replace(self.trainer.config, total_steps=state.total_steps)
        torch.manual_seed(seed)
        start, tokens = time.perf_counter(), 0
        for batch in batches:
            with self._diverged(state):
                metrics = self.trainer.train_step(batch)
            tokens += metrics.tokens
            rate = tokens / max(time.perf_counter() - start, 1e-9)
            bar.set_postfix(
                epoch=state.epoch + 1, loss=f"{metrics.loss:.3f}", top1=f"{metrics.top1:.3f}", tok_s=f"{rate:.0f}"
            )
        with self._diverged(state):
            self.trainer.check_finite()
        state.tokens += tokens
        state.steps = self.trainer.step_count

    @contextmanager
    def _diverged(self, state: StreamState) -> Iterator[None]:
        """The block's FloatingPointError (a diverged run) as a ValueError that says where, and that the last save
        is kept: nothing of this shard is saved."""
        try:
            yield
        except FloatingPointError as err:
            where = f"epoch {state.epoch + 1}, shard {state.shard + 1} of {self.shards.count}"
            saved = saved_run(self.shards.directory)
            kept = f"; the saved training used this lr: {restart_hint(saved)}" if saved is not None else ""
            raise ValueError(
                f"train-drafter diverged at {where} ({err}): nothing of this shard was saved; lower "
                f"drafter_trainer.lr (now {self.trainer.config.lr}) or its warm-up and run again: the shards generated "
                f"so far are kept{kept}"
            ) from None

    def evaluate(self, state: StreamState) -> EpochReport:
        """Held-out loss and top-1, and the held-out accept length."""
        return EpochReport(self.trainer.evaluate(self.held_out), self.accept_length(), state.tokens)

    def save(self, state: StreamState) -> None:
        """The drafter, the optimizer and the state, written together into ``resume.tmp`` and swapped into place
        (``RESUME_DIR``): a restart finds them all from the same shard, or all from the one before."""
        directory = self.shards.directory
        final, tmp, old = (directory / f"{RESUME_DIR}{suffix}" for suffix in ("", ".tmp", ".old"))
        shutil.rmtree(tmp, ignore_errors=True)
        save_drafter(self.trainer.drafter, tmp / CHECKPOINT_DIR, self.policy_name)
        torch.save(self.trainer.optimizer.state_dict(), tmp / OPTIMIZER_FILE)
        (tmp / STATE_FILE).write_text(json.dumps(asdict(state), indent=1) + "\n")
        shutil.rmtree(old, ignore_errors=True)
        if final.is_dir():
            final.rename(old)
        tmp.rename(final)
        shutil.rmtree(old, ignore_errors=True)
        if (directory / STATE_FILE).is_file():  # the layout before the swap, now superseded (its files only)
            for name in reversed(LEGACY_NAMES):  # state.json last: until it goes, the others are known as the stream's
                stale = directory / name
                shutil.rmtree(stale) if stale.is_dir() else stale.unlink(missing_ok=True)

    def restore(self, state: StreamState) -> None:
        """Load the saved drafter, optimizer and step count into this run's trainer."""
        saved = saved_run(self.shards.directory)
        assert saved is not None  # a state was loaded from it
        checkpoint = saved / CHECKPOINT_DIR
        drafter = self.trainer.drafter
        try:
            weights = read_drafter_weights(checkpoint)
            drafter.load_state_dict({k: v.to(drafter.fc.weight.dtype) for k, v in weights.items()})
            drafter.set_draft_vocab(read_draft_vocab(checkpoint, read_drafter_info(checkpoint)))
        except (ValueError, RuntimeError) as err:
            hint = restart_hint(saved)
            raise ValueError(f"{checkpoint}: the stream's saved drafter is unreadable ({err}); {hint}") from None
        optimizer = saved / OPTIMIZER_FILE
        try:
            optim = torch.load(optimizer, weights_only=True, map_location=drafter.fc.weight.device)
            self.trainer.optimizer.load_state_dict(optim)
        except (OSError, RuntimeError, ValueError, KeyError, pickle.UnpicklingError) as err:
            hint = restart_hint(saved)
            raise ValueError(f"{optimizer}: the stream's saved optimizer is unreadable ({err}); {hint}") from None
        self.trainer.step_count = state.steps
