"""Token ids of a prompt line: given ids as they are, chat messages through the tokenizer's chat template, text
either as is or (chat mode) as one user turn through that template. The one place a prompt line meets a tokenizer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastrl.commands.prompts_io import PromptLine, read_prompts
from fastrl.models.tokenizer import chat_token_ids, has_chat_template


def line_token_ids(line: PromptLine, tokenizer: Any, chat: bool, where: str, model: str = "the model") -> list[int]:
    """The token ids of `line`; `chat`: its "prompt" text is one user turn of a chat (needs a chat template).

    Raises ValueError naming `where` (file:line) when the line needs a tokenizer or a chat template the model
    (`model`, for the message) does not have.
    """
    if line.prompt_ids is not None:
        return list(line.prompt_ids)
    if tokenizer is None:
        kind = '"messages"' if line.messages is not None else '"prompt" text'
        raise ValueError(f'{where}: {kind} needs a tokenizer, and {model} has none; give "prompt_ids" instead')
    if line.messages is not None or chat:
        if not has_chat_template(tokenizer):
            what = '"messages"' if line.messages is not None else "chat_template=true"
            raise ValueError(
                f'{where}: {what} needs a chat template, and the tokenizer of {model} has none; give "prompt" '
                f"text (with chat_template=false) or prompt_ids"
            )
        messages = line.messages if line.messages is not None else [{"role": "user", "content": line.prompt}]
        return chat_token_ids(tokenizer, messages)
    return list(tokenizer(line.prompt)["input_ids"])


def file_token_ids(path: str | Path, tokenizer: Any, chat: bool, context: int | None = None) -> list[list[int]]:
    """Token ids of every line of a prompts JSONL file (``read_prompts``), each as ``line_token_ids`` gives them
    (errors name the file and line); `context` (the policy's positions): a line of that many tokens or more is an
    error (``check_prompt_fits``)."""
    prompts = []
    for line in read_prompts(path):
        where = f"{path}:{line.line_no}"
        prompts.append(line_token_ids(line, tokenizer, chat, where))
        check_prompt_fits(prompts[-1], context, where)
    return prompts


def check_prompt_fits(prompt: list[int], context: int | None, where: str) -> None:
    """ValueError naming `where` when `prompt` leaves no room for a response in `context` positions (the engine's
    own rule, which would refuse the request at run time); None checks nothing."""
    if context is not None and len(prompt) >= context:
        raise ValueError(
            f"{where}: the prompt has {len(prompt)} tokens, and the policy's context ({context} positions) leaves "
            "no room for a response; shorten or remove it"
        )
