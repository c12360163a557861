"""Structured config of `fastrl bench`."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class BenchConfig:
    """Keys of `fastrl bench` (see conf/bench.yaml)."""

    model: str = ""
    output: str = "runs/bench.json"
    batch_sizes: list[int] = field(default_factory=lambda: [1, 8, 64])
    new_tokens: int = 128
    repeats: int = 3
    seed: int = 0
    device: str = "cpu"
    threads: int = 0

    def __post_init__(self) -> None:
        if not self.batch_sizes or min(self.batch_sizes) < 1:
            raise ValueError(f"bench.batch_sizes must be a non-empty list of positive ints, got {self.batch_sizes}")
        if self.new_tokens < 1:
            raise ValueError(f"bench.new_tokens must be >= 1, got {self.new_tokens}")
        if self.repeats < 1:
            raise ValueError(f"bench.repeats must be >= 1, got {self.repeats}")
