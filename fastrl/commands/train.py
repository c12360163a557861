"""`fastrl train`: GRPO with speculative, adaptive rollouts and a co-trained drafter (Hydra main, multirun ready).

The run directory (see ``run_dir``) gets train.log (this run's log), metrics.jsonl (one line per step),
checkpoints/, report.png and the offline W&B run; a run that ends before its first step leaves none of it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from omegaconf import OmegaConf

from fastrl.atomic_files import command_os_error
from fastrl.commands.output_guard import check_output_dir
from fastrl.commands.run_dir import (
    CHECKPOINT_DIR_KEY,
    CHECKPOINTS,
    RUN_DIR_KEY,
    RunPlan,
    check_checkpoint_dir,
    check_resolved_unused,
    check_unused,
    forget_run,
    keep_metrics_before,
    latest_checkpoint,
    lock_checkpoint_dir,
    lock_run,
    plan_run,
    read_metrics_lines,
    record_checkpoints_dir,
    restore_files,
    run_record,
    wandb_run_id,
)
from fastrl.commands.train_args import check_groups, in_user_words_error
from fastrl.commands.train_config import TrainConfig
from fastrl.commands.train_setup import (
    build_backend,
    build_task,
    check_context,
    check_local_cluster_fit,
    drafter_layer_config,
    model_dir,
    result_settings,
)
from fastrl.interrupts import held_interrupts
from fastrl.json_values import finite_json
from fastrl.models.checkpoint import load_model
from fastrl.models.tokenizer import load_tokenizer
from fastrl.rl.checkpoint import check_training_checkpoint, read_trainer_state
from fastrl.rl.logprob_check import rollout_tolerance
from fastrl.rl.metrics import StepMetrics
from fastrl.rl.trainer import GRPOTrainer, check_resumable
from fastrl.telemetry.speed_summary import print_speed_summary, steps_speed
from fastrl.telemetry.train_report import plot_train_report
from fastrl.telemetry.wandb_logger import WandbLogger

if TYPE_CHECKING:
    from fastrl.cli_hydra import HydraCommand

LOG_NAME = "fastrl.train"
LOG_FILE = "train.log"
REPORT_FILE = "report.png"


class RunRecorder:
    """The trainer's MetricsLogger: metrics.jsonl and train.log in the run directory, W&B, and response lengths for
    the report. Once the run is accepted (``_start_recording``), ``history`` starts with the steps an earlier run
    left in metrics.jsonl (a resumed run directory) and ``wandb`` is the run's W&B logger, if any."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.wandb: WandbLogger | None = None
        self.trainer: GRPOTrainer | None = None
        self.history: list[StepMetrics] = []
        self.lengths: list[int] = []
        self.steps_run: list[int] = []  # the steps this process ran (the response lengths are theirs)

    def log(self, metrics: StepMetrics, step: int) -> None:
        self.history.append(metrics)
        record, non_finite = finite_json(dataclasses.asdict(metrics))
        with (self.run_dir / "metrics.jsonl").open("a") as f:
            f.write(json.dumps(record, allow_nan=False) + "\n")
        log = logging.getLogger(LOG_NAME)
        log.info(f"step {step}: reward {metrics.reward_mean:.3f}; {metrics.speed().line()}")
        if non_finite:
            log.warning(f"step {step}: {', '.join(non_finite)} not finite (null in metrics.jsonl, left out of W&B)")
        rollout = self.trainer.last_rollout if self.trainer is not None else None
        step_lengths = [len(r.token_ids) for r in rollout.batch.results] if rollout is not None else []
        self.lengths += step_lengths
        self.steps_run.append(step)
        if self.wandb is not None:
            self.wandb.log(metrics, step)
            self.wandb.log_choices(metrics.strategy_choices, step)
            self.wandb.log_histogram("response_length", [float(x) for x in step_lengths], step)
            if rollout is not None:
                self.wandb.log(_arm_means(rollout.batch.rounds, self.trainer.bucket_thresholds), step)


