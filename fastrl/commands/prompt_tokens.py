"""Token ids of a prompt line: given ids as they are, chat messages through the tokenizer's chat template, text
either as is or (chat mode) as one user turn through that template. The one place a prompt line meets a tokenizer."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jinja2 import TemplateError

from fastrl.commands.prompts_io import PromptLine, read_prompts
from fastrl.engine.scheduler import prompt_problem
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
        try:
            return chat_token_ids(tokenizer, messages)
        except (TemplateError, TypeError, KeyError, ValueError) as err:  # the template's own refusal
            raise ValueError(f"{where}: the chat template of {model} refused this line: {err}") from None
    return list(tokenizer(line.prompt, verbose=False)["input_ids"])  # a prompt past the context: our error, not HF's


@dataclass(frozen=True)
class PromptLimits:
    """What a policy can run: `context` positions (a prompt needs room for a response), token ids below
    `vocab_size`; None checks nothing of that kind."""

    context: int | None = None
    vocab_size: int | None = None

    def check(self, prompt: list[int], where: str) -> None:
        """ValueError naming `where` when the engine would refuse `prompt` (``prompt_problem``: empty, an id
        outside the vocabulary, no room for a response), before any work."""
        problem = prompt_problem(prompt, self.context, self.vocab_size)
        if problem is not None:
            raise ValueError(f"{where}: {problem}")


def file_token_ids(path: str | Path, tokenizer: Any, chat: bool, limits: PromptLimits | None = None) -> list[list[int]]:
    """Token ids of every line of a prompts JSONL file (``read_prompts``), each as ``line_token_ids`` gives them
    (errors name the file and line); `limits`: a line the policy cannot run is an error naming it."""
    prompts = []
    for line in read_prompts(path):
        where = f"{path}:{line.line_no}"
        prompts.append(line_token_ids(line, tokenizer, chat, where))
        if limits is not None:
            limits.check(prompts[-1], where)
    return prompts


def policy_prompt_ids(path: str | Path, model_dir: Path, chat_template: bool = True) -> list[list[int]]:
    """Token ids of every line of a prompts file as the policy of `model_dir` runs them, read before it loads (its
    tokenizer and config.json only): "prompt" text through the tokenizer's chat template when `chat_template` and
    it has one (else as is), "messages" through it, "prompt_ids" as given. A line the policy cannot run
    (`PromptLimits`), a model without a tokenizer or a file without prompts is one ValueError naming it."""
    from fastrl.models.checkpoint import read_config
    from fastrl.models.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(model_dir)
    if tokenizer is None:
        raise ValueError(f"{path}: the model {model_dir} has no tokenizer to read prompts with; give prompt_ids")
    config = read_config(model_dir)
    limits = PromptLimits(config.max_position_embeddings, config.vocab_size)
    prompts = file_token_ids(path, tokenizer, chat_template and has_chat_template(tokenizer), limits)
    if not prompts:
        raise ValueError(f"{path} holds no prompts")
    return prompts
