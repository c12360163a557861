"""Structured config of `fastrl train-drafter`."""

from __future__ import annotations

from dataclasses import dataclass

from fastrl.cotrain.offline import OfflineDrafterConfig


@dataclass
class TrainDrafterConfig(OfflineDrafterConfig):
    """Keys of `fastrl train-drafter` (see conf/train_drafter.yaml)."""

    model: str = ""
    output: str = "runs/drafter"
    threads: int = 1

    def __post_init__(self) -> None:
        if self.num_prompts < 1 or self.eval_prompts < 1:
            raise ValueError("train_drafter.num_prompts and eval_prompts must be >= 1")
        if self.draft_vocab_size < 0:
            raise ValueError(
                f"train_drafter.draft_vocab_size must be >= 0 (0 = full vocabulary), got {self.draft_vocab_size}"
            )
        if self.epochs < 1:
            raise ValueError(f"train_drafter.epochs must be >= 1, got {self.epochs}")
        if not self.output:
            raise ValueError("train_drafter.output: give a directory for the drafter")