def _arm_means(rounds, thresholds: tuple[int, ...]) -> dict[str, float]:
    """Per (batch-size bucket, strategy) of one rollout: mean goodput of its rounds and the accept length of their
    rows, as W&B scalars (the round counts are StepMetrics.arm_rounds)."""
    from fastrl.adaptive.buckets import BatchBuckets
    from fastrl.strategy.round_stats import pooled_accept_length

    buckets = BatchBuckets(thresholds)
    cells: dict[str, list] = {}
    for r in rounds:
        cells.setdefault(f"{buckets.label(buckets.index(r.batch_size))}/{r.strategy}", []).append(r)
    out: dict[str, float] = {}
    for key, group in cells.items():
        out[f"arms/{key}/goodput"] = sum(r.emitted_tokens / r.wall_time_s for r in group) / len(group)
        out[f"arms/{key}/accept_length"] = pooled_accept_length((r.mean_accept_length, r.batch_size) for r in group)
    return out


def say(message: str) -> None:
    """A line for the terminal and train.log."""
    print(message)
    logging.getLogger(LOG_NAME).info(message)


def run_train(cfg: TrainConfig, run_dir: Path, plan: RunPlan | None = None) -> list[StepMetrics]:
    """Build everything, train, write the report and the speed summary; returns the metrics of the steps run. The
    run directory is locked while it runs (two commands continuing one run are refused, naming the other's pid)."""
    plan = plan or RunPlan([])
    run_dir.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as locks:
        if not plan.locked:
            locks.enter_context(lock_run(run_dir))
        plan.started = True  # this job's run from here: what it wrote is its own to remove
        checkpoints = lock_checkpoint_dir(cfg.rl.checkpoint_dir or "", run_dir)  # before it is checked unused
        if checkpoints is not None:
            locks.enter_context(checkpoints)
        return _run_train(cfg, run_dir, plan)


def _run_train(cfg: TrainConfig, run_dir: Path, plan: RunPlan) -> list[StepMetrics]:
    torch.set_num_threads(cfg.threads)
    policy_dir = model_dir(cfg)
    tokenizer = load_tokenizer(policy_dir)
    if tokenizer is None:
        raise ValueError(f"model.path: {policy_dir} has no tokenizer; fastrl train needs one to read the task")
    task = build_task(cfg)  # validates before any worker starts
    check_context(cfg, task, tokenizer)
    if cfg.logger.enabled:
        cfg.logger.check()
        if cfg.logger.dir:
            check_output_dir("logger.dir", cfg.logger.dir, {}, overwrite=True)
    resumed_step = int(read_trainer_state(cfg.resume)["step"]) if cfg.resume else 0
    if cfg.resume and resumed_step >= cfg.rl.steps:
        say(
            f"resume: {cfg.resume} is at step {resumed_step} of rl.steps={cfg.rl.steps}: nothing left to do "
            f"(give rl.steps=N with N > {resumed_step} to train further)"
        )
        if plan.in_place:
            _missing_report(cfg, run_dir, resumed_step)
        return []
    checkpoints = check_checkpoint_dir(cfg.rl.checkpoint_dir or "", run_dir, plan)
    tolerance = cfg.rl.logprob_tolerance
    rl = dataclasses.replace(
        cfg.rl,
        checkpoint_dir=str(checkpoints),
        logprob_tolerance=(
            rollout_tolerance(cfg.rollout.engine.torch_dtype, cfg.rl.temperature) if tolerance is None else tolerance
        ),
    )
    settings = result_settings(cfg)
    if cfg.resume:  # refused before anything of the run changes (its metrics, a W&B run for it)
        check_training_checkpoint(cfg.resume)  # a damaged small file: refused before any engine is built
        try:
            check_resumable(cfg.resume, rl, task, settings)
        except ValueError as err:
            if plan.in_place:
                raise
            raise ValueError(
                f"{err} (resume=CHECKPOINT takes this command's keys alone: repeat the ones the run was started "
                "with, in its .hydra/overrides.yaml, or continue the run with resume=RUN_DIR)"
            ) from None
    # rollout.* keys and the workers' drafter: after a resume's settings (a changed drafter is named as that)
    check_local_cluster_fit(cfg)
    try:
        policy = load_model(policy_dir)
    except ValueError as err:
        raise ValueError(f"model.path: {err}") from None
    recorder = RunRecorder(run_dir)
    thresholds = tuple(cfg.strategy.bandit.bs_thresholds)
    wandb = None
    try:
        backend = build_backend(cfg)
        try:
            trainer = GRPOTrainer(
                policy,
                tokenizer,
                task,
                backend,
                rl,
                logger=recorder,
                bucket_thresholds=thresholds,
                settings=settings,
                drafter_config=drafter_layer_config(cfg),
            )
            recorder.trainer = trainer
            if cfg.resume:  # a checkpoint this run cannot take (another worker count) is refused here, unchanged
                trainer.resume(cfg.resume)
            if plan.in_place:
                read_metrics_lines(run_dir)  # a damaged metrics.jsonl is refused before the run changes
            wandb = _wandb_logger(cfg, run_dir)
            plan.checked = True  # from here on a failure is not a refusal: what the run wrote stays
            if cfg.resume:  # said once every check has passed
                say(f"resuming {cfg.resume}: step {resumed_step} of {cfg.rl.steps}")
            _start_recording(recorder, wandb, run_dir, checkpoints, resumed_step, plan)
            try:
                history = trainer.train()
            except KeyboardInterrupt:
                _interrupted(cfg, trainer, run_dir, checkpoints)
                raise
            except Exception as err:  # a failed step (a reward, a worker, the log-prob check): finished steps kept
                _interrupted(cfg, trainer, run_dir, checkpoints, failure=err)
                raise
        finally:
            backend.shutdown()
        # an interrupt here waits for the summary and the report (a second one stops at once)
        with held_interrupts("the run's closing summary and report", raising_only=True):
            _close_run(cfg, recorder, wandb, thresholds)
    finally:
        if wandb is not None:
            wandb.finish()
    kept = ["train.log", "metrics.jsonl"]
    if checkpoints.is_dir() and any(checkpoints.iterdir()):  # rl.checkpoint_every=0 writes none
        kept.append(f"{CHECKPOINTS}/" if checkpoints == run_dir / CHECKPOINTS else f"checkpoints in {checkpoints}")
    say(f"run directory: {run_dir} ({', '.join(kept)})")
    hint = wandb.sync_hint() if wandb is not None else None
    if hint is not None:
        say(hint)
    return history


