"""Tokenizer loading from a local checkpoint directory (never the network), and chat templating."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase | None:
    """transformers' AutoTokenizer from `path` when it holds a tokenizer.json or tokenizer_config.json, else None.
    ValueError naming the directory and its tokenizer files when they do not load (damaged JSON, a directory where a
    file goes, a config whose tokenizer.json is missing)."""
    directory = Path(path)
    present = [name for name in TOKENIZER_FILES if (directory / name).exists()]
    if not any((directory / name).is_file() for name in TOKENIZER_FILES):
        return None
    from transformers import AutoTokenizer  # deferred: importing transformers costs seconds

    try:
        return AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    except Exception as err:  # transformers' own errors are of many kinds: any of them means these files are bad
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        hint = "" if (directory / "tokenizer.json").is_file() else "; fastrl loads fast tokenizers from tokenizer.json"
        raise ValueError(f"{directory}: its tokenizer ({', '.join(present)}) does not load: {first}{hint}") from None


def has_chat_template(tokenizer: Any) -> bool:
    """Whether `tokenizer` (an HF tokenizer or None) carries a chat template."""
    return bool(getattr(tokenizer, "chat_template", None))


def chat_token_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """`messages` (role/content dicts) through the tokenizer's chat template, ending with the assistant's turn
    opened (the generation prompt)."""
    encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)
    return list(encoded["input_ids"])
