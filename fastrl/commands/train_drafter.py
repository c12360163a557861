"""`fastrl train-drafter`: offline EAGLE drafter training for a policy checkpoint."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import torch

from fastrl.assets_path import bundled_model_dir
from fastrl.commands.engine_setup import check_kv_memory, resolve_model_dir
from fastrl.commands.interrupted import say_interrupted
from fastrl.commands.output_guard import OutputTarget, guard_outputs
from fastrl.commands.prompt_tokens import PromptLimits
from fastrl.commands.prompts_io import prompts_path_problem
from fastrl.commands.staged_output import staged_directory
from fastrl.commands.train_drafter_config import TrainDrafterConfig
from fastrl.commands.train_drafter_prompts import training_prompts
from fastrl.cotrain.offline import OfflineDrafterReport, train_offline
from fastrl.cotrain.rollout_plan import RolloutPlan
from fastrl.cotrain.stream_trainer import check_stream_dir
from fastrl.engine.config import ENGINE_DTYPES
from fastrl.engine.machine import check_device
from fastrl.models.checkpoint import config_fingerprint, load_model, read_config, weights_fingerprint
from fastrl.models.config import ModelConfig
from fastrl.models.decoder import CausalLM
from fastrl.models.named import is_named_model
from fastrl.models.tokenizer import load_tokenizer
from fastrl.speculative.draft_vocab import wider_than
from fastrl.speculative.drafter import EagleDrafter
from fastrl.speculative.drafter_checkpoint import DRAFT_VOCAB_FILE, METRICS_FILE, load_drafter, save_drafter
from fastrl.speculative.fused_drafter import FusedEagleDrafter, check_extra_layers
from fastrl.strategy.strategy import Strategy


def run_train_drafter(cfg: TrainDrafterConfig) -> OfflineDrafterReport:
    """Train, save the drafter to cfg.output with metrics.json beside it; returns the report. The output directory
    is checked (and locked) before any work: an existing non-empty one needs overwrite=true, unless all it holds is
    this run's own stream (stream_dir inside output: the rerun of an interrupted run resumes)."""
    check_device("train_drafter.device", cfg.device)
    problem = prompts_path_problem(cfg.prompts) if cfg.prompts else None  # before outputs are checked against it
    if problem is not None:
        raise ValueError(f"train_drafter.prompts={cfg.prompts} {problem}")
    model_dir = resolve_model_dir(cfg.model)
    inputs = {"model": str(model_dir), "prompts": cfg.prompts, "init_drafter": cfg.init_drafter}
    work = {"stream_dir": cfg.stream_path}
    overwrite = cfg.overwrite or holds_only_its_stream(Path(cfg.output), Path(cfg.stream_path))
    with guard_outputs({}, inputs, {"output": cfg.output}, overwrite, work) as targets:
        check_stream_dir("train_drafter.stream_dir", Path(cfg.stream_path), beside=(Path(cfg.output),))
        try:
            return _train_drafter(cfg, model_dir, targets["output"])
        except KeyboardInterrupt as err:
            raise say_interrupted(
                err,
                f"fastrl train-drafter: interrupted; its state after the last whole shard is in {cfg.stream_path}. "
                "Run the same command again to resume from there.",
            ) from None


def holds_only_its_stream(output: Path, stream: Path) -> bool:
    """Whether the directory `output` holds nothing but the run's own stream directory `stream` (inside it, at any
    depth) and that stream's lock file: the output of a run stopped before it saved its drafter, which its rerun
    resumes into. Anything else in it (an earlier drafter, notes) still needs overwrite=true."""
    if not (output.is_dir() and stream.is_dir()):
        return False
    here = output.resolve()
    try:
        parts = stream.resolve().relative_to(here).parts
    except ValueError:
        return False
    for depth, part in enumerate(parts):
        lock = {f".{part}.lock"} if depth == len(parts) - 1 else set()
        if not {p.name for p in here.iterdir()} <= {part} | lock:
            return False
        here = here / part
    return bool(parts)


def stream_identity(identity: dict) -> dict:
    """The stream fingerprint's keys naming the run's inputs (``model``, ``source`` = the prompts file,
    ``init_drafter``) as absolute, resolved paths (the bundled model's for model=""; a named model by its name):
    one file spelled two ways is one setting. Applied to a saved fingerprint too, it reads an earlier version's raw
    spelling (relative to the current directory); applying it twice changes nothing."""
    out = dict(identity)
    for key in ("model", "source", "init_drafter"):
        value = out.get(key)
        if not isinstance(value, str) or (key == "model" and is_named_model(value)):
            continue
        if key == "model" and not value:
            value = str(bundled_model_dir())
        out[key] = os.path.realpath(value) if value else ""
    return out


