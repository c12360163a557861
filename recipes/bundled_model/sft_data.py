"""SFT data for the bundled model: task samples tokenized with the response marked, batched by length."""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass

import torch
from transformers import PreTrainedTokenizerFast

from fastrl.rl.tasks import ArithChainTask

IGNORE_INDEX = -100


@dataclass(frozen=True)
class Example:
    """One training sequence ``<bos> prompt response <eos>``; the first `prompt_len` tokens get no loss."""

    input_ids: tuple[int, ...]
    prompt_len: int


def encode_examples(tokenizer: PreTrainedTokenizerFast, prompts: list[str], responses: list[str]) -> list[Example]:
    """Tokenizes prompt/response pairs; ``<bos>`` comes from the tokenizer, ``<eos>`` is appended."""
    prompt_ids = tokenizer(prompts, add_special_tokens=True)["input_ids"]
    response_ids = tokenizer(responses, add_special_tokens=False)["input_ids"]
    eos = tokenizer.eos_token_id
    return [Example(tuple(p + r + [eos]), len(p)) for p, r in zip(prompt_ids, response_ids, strict=True)]


def sample_examples(
    task: ArithChainTask, tokenizer: PreTrainedTokenizerFast, count: int, rng: random.Random
) -> list[Example]:
    """`count` problems from the task, each with one random valid solution."""
    problems = task.sample_batch(count, rng)
    responses = [task.solution_text(problem, rng) for problem in problems]
    return encode_examples(tokenizer, [problem.prompt for problem in problems], responses)


def length_bucketed_batches(examples: list[Example], max_tokens: int, rng: random.Random) -> list[list[Example]]:
    """Sorts by length and cuts into batches whose padded size (rows x longest row) stays within `max_tokens`
    (a sequence longer than that forms a batch alone); the batch order is shuffled."""
    batches: list[list[Example]] = []
    current: list[Example] = []
    for example in sorted(examples, key=lambda e: len(e.input_ids)):
        if current and (len(current) + 1) * len(example.input_ids) > max_tokens:
            batches.append(current)
            current = []
        current.append(example)
    if current:
        batches.append(current)
    rng.shuffle(batches)
    return batches


def collate(batch: list[Example], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pads a batch. Returns input_ids [B, T] and labels [B, T] (IGNORE_INDEX on prompt and padding).

    Padding sits after every real token, so causal attention needs no mask for the positions that get loss.
    """
    width = max(len(e.input_ids) for e in batch)
    input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    labels = torch.full((len(batch), width), IGNORE_INDEX, dtype=torch.long)
    for row, example in enumerate(batch):
        ids = torch.tensor(example.input_ids, dtype=torch.long)
        input_ids[row, : len(ids)] = ids
        labels[row, example.prompt_len : len(ids)] = ids[example.prompt_len :]
    return input_ids, labels


@dataclass(frozen=True)
class LengthCurriculum:
    """Problem sizes are capped at `start_n_max` for the first `hold_steps`, then the cap grows linearly to the
    task's own n_max at `full_step`. Short sequences first make the copy-from-context attention easy to find."""

    start_n_max: int
    hold_steps: int
    full_step: int

    def n_max_at(self, step: int, final_n_max: int) -> int:
        """The size cap in force at `step`."""
        if step < self.hold_steps:
            return min(self.start_n_max, final_n_max)
        if step >= self.full_step:
            return final_n_max
        fraction = (step - self.hold_steps) / max(1, self.full_step - self.hold_steps)
        return min(final_n_max, round(self.start_n_max + fraction * (final_n_max - self.start_n_max)))


class SFTBatches:
    """A seed-determined stream of length-bucketed batches of fresh task samples under a length curriculum.

    Examples are drawn `chunk_examples` at a time with the size cap of the current step and bucketed by length
    within the chunk.
    """

    def __init__(
        self,
        task: ArithChainTask,
        tokenizer: PreTrainedTokenizerFast,
        curriculum: LengthCurriculum,
        max_tokens: int,
        chunk_examples: int,
        seed: int,
    ) -> None:
        self.task = task
        self.tokenizer = tokenizer
        self.curriculum = curriculum
        self.max_tokens = max_tokens
        self.chunk_examples = chunk_examples
        self.rng = random.Random(seed)
        self.pending: list[list[Example]] = []
        self.tasks: dict[int, ArithChainTask] = {}

    def task_at(self, step: int) -> ArithChainTask:
        """The task with the size cap of `step` (cached per cap)."""
        n_max = self.curriculum.n_max_at(step, self.task.config.n_max)
        if n_max not in self.tasks:
            self.tasks[n_max] = ArithChainTask(dataclasses.replace(self.task.config, n_max=n_max))
        return self.tasks[n_max]

    def next(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch for `step`: input_ids [B, T] and labels [B, T]."""
        if not self.pending:
            examples = sample_examples(self.task_at(step), self.tokenizer, self.chunk_examples, self.rng)
            self.pending = length_bucketed_batches(examples, self.max_tokens, self.rng)
        return collate(self.pending.pop(), self.tokenizer.pad_token_id)