def _close_run(cfg: TrainConfig, recorder: RunRecorder, wandb: WandbLogger | None, thresholds: tuple[int, ...]) -> None:
    """After the last step: the rollouts' speed summary (terminal, train.log, W&B) and the report."""
    if not recorder.history:
        return
    story = steps_speed(recorder.history, thresholds)
    print_speed_summary("rollouts", story)
    logging.getLogger(LOG_NAME).info(f"rollouts: {story.line()}")
    if wandb is not None:  # the whole run's figures, beside the last step's under the per-step names
        wandb.summarize(
            {
                "run/rollout_tokens": story.tokens,
                "run/rollout_time_s": story.wall_time_s,
                "run/rollout_tokens_per_s": story.tokens_per_s,
                "run/accept_length": story.accept_length,
                "run/estimated_speedup": story.speedup,
            }
        )
    if cfg.report:
        png = _draw_report(cfg, recorder.history, recorder.lengths, recorder.run_dir, recorder.steps_run)
        if wandb is not None:
            wandb.log_image("report", png)
        say(f"report: {png}")


def _draw_report(
    cfg: TrainConfig, history: list[StepMetrics], lengths: list[int], run_dir: Path, length_steps: list[int]
) -> Path:
    """The run's report.png over ``history``, with the response ``lengths`` of the steps ``length_steps``."""
    title = f"fastrl train: strategy={cfg.strategy.name}, drafter cotrain={cfg.drafter.cotrain}"
    return plot_train_report(history, lengths, run_dir / REPORT_FILE, title, length_steps)


def _missing_report(cfg: TrainConfig, run_dir: Path, resumed_step: int) -> None:
    """A finished run continued with nothing left to do: draw its report when it lacks one (a run stopped while it
    closed, or killed then), from the steps before ``resumed_step`` in metrics.jsonl. Their per-response lengths are
    not kept there: the report shows the per-step length statistics instead. Not sent to W&B."""
    if not cfg.report or (run_dir / REPORT_FILE).exists():
        return
    try:
        history = [m for m in _earlier_steps(run_dir) if m.step < resumed_step]
    except (ValueError, TypeError) as err:  # a damaged or foreign metrics.jsonl: the resume itself has no use for it
        say(f"report: {run_dir / REPORT_FILE} is missing and cannot be drawn from metrics.jsonl ({err})")
        return
    if not history:
        return
    with held_interrupts("the run's report", raising_only=True):
        png = _draw_report(cfg, history, [], run_dir, [])
    say(f"report: {png} (drawn from metrics.jsonl: the run ended before it wrote its report)")


