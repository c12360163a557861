"""What a standalone script that times one model with and without speculation loads: the policy, its drafter and its
prompts, each bad flag one ValueError naming it (the script prints it as its usage error)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastrl.commands.engine_setup import load_speculative_models, resolve_model_dir
from fastrl.commands.prompt_tokens import policy_prompt_ids
from fastrl.models.decoder import CausalLM
from fastrl.speculative.drafter import EagleDrafter


def load_script_models(
    model: str, drafter: str, prompts_file: str | Path | None, default_prompts: Callable[[Any], list[list[int]]]
) -> tuple[CausalLM, EagleDrafter, list[list[int]]]:
    """``--model``'s policy, ``--drafter`` (empty: the one shipped with the model) and the prompts:
    ``--prompts-file`` read and checked against the policy before anything loads (``policy_prompt_ids``), else
    ``default_prompts(tokenizer)``. ValueError naming the flag."""
    from_file = None
    if prompts_file:
        try:
            model_dir = resolve_model_dir(model, "--model")
        except ValueError as err:
            raise ValueError(str(err).replace("--model=", "--model ", 1)) from None
        try:
            from_file = policy_prompt_ids(prompts_file, model_dir)
        except ValueError as err:
            raise ValueError(f"--prompts-file: {err}") from None
    try:
        policy, loaded, tokenizer = load_speculative_models(model, drafter)
        prompts = from_file if from_file is not None else default_prompts(tokenizer)
    except ValueError as err:
        said = str(err)
        for key in ("model", "drafter"):
            said = said.replace(f"{key}=", f"--{key} ", 1) if said.startswith(f"{key}=") else said
        raise ValueError(said) from None
    return policy, loaded, prompts
