"""Structured config of `fastrl train-drafter`."""

from __future__ import annotations

from dataclasses import dataclass

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
    init_drafter: str = ""  # start from this drafter's weights (and draft vocabulary) instead of a fresh one
    stream_dir: str = ""  # rollout shards and resume state; empty = <output>.stream

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.draft_vocab_size < 0:
            raise ValueError(
                f"train_drafter.draft_vocab_size must be >= 0 (0 = full vocabulary), got {self.draft_vocab_size}"
            )
        if not self.output:
            raise ValueError("train_drafter.output: give a directory for the drafter")
        if self.threads < 0:
            raise ValueError(f"train_drafter.threads must be >= 0 (0 = PyTorch's default), got {self.threads}")

    @property
    def stream_path(self) -> str:
        return self.stream_dir or self.output.rstrip("/") + ".stream"