def _wandb_logger(cfg: TrainConfig, run_dir: Path) -> WandbLogger | None:
    """The run's W&B logger (its run directory and name by default), None when logging is off."""
    if not cfg.logger.enabled:
        return None
    logger_cfg = dataclasses.replace(
        cfg.logger, dir=cfg.logger.dir or str(run_dir), run_name=cfg.logger.run_name or run_dir.name
    )
    return WandbLogger(logger_cfg, OmegaConf.to_container(OmegaConf.structured(cfg)), wandb_run_id(run_dir))


def _start_recording(
    recorder: RunRecorder, wandb: WandbLogger | None, run_dir: Path, checkpoints: Path, resumed_step: int, plan: RunPlan
) -> None:
    """Once the run is accepted: the checkpoints' directory recorded, metrics.jsonl cut back to the resumed step
    (a run continued in place), the recorder given the earlier steps and the W&B logger."""
    record_checkpoints_dir(run_dir, checkpoints)
    if plan.in_place and keep_metrics_before(run_dir, resumed_step):
        say(
            f"metrics.jsonl: the steps from {resumed_step} on that the interrupted run logged after its last "
            "checkpoint run again; their first lines are in metrics.replaced.jsonl"
        )
    recorder.history = _earlier_steps(run_dir) if plan.in_place else []
    recorder.wandb = wandb
    if wandb is not None:  # a killed run's W&B segment may have lost its last steps: W&B keeps what it lacks of
        for metrics in recorder.history:  # these (a step it holds already is not logged twice)
            wandb.log(metrics, metrics.step)


def _earlier_steps(run_dir: Path) -> list[StepMetrics]:
    """The steps metrics.jsonl holds (a run directory being continued, cut back to its resumed step)."""
    return [StepMetrics(**logged) for _, logged in read_metrics_lines(run_dir) if logged is not None]


def _interrupted(
    cfg: TrainConfig, trainer: GRPOTrainer, run_dir: Path, checkpoints: Path, failure: Exception | None = None
) -> None:
    """Ctrl-C, or a step that raised ``failure``: save a checkpoint when asked (``checkpoint_on_interrupt``) and the
    trainer stands between two steps (a step updated but not yet logged is logged first); say where the latest
    checkpoint is and how to continue. A checkpoint that cannot be saved after a failure (the failure may have taken
    what it needs) is said, and the failure raised as it is."""
    stopped = "interrupted" if failure is None else f"stopped by {type(failure).__name__}"
    saved = None
    between_steps = trainer.finish_interrupted_step()
    if not between_steps:
        say(
            f"{stopped} inside step {trainer.step}'s policy update, or while its metrics were logged: no consistent "
            "state to save there"
        )
    elif cfg.checkpoint_on_interrupt and trainer.step > 0:
        target = checkpoints / f"step_{trainer.step:06d}"
        try:
            saved = target if target.is_dir() else trainer.save_checkpoint(target)
        except Exception as err:
            if failure is None:
                raise
            say(f"{stopped} at step {trainer.step}: its checkpoint could not be saved ({type(err).__name__}: {err})")
    latest = saved or latest_checkpoint(run_dir)
    if latest is None:
        why = "none was written before" if cfg.checkpoint_on_interrupt else "checkpoint_on_interrupt=true saves one"
        say(f"{stopped} at step {trainer.step}: no checkpoint yet ({why}); start the run again")
        return
    say(f"{stopped} at step {trainer.step}; latest checkpoint: {latest}")
    say(f"continue with: fastrl train resume={run_dir if latest.parent == checkpoints else latest}")


def _after_full_disk(run_dir: Path) -> str:
    """What to do after a full disk stopped the run in ``run_dir``: resume when it finished a checkpoint, else start
    it anew (resume would find nothing to continue from)."""
    if run_dir.is_dir() and latest_checkpoint(run_dir) is not None:
        return f"free some space and continue with: fastrl train resume={run_dir} (its checkpoints are kept)"
    return "free some space and start the run anew in a new directory (it saved no checkpoint to resume from)"


