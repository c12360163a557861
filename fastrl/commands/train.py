"""`fastrl train`: GRPO with speculative, adaptive rollouts and a co-trained drafter (Hydra main, multirun ready)."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from fastrl.commands.train_config import TrainConfig
from fastrl.commands.train_setup import build_backend, build_task, model_dir
from fastrl.models.checkpoint import load_model
from fastrl.models.tokenizer import load_tokenizer
from fastrl.rl.checkpoint import read_trainer_state
from fastrl.rl.metrics import StepMetrics
from fastrl.rl.trainer import GRPOTrainer
from fastrl.telemetry.train_report import plot_train_report
from fastrl.telemetry.wandb_logger import WandbLogger


class RunRecorder:
    """The trainer's MetricsLogger: metrics.jsonl in the run directory, W&B, and response lengths for the report."""

    def __init__(self, run_dir: Path, wandb: WandbLogger | None) -> None:
        self.run_dir = run_dir
        self.wandb = wandb
        self.trainer: GRPOTrainer | None = None
        self.history: list[StepMetrics] = []
        self.lengths: list[int] = []

    def log(self, metrics: StepMetrics, step: int) -> None:
        self.history.append(metrics)
        with (self.run_dir / "metrics.jsonl").open("a") as f:
            f.write(json.dumps(dataclasses.asdict(metrics)) + "\n")
        rollout = self.trainer.last_rollout if self.trainer is not None else None
        step_lengths = [len(r.token_ids) for r in rollout.batch.results] if rollout is not None else []
        self.lengths += step_lengths
        if self.wandb is not None:
            self.wandb.log(metrics, step)
            self.wandb.log_histogram("response_length", [float(x) for x in step_lengths], step)
            if rollout is not None:
                self.wandb.log(_arm_pulls(rollout.batch.rounds), step)


def _arm_pulls(rounds) -> dict[str, float]:
    """Per (batch-size bucket, strategy) of one rollout: rounds, mean goodput and accept length, as W&B scalars."""
    from fastrl.adaptive.buckets import DEFAULT_BS_THRESHOLDS, BatchBuckets

    buckets = BatchBuckets(DEFAULT_BS_THRESHOLDS)
    cells: dict[str, list] = {}
    for r in rounds:
        cells.setdefault(f"{buckets.label(buckets.index(r.batch_size))}/{r.strategy}", []).append(r)
    out: dict[str, float] = {}
    for key, group in cells.items():
        out[f"arms/{key}/pulls"] = float(len(group))
        out[f"arms/{key}/goodput"] = sum(r.emitted_tokens / r.wall_time_s for r in group) / len(group)
        out[f"arms/{key}/accept_length"] = sum(r.mean_accept_length for r in group) / len(group)
    return out


def run_train(cfg: TrainConfig, run_dir: Path) -> list[StepMetrics]:
    """Build everything, train, write the report; returns the metrics of the steps run."""
    torch.set_num_threads(cfg.threads)
    run_dir.mkdir(parents=True, exist_ok=True)
    policy_dir = model_dir(cfg)
    tokenizer = load_tokenizer(policy_dir)
    if tokenizer is None:
        raise ValueError(f"model.path: {policy_dir} has no tokenizer; fastrl train needs one to read the task")
    policy = load_model(policy_dir)
    rl = dataclasses.replace(cfg.rl, checkpoint_dir=cfg.rl.checkpoint_dir or str(run_dir / "checkpoints"))
    wandb = None
    if cfg.logger.enabled:
        logger_cfg = dataclasses.replace(cfg.logger, dir=str(run_dir), run_name=cfg.logger.run_name or run_dir.name)
        wandb = WandbLogger(logger_cfg, OmegaConf.to_container(OmegaConf.structured(cfg)))
    task = build_task(cfg)  # validates before any worker starts
    if cfg.resume:
        read_trainer_state(cfg.resume)  # a bad checkpoint is named before any worker starts
    recorder = RunRecorder(run_dir, wandb)
    backend = build_backend(cfg)
    try:
        trainer = GRPOTrainer(policy, tokenizer, task, backend, rl, logger=recorder)
        recorder.trainer = trainer
        if cfg.resume:
            trainer.resume(cfg.resume)
        history = trainer.train()
    finally:
        backend.shutdown()
    if cfg.report and recorder.history:
        png = plot_train_report(
            recorder.history,
            recorder.lengths,
            run_dir / "report.png",
            f"fastrl train: strategy={cfg.strategy.name}, drafter cotrain={cfg.drafter.cotrain}",
        )
        if wandb is not None:
            wandb.log_image("report", png)
        print(f"report: {png}")
    if wandb is not None:
        wandb.finish()
        print(f"W&B offline run: {wandb.run_dir} (upload with `wandb sync`)")
    return history


def hydra_entry(argv: list[str]) -> None:
    """Run Hydra's main (so `-m` multirun and the usual Hydra flags work) on `argv` overrides."""
    import hydra
    from hydra.core.config_store import ConfigStore
    from hydra.core.hydra_config import HydraConfig

    from fastrl.config_compose import check_override_keys, conf_dir, quote_string_overrides

    check_override_keys("train", TrainConfig, argv)
    ConfigStore.instance().store(name="train_schema", node=TrainConfig)

    @hydra.main(config_path=str(conf_dir() / "train"), config_name="train", version_base="1.3")
    def _main(dcfg: DictConfig) -> None:
        try:
            cfg: TrainConfig = OmegaConf.to_object(dcfg)
            run_train(cfg, Path(HydraConfig.get().runtime.output_dir))
        except ValueError as exc:  # bad configs, checkpoints or inputs: one line naming the problem
            raise SystemExit(f"fastrl train: error: {exc}") from None

    args = [quote_string_overrides(TrainConfig, [a])[0] if "=" in a and not a.startswith("-") else a for a in argv]
    saved = sys.argv
    sys.argv = ["fastrl train", *args]
    try:
        _main()
    finally:
        sys.argv = saved
