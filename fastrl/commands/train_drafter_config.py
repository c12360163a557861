"""Structured config of `fastrl train-drafter`."""

from __future__ import annotations

from dataclasses import dataclass, field

from fastrl.cotrain.offline import OfflineDrafterConfig


@dataclass
class TrainDrafterConfig(OfflineDrafterConfig):
    """Keys of `fastrl train-drafter` (see conf/train_drafter.yaml)."""

    model: str = ""
    output: str = "runs/drafter"
    overwrite: bool = False  # write into a non-empty output directory
    threads: int = 1
    prompts: str = ""  # a prompts JSONL file (generate's format); empty = the bundled task's prompts
    chat_template: bool = True  # prompts-file text as a user chat turn through the tokenizer's chat template
    rollout_temperatures: list[float] = field(default_factory=list)  # prompts file: one pass per temperature

    def __post_init__(self) -> None:
        if self.num_prompts < 1 or self.eval_prompts < 1:
            raise ValueError("train_drafter.num_prompts and eval_prompts must be >= 1")
        if self.draft_vocab_size < 0:
            raise ValueError(
                f"train_drafter.draft_vocab_size must be >= 0 (0 = full vocabulary), got {self.draft_vocab_size}"
            )
        if self.epochs < 1:
            raise ValueError(f"train_drafter.epochs must be >= 1, got {self.epochs}")
        if any(t < 0 for t in self.rollout_temperatures):
            raise ValueError(f"train_drafter.rollout_temperatures must be >= 0, got {self.rollout_temperatures}")
        if not self.output:
            raise ValueError("train_drafter.output: give a directory for the drafter")