def train_job_logging() -> dict[str, Any]:
    """Hydra job logging of `fastrl train`: INFO and above to train.log in the run directory, warnings also to the
    terminal (the terminal's INFO lines are printed by ``say``)."""
    return {
        "version": 1,
        "formatters": {"plain": {"format": "[%(asctime)s][%(levelname)s] %(message)s"}},
        "handlers": {
            "file": {
                "class": "logging.FileHandler",
                "formatter": "plain",
                "filename": f"${{hydra.runtime.output_dir}}/{LOG_FILE}",
            },
            "console": {"class": "logging.StreamHandler", "formatter": "plain", "level": "WARNING"},
        },
        "root": {"level": "INFO", "handlers": ["file", "console"]},
        "disable_existing_loggers": False,
    }


def _precheck(plan: RunPlan) -> tuple[str, ...]:
    """Stand-ins for the validation compose: rl.checkpoint_dir interpolates the run directory Hydra has not made."""
    if any(o.partition("=")[0].lstrip("+~") == CHECKPOINT_DIR_KEY for o in plan.overrides):
        return ()
    return (f"{CHECKPOINT_DIR_KEY}=run_dir/{CHECKPOINTS}",)


def hydra_entry(command: HydraCommand, argv: list[str]) -> None:
    """`fastrl train ARGV` through Hydra's main (``-m`` multirun, ``--cfg``, ``--help`` ...): overrides checked in
    the user's words, the run directory planned (see ``run_dir``) before Hydra makes it."""
    from hydra.core.config_store import ConfigStore
    from hydra.core.hydra_config import HydraConfig

    from fastrl.cli_hydra import pop_hydra_flags, run_hydra_main

    flags, overrides = pop_hydra_flags(argv)
    runs_job = not flags or flags in (["-m"], ["--multirun"])
    try:
        overrides = check_groups(command.config_dir, overrides)
        # --cfg shows what runs (a resumed run's own overrides with these on top) and checks no directory
        plan = plan_run(overrides, check_dirs=runs_job)
    except ValueError as err:
        raise in_user_words_error(err) from None
    store = ConfigStore.instance()
    store.store(group="hydra/job_logging", name="fastrl_train", node=train_job_logging())
    lock = None
    recorded: dict[Path, bytes] = {}
    # locked before Hydra writes into it (its record, its log): a continued run, or a new one given by name (one
    # given by an interpolation, `runs/${fastrl_run_id:}`, is known only to the job, which locks it there)
    literal = plan.run_dir is not None and "${" not in str(plan.run_dir)
    if literal and ((plan.in_place and runs_job) or not flags):
        lock = lock_run(plan.run_dir, "resume" if plan.in_place else RUN_DIR_KEY)  # the key as the user gave it
        plan.locked = True
        if plan.in_place:
            recorded = run_record(plan.run_dir, LOG_FILE)
        elif plan.run_dir.is_dir():  # again, under the lock: a run may have written it since the check
            try:
                check_unused(plan.run_dir)
            except ValueError as err:
                lock.release()
                raise in_user_words_error(err) from None

    def _job(cfg: TrainConfig) -> None:
        hydra_cfg = HydraConfig.get()
        run_dir = Path(hydra_cfg.runtime.output_dir)
        logging.getLogger(LOG_NAME).info(("fastrl train " + " ".join(hydra_cfg.overrides.task)).rstrip())
        plan.started = False  # each job of a multirun takes its own directory's lock
        try:
            if not plan.in_place and not literal and plan.run_dir is not None:  # known only now
                check_resolved_unused(run_dir)
            run_train(cfg, run_dir, plan)
        except ValueError as err:
            raise in_user_words_error(err) from None
        except OSError as err:  # a full disk: one line saying how to go on from what the run saved
            full = command_os_error(err, _after_full_disk(run_dir))
            if full is err:
                raise
            raise full from err
        finally:
            if recorded and not plan.checked:  # refused, or nothing left to do: the run keeps its own record
                restore_files(recorded)
            # ended before its first step: nothing to keep; refused the lock, the directory is another command's
            if plan.started and not (run_dir / "metrics.jsonl").is_file():
                forget_run(run_dir, plan)

    try:
        run_hydra_main(command, flags + plan.overrides, _job, ("hydra/job_logging=fastrl_train",), _precheck(plan))
    except ValueError as err:
        raise in_user_words_error(err) from None
    finally:
        if lock is not None:
            lock.release()
        sys.stdout.flush()
