"""Where `fastrl train-drafter` takes its prompts: a prompts file (chat-templated for chat models), split into
training and held-out prompts, or the bundled task's prompts."""

from __future__ import annotations

import random
from typing import Any

from fastrl.commands.prompt_tokens import PromptLimits, file_token_ids
from fastrl.commands.train_drafter_config import TrainDrafterConfig
from fastrl.cotrain.offline import task_prompts
from fastrl.models.tokenizer import has_chat_template


def training_prompts(
    tokenizer: Any, cfg: TrainDrafterConfig, limits: PromptLimits | None = None
) -> tuple[list[list[int]], list[list[int]]]:
    """(train, held-out) prompt ids: from cfg.prompts when set (a seeded split), else num_prompts and eval_prompts
    bundled-task prompts drawn with different seeds. `limits`: the policy's; a prompt it cannot run (empty, ids
    outside its vocabulary, no room for a response) is an error naming its line, before any rollout."""
    if cfg.prompts:
        return split_prompts(file_prompt_ids(cfg.prompts, tokenizer, cfg.chat_template, limits), cfg)
    train = task_prompts(tokenizer, cfg.num_prompts, cfg.seed)
    held = task_prompts(tokenizer, cfg.eval_prompts, cfg.seed + 1)
    for i, prompt in enumerate(train + held):
        if limits is not None:
            limits.check(prompt, f"task prompt {i}")
    return train, unseen(held, train, "the bundled task's")


def file_prompt_ids(
    path: str, tokenizer: Any, chat_template: bool, limits: PromptLimits | None = None
) -> list[list[int]]:
    """Token ids of every prompt of a prompts JSONL file: "prompt" text as one user turn through the tokenizer's
    chat template (when `chat_template` and the tokenizer has one), else tokenized as is; "messages" through the
    chat template; "prompt_ids" as given. `limits` (the policy's): a prompt it cannot run is an error naming its
    line."""
    prompts = file_token_ids(path, tokenizer, chat_template and has_chat_template(tokenizer), limits)
    if not prompts:
        raise ValueError(f"train_drafter.prompts={path}: the file holds no prompts")
    return prompts


def split_prompts(prompts: list[list[int]], cfg: TrainDrafterConfig) -> tuple[list[list[int]], list[list[int]]]:
    """(train, held-out) prompts after a seeded shuffle; the held-out part has eval_prompts of them."""
    if len(prompts) <= cfg.eval_prompts:
        raise ValueError(
            f"train_drafter.eval_prompts={cfg.eval_prompts} leaves no training prompts of the {len(prompts)} in "
            f"{cfg.prompts}"
        )
    order = list(range(len(prompts)))
    random.Random(cfg.seed).shuffle(order)
    held = [prompts[i] for i in order[: cfg.eval_prompts]]
    train = [prompts[i] for i in order[cfg.eval_prompts :]][: cfg.num_prompts]
    return train, unseen(held, train, f"{cfg.prompts}'s")


def unseen(held: list[list[int]], train: list[list[int]], source: str) -> list[list[int]]:
    """The held-out prompts that are no training prompt, each once (a held-out measure of a prompt trained on, a
    repeated line of a prompts file or a task problem drawn twice, measures memory); ValueError when none is left.
    The training prompts stay as they are (a stream's shards were generated from them)."""
    seen = {tuple(p) for p in train}
    kept = []
    for prompt in held:
        if tuple(prompt) not in seen:
            kept.append(prompt)
            seen.add(tuple(prompt))
    if not kept:
        raise ValueError(
            f"train_drafter.eval_prompts: every held-out prompt of {source} prompts is also a training prompt; "
            "give more distinct prompts"
        )
    return kept
