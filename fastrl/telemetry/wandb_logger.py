"""Weights & Biases logging, offline by default (no account needed; `wandb sync DIR` uploads later)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

WANDB_MODES = ("offline", "online", "disabled")


@dataclass
class WandbConfig:
    """Where and how to log. `mode` offline writes run files under `dir` for a later `wandb sync`."""

    enabled: bool = True
    mode: str = "offline"
    project: str = "fastrl"
    run_name: str = ""
    dir: str = "runs/wandb"
    tags: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.mode not in WANDB_MODES:
            raise ValueError(f"logger.mode must be one of {list(WANDB_MODES)}, got {self.mode!r}")

    def check(self) -> None:
        """W&B's own rules for the project name and the tags, and an online run's login, asked before any work
        (W&B would refuse them only when the run starts, after the rollout engines' start and calibration): one
        ValueError naming the key. Nothing is created."""
        import pydantic
        import wandb

        for key, setting, value in (("project", "project", self.project), ("tags", "run_tags", list(self.tags))):
            try:
                wandb.Settings(**{setting: value})
                continue
            except wandb.errors.UsageError as err:
                said = str(err)
            except pydantic.ValidationError as err:
                said = "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in err.errors())
            raise ValueError(f"logger.{key}={value!r}: {said}")
        # an account, asked of W&B's own login without the network; where W&B's environment says offline
        # (WANDB_MODE) its login checks nothing, and the run's start refuses instead
        offline_env = os.environ.get("WANDB_MODE", "").lower() in ("offline", "dryrun", "disabled")
        if self.enabled and self.mode == "online" and not offline_env:
            try:
                wandb.login(relogin=False, verify=False)
            except wandb.errors.UsageError as err:
                raise ValueError(_refused(self.mode, err)) from None


class WandbLogger:
    """A real W&B run. `log` takes a flat dict of scalars or any object with `to_flat_dict()`."""

    def __init__(self, config: WandbConfig, run_config: dict[str, Any] | None = None, run_id: str = "") -> None:
        """``run_id``: the W&B run id (a run continued later logs into the same W&B run); empty: a new one."""
        import wandb

        self.config = config
        Path(config.dir).mkdir(parents=True, exist_ok=True)
        os.environ.setdefault("WANDB_SILENT", "true")
        self._wandb = wandb
        self.mode = config.mode if config.enabled else "disabled"
        try:
            self.run = wandb.init(
                project=config.project,
                name=config.run_name or None,
                dir=config.dir,
                mode=self.mode,
                config=run_config or {},
                tags=config.tags or None,
                reinit="finish_previous",
                id=run_id or None,
                resume="allow" if run_id else None,
            )
        except wandb.errors.UsageError as err:  # online without an API key ...
            raise ValueError(_refused(self.mode, err)) from None
        except wandb.errors.Error as err:  # online with a key but no way to the server ...
            said = " ".join(str(err).split())  # one line
            raise ValueError(
                f"logger.mode={self.mode}: W&B could not start a run ({type(err).__name__}: {said}); check the "
                "network to the W&B server, or use logger.mode=offline (`wandb sync` uploads later)"
            ) from None

    @property
    def run_dir(self) -> str | None:
        """The local directory holding this run's files."""
        return getattr(self.run, "dir", None)

    def sync_hint(self) -> str | None:
        """How to upload an offline run, every segment of it (a run continued later adds one ``offline-run-*``
        directory per continuation, all with this run's id); None when nothing is kept to upload."""
        if self.mode != "offline" or self.run_dir is None:
            return None
        segment = Path(self.run_dir).parent  # .../wandb/offline-run-<time>-<id>; run.dir is its files/
        pattern = segment.parent / f"offline-run-*-{self.run.id}"
        return f"W&B offline run: {segment.parent} (upload with `wandb sync {pattern}`)"

    def log(self, metrics: Any, step: int) -> None:
        """Log scalars at `step`; a NaN or infinite value is left out (a gap in its chart, as in metrics.jsonl's
        null), not plotted as a bound."""
        values = metrics.to_flat_dict() if hasattr(metrics, "to_flat_dict") else dict(metrics)
        self.run.log({k: v for k, v in values.items() if not isinstance(v, float) or math.isfinite(v)}, step=step)

    def log_choices(self, choices: dict[str, str], step: int) -> None:
        """Log the strategy chosen per batch-size bucket as text values ``choice/<bucket>``."""
        if choices:
            self.run.log({f"choice/{bucket}": strategy for bucket, strategy in choices.items()}, step=step)

    def log_histogram(self, name: str, values: list[float], step: int) -> None:
        """Log a histogram (e.g. response lengths)."""
        if values:
            self.run.log({name: self._wandb.Histogram(values)}, step=step)

    def log_image(self, name: str, path: str | Path, step: int | None = None) -> None:
        """Attach a PNG (plots, reports)."""
        self.run.log({name: self._wandb.Image(str(path))}, step=step)

    def summarize(self, values: dict[str, float | None]) -> None:
        """Set run-level values in the run's summary (None values left out)."""
        self.run.summary.update({k: v for k, v in values.items() if v is not None})

    def finish(self) -> None:
        """Close the run (flushes offline files)."""
        self.run.finish()


def _refused(mode: str, err: Exception) -> str:
    """The one line saying W&B refused an ``mode`` run for want of an account."""
    return (
        f"logger.mode={mode}: W&B refused to start a run ({err}); log in with `wandb login`, or keep "
        "logger.mode=offline (no account needed; `wandb sync` uploads later)"
    )
