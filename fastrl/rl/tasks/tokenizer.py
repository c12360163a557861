"""The bundled character-level tokenizer, built with `tokenizers` and saved in Hugging Face format.

Every character of the alphabet is one token (digits included), so token counts equal character counts and
``decode(encode(text)) == text`` for any text over the alphabet. Special tokens: ``<pad>`` (0), ``<bos>`` (1),
``<eos>`` (2), ``<unk>`` (3); encoding with special tokens prepends ``<bos>``.
"""

from __future__ import annotations

import json
import string
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

PAD_TOKEN = "<pad>"
BOS_TOKEN = "<bos>"
EOS_TOKEN = "<eos>"
UNK_TOKEN = "<unk>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN)
ALPHABET: str = string.digits + string.ascii_lowercase + string.ascii_uppercase + " \n+-*/=()[],.;:!?'\"<>_#%&"
MODEL_MAX_LENGTH = 1024


def build_tokenizer_object() -> Tokenizer:
    """The raw `tokenizers.Tokenizer`: one token per character, unknown characters map to ``<unk>``."""
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    for char in ALPHABET:
        vocab[char] = len(vocab)
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK_TOKEN))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    bos_id = vocab[BOS_TOKEN]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A", pair=f"{BOS_TOKEN} $A $B", special_tokens=[(BOS_TOKEN, bos_id)]
    )
    return tokenizer


def build_tokenizer(model_max_length: int = MODEL_MAX_LENGTH) -> PreTrainedTokenizerFast:
    """The Hugging Face fast tokenizer wrapping `build_tokenizer_object()`."""
    return PreTrainedTokenizerFast(
        tokenizer_object=build_tokenizer_object(),
        pad_token=PAD_TOKEN,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
    )


def save_tokenizer(directory: str | Path, model_max_length: int = MODEL_MAX_LENGTH) -> None:
    """Writes ``tokenizer.json``, ``tokenizer_config.json`` and ``special_tokens_map.json`` to `directory`, loadable
    offline by ``transformers.AutoTokenizer.from_pretrained(directory)`` (transformers 4.x and 5.x)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer_object()
    tokenizer.save(str(directory / "tokenizer.json"))
    added = {
        str(tokenizer.token_to_id(token)): {
            "content": token,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for token in SPECIAL_TOKENS
    }
    special = {"pad_token": PAD_TOKEN, "bos_token": BOS_TOKEN, "eos_token": EOS_TOKEN, "unk_token": UNK_TOKEN}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added,
        "model_max_length": model_max_length,
        "clean_up_tokenization_spaces": False,
        "padding_side": "right",
        **special,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (directory / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")
