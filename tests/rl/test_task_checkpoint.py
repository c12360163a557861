"""The bundled checkpoint: loads with plain transformers from the package directory and solves small problems."""

import json
import random
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import fastrl
from fastrl.rl.tasks import ArithChainTask
from fastrl.rl.tasks.reward import parse_answer

CHECKPOINT = Path(fastrl.__file__).parent / "assets" / "arith-tiny"


def test_checkpoint_files_are_present_and_small():
    names = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
    for name in names:
        assert (CHECKPOINT / name).is_file(), name
    assert (CHECKPOINT / "model.safetensors").stat().st_size <= 20 * 2**20
    config = json.loads((CHECKPOINT / "config.json").read_text())
    assert config["model_type"] == "llama"
    assert config["num_key_value_heads"] < config["num_attention_heads"]
    task = ArithChainTask()
    assert config["max_position_embeddings"] >= task.max_prompt_chars() + task.max_response_chars() + 2


def test_checkpoint_loads_in_transformers_and_solves_small_problems():
    model = AutoModelForCausalLM.from_pretrained(CHECKPOINT).eval()
    tokenizer = AutoTokenizer.from_pretrained(CHECKPOINT)
    assert model.config.vocab_size == len(tokenizer)
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id
    task = ArithChainTask()
    rng = random.Random(0)
    problems = [task.make_problem([rng.randint(1, 99) for _ in range(2 + i % 2)]) for i in range(16)]
    enc = tokenizer([p.prompt for p in problems], return_tensors="pt", padding=True, padding_side="left")
    with torch.no_grad():
        logits = model(**enc).logits  # [B, T, V]
        assert logits.shape == (*enc["input_ids"].shape, len(tokenizer))
        out = model.generate(**enc, max_new_tokens=64, do_sample=False)  # [B, T + new]
    texts = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    assert all(parse_answer(text) is not None for text in texts), texts  # the format is always learned
    rewards = [task.reward(p, t) for p, t in zip(problems, texts, strict=True)]
    assert sum(rewards) >= 8, texts  # eval.json: about 78% greedy accuracy on 2-3 terms
