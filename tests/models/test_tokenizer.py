"""load_tokenizer reads a local tokenizer directory and returns None when there is none."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace
from transformers import PreTrainedTokenizerFast

from fastrl.models import load_tokenizer


def test_loads_local_tokenizer(tmp_path):
    vocab = {"<unk>": 0, "<eos>": 1, "hello": 2, "world": 3}
    backend = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", eos_token="<eos>").save_pretrained(tmp_path)
    tokenizer = load_tokenizer(tmp_path)
    assert tokenizer is not None
    assert tokenizer("hello world again")["input_ids"] == [2, 3, 0]
    assert tokenizer.eos_token_id == 1 and tokenizer.decode([2, 3]) == "hello world"


def test_directory_without_tokenizer_gives_none(tmp_path):
    assert load_tokenizer(tmp_path) is None


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (
            lambda d: (d / "tokenizer.json").write_text("{garbage"),
            r"\(tokenizer.json, tokenizer_config.json\) does not",
        ),
        (
            lambda d: (d / "tokenizer.json").write_text("[]"),
            r"\(tokenizer.json, tokenizer_config.json\) does not load: invalid type",
        ),
        (lambda d: (d / "tokenizer.json").unlink(), r"\(tokenizer_config.json\) does not load: .*from tokenizer.json"),
    ],
)
def test_damaged_tokenizer_files_are_one_error_naming_the_directory(tmp_path, damage, message):
    import shutil

    from fastrl.assets_path import bundled_model_dir

    model = tmp_path / "model"
    shutil.copytree(bundled_model_dir(), model)
    damage(model)
    with pytest.raises(ValueError, match=f"^{model}: its tokenizer {message}"):
        load_tokenizer(model)