def _train_drafter(cfg: TrainDrafterConfig, model_dir: Path, output: OutputTarget) -> OfflineDrafterReport:
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    tokenizer = load_tokenizer(model_dir)
    if tokenizer is None:
        raise ValueError(f"train-drafter tokenizes prompts and needs a tokenizer in {model_dir}")
    config = read_config(model_dir)  # the prompts and sizes are checked against it before the policy loads
    vocab = config.vocab_size
    if cfg.draft_vocab_size > vocab:  # checked before any rollout (the draft vocabulary is taken after the first shard)
        raise ValueError(
            f"train_drafter.draft_vocab_size must be in [0, {vocab}] for {model_dir}, got {cfg.draft_vocab_size}"
        )
    train_prompts, held_prompts = training_prompts(tokenizer, cfg, PromptLimits(config.max_position_embeddings, vocab))
    check_engine_memory(cfg, config, train_prompts, held_prompts)
    policy = load_model(model_dir, device=cfg.device)
    torch.manual_seed(cfg.seed)
    drafter = initial_drafter(policy, cfg)
    check_accept_topk(cfg, drafter)
    policy_name = cfg.model if is_named_model(cfg.model) else model_dir.name
    identity = stream_identity({"model": cfg.model, "source": cfg.prompts, "init_drafter": cfg.init_drafter})
    # the policy by what it computes, not only by its path: a checkpoint saved over the same directory is another
    identity |= {"policy_weights": weights_fingerprint(model_dir), "policy_config": config_fingerprint(model_dir)}
    report = train_offline(
        policy, drafter, train_prompts, held_prompts, cfg, cfg.stream_path, policy_name, identity, stream_identity
    )
    metrics = {
        "policy": policy_name,
        "train_sequences": report.train_sequences,
        "train_tokens_per_epoch": report.train_tokens,  # each epoch's report holds the cumulative count
        "epochs": [dataclasses.asdict(m) for m in report.epochs],
        "accept_lengths": [dataclasses.asdict(a) for a in report.accept_lengths],
        "config": dataclasses.asdict(cfg),
    }
    # the drafter and its metrics reach the output together, or not at all; an earlier drafter's draft vocabulary goes
    with staged_directory(output, owned=(DRAFT_VOCAB_FILE,)) as staging:
        save_drafter(drafter, staging, policy_name=policy_name, version=1)
        (staging / METRICS_FILE).write_text(json.dumps(metrics, indent=2) + "\n")
    print(f"drafter saved to {cfg.output}")
    return report


def check_engine_memory(
    cfg: TrainDrafterConfig, config: ModelConfig, train_prompts: list[list[int]], held_prompts: list[list[int]]
) -> None:
    """Before the policy loads: the KV caches of the generating and the measuring engines fit the memory there is
    (ValueError naming ``gen_batch_size`` / ``accept_batch_size``; the measuring one failed at the first epoch's
    end). Each engine holds as many slots as it has requests, at most its batch size (``RolloutPlan``)."""
    length = max(len(p) for p in train_prompts + held_prompts) + cfg.max_new_tokens + 1
    requests = len(RolloutPlan(train_prompts, cfg.temperatures, cfg.samples_per_prompt, cfg.max_new_tokens, cfg.seed))
    dtype = ENGINE_DTYPES[cfg.engine_dtype]
    for key, slots in (
        ("gen_batch_size", min(cfg.gen_batch_size, requests)),
        ("accept_batch_size", min(cfg.accept_batch_size, cfg.accept_requests, len(held_prompts))),
    ):
        check_kv_memory(f"train_drafter.{key}", config, max(1, slots), dtype, cfg.device, length)  # fmt: skip


def check_accept_topk(cfg: TrainDrafterConfig, drafter: EagleDrafter) -> None:
    """Before any rollout: every measured strategy's candidates per step fit the draft vocabulary the drafter will
    draft over (``draft_vocab_size``, or the one ``init_drafter`` keeps); the measurement at the first epoch's end
    found it after the training (ValueError naming both keys)."""
    width = drafter.draft_vocab.numel() if drafter.draft_vocab is not None else cfg.draft_vocab_size
    wide = [str(s) for s in wider_than(map(Strategy.parse, cfg.accept_strategies), width)] if width else []
    if wide:
        kept = drafter.draft_vocab is not None
        held = f"init_drafter={cfg.init_drafter} drafts over" if kept else "draft_vocab_size:"
        raise ValueError(
            f"train_drafter.accept_strategies: {wide} draft more candidates a step than the {width} tokens of the "
            f"draft vocabulary ({held} {width}); name strategies of topk <= {width}, or a wider draft vocabulary"
        )


def initial_drafter(policy: CausalLM, cfg: TrainDrafterConfig) -> EagleDrafter:
    """A fresh drafter, or the one `init_drafter` names (its weights and draft vocabulary). With `extra_layers`
    the drafter reads EAGLE-3's fused input: a last-layer `init_drafter` is wrapped in a FusedEagleDrafter whose
    fuse starts as the identity on the last layer, so training starts from exactly the drafter it was given."""
    layers = tuple(cfg.extra_layers)
    try:
        check_extra_layers(layers, policy.config.num_hidden_layers)
    except ValueError as err:
        raise ValueError(f"train_drafter.{err}") from None
    if not cfg.init_drafter:
        fresh = FusedEagleDrafter(policy.config, layers) if layers else EagleDrafter(policy.config)
        return fresh.to(cfg.device)
    try:
        drafter = load_drafter(cfg.init_drafter, policy, cfg.device)[0].float()
    except ValueError as err:
        raise ValueError(f"train_drafter.init_drafter={cfg.init_drafter}: {err}") from None
    vocab = drafter.draft_vocab
    if cfg.draft_vocab_size and vocab is not None and vocab.numel() != cfg.draft_vocab_size:
        raise ValueError(
            f"train_drafter.draft_vocab_size={cfg.draft_vocab_size}, but init_drafter={cfg.init_drafter} drafts over "
            f"its own {vocab.numel()} tokens, which training keeps: leave draft_vocab_size out or set it to "
            f"{vocab.numel()}"
        )
    held = drafter.extra_layers
    if held == layers:
        return drafter
    if held:
        raise ValueError(
            f"train_drafter.init_drafter={cfg.init_drafter} reads layers {list(held)} + the last; "
            f"extra_layers={list(layers)} differs (pass extra_layers={list(held)} to continue it)"
        )
    fused = FusedEagleDrafter(drafter.config, layers).to(cfg.device)
    fused.load_state_dict({**drafter.state_dict(), "fuse.weight": fused.fuse.weight})  # the fuse stays the identity
    fused.set_draft_vocab(drafter.draft_vocab)
    return fused
