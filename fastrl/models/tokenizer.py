"""Tokenizer loading from a local checkpoint directory (never the network)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase | None:
    """transformers' AutoTokenizer from `path` when it holds a tokenizer.json or tokenizer_config.json, else None."""
    directory = Path(path)
    if not any((directory / name).is_file() for name in TOKENIZER_FILES):
        return None
    from transformers import AutoTokenizer  # deferred: importing transformers costs seconds

    return AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
