"""Structured config of `fastrl check-exact`."""

from __future__ import annotations

from dataclasses import dataclass, field

from fastrl.adaptive.bandit_config import BanditConfig
from fastrl.adaptive.ema_config import EmaConfig


@dataclass
class CheckExactConfig:
    """Keys of `fastrl check-exact` (see conf/check_exact.yaml): the keys of `fastrl generate` that decide what is
    decoded, plus where to write the report and the log-prob tolerance."""

    prompts: str
    model: str = ""
    max_new_tokens: int = 512
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0
    batch_size: int = 16
    plain_batch_size: int = 0
    device: str = "cpu"
    dtype: str = "float32"
    progress: bool = True
    threads: int = 1
    strategy: str = "8_4_32"
    drafter: str = ""
    report: str = ""
    logprob_tol: float = 1e-4
    bandit: BanditConfig = field(default_factory=BanditConfig)
    ema: EmaConfig = field(default_factory=EmaConfig)
    ema_json: str = ""

    def __post_init__(self) -> None:
        if not self.prompts:
            raise ValueError("check_exact.prompts: give an input JSONL file, e.g. prompts=in.jsonl")
        if self.strategy == "disable":
            raise ValueError("check_exact.strategy: name a speculative strategy (S_K_N, bandit or ema), not disable")
        for key in ("batch_size", "threads"):
            if getattr(self, key) < 1:
                raise ValueError(f"check_exact.{key} must be >= 1, got {getattr(self, key)}")
        if self.plain_batch_size < 0:
            raise ValueError(f"check_exact.plain_batch_size must be >= 0 (0: batch_size), got {self.plain_batch_size}")
        if not self.logprob_tol >= 0:
            raise ValueError(f"check_exact.logprob_tol must be >= 0, got {self.logprob_tol}")
