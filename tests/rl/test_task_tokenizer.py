"""The bundled character-level tokenizer: exact round trip, special tokens, Hugging Face loading."""

import random

from transformers import AutoTokenizer

from fastrl.rl.tasks import ArithChainTask
from fastrl.rl.tasks.tokenizer import ALPHABET, build_tokenizer, build_tokenizer_object, save_tokenizer


def test_round_trip_is_exact_and_one_token_per_character():
    tokenizer = build_tokenizer_object()
    task = ArithChainTask()
    rng = random.Random(0)
    texts = [ALPHABET, "  two  spaces\nand newline ", ""]
    for problem in task.sample_batch(200, rng):
        texts += [problem.prompt, task.solution_text(problem, rng)]
    for text in texts:
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        assert len(ids) == len(text)
        assert tokenizer.decode(ids) == text
    assert len({tokenizer.token_to_id(c) for c in "0123456789"}) == 10


def test_special_tokens_and_small_vocab():
    tokenizer = build_tokenizer()
    assert (tokenizer.pad_token, tokenizer.bos_token, tokenizer.eos_token) == ("<pad>", "<bos>", "<eos>")
    assert (tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id) == (0, 1, 2)
    assert len(tokenizer) < 128
    ids = tokenizer("sum 1 2 =")["input_ids"]
    assert ids[0] == tokenizer.bos_token_id and len(ids) == 10
    with_eos = ids + [tokenizer.eos_token_id]
    assert tokenizer.decode(with_eos, skip_special_tokens=True) == "sum 1 2 ="
    assert tokenizer.decode(with_eos) == "<bos>sum 1 2 =<eos>"
    assert tokenizer.decode(tokenizer("a~b")["input_ids"], skip_special_tokens=True) == "ab"  # unknown -> <unk>


def test_saved_tokenizer_loads_with_auto_tokenizer(tmp_path):
    save_tokenizer(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    text = " a+b=23+5=28, +c=28+81=109 (check 109-81=28); so answer 113"
    ids = tokenizer(text)["input_ids"]
    assert ids[0] == tokenizer.bos_token_id
    assert tokenizer.decode(ids, skip_special_tokens=True) == text
    batch = tokenizer(["sum 1 2 =", "sum 10 20 30 ="], padding=True, padding_side="left")
    assert batch["input_ids"][0][:5] == [tokenizer.pad_token_id] * 5
    assert batch["attention_mask"][0][:6] == [0] * 5 + [1]
