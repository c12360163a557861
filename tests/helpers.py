"""Small random HF checkpoints for tests (built in code, never downloaded)."""

from __future__ import annotations

from pathlib import Path

import torch

TINY_FAMILIES = ("llama", "llama_tied", "qwen2", "qwen3")


def make_hf_model(family: str, seed: int = 0, vocab_size: int = 97, max_positions: int = 256, **sizes: int):
    """A tiny random-initialised transformers model of `family` (llama, llama_tied, qwen2, qwen3); `sizes` replace
    its config's defaults (e.g. ``hidden_size=256``)."""
    import transformers

    torch.manual_seed(seed)
    common = (
        dict(
            vocab_size=vocab_size,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=max_positions,
            rms_norm_eps=1e-6,
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=0,
        )
        | sizes
    )
    if family in ("llama", "llama_tied"):
        config = transformers.LlamaConfig(tie_word_embeddings=family == "llama_tied", rope_theta=10000.0, **common)
        model = transformers.LlamaForCausalLM(config)
    elif family == "qwen2":
        config = transformers.Qwen2Config(tie_word_embeddings=False, rope_theta=1e6, **common)
        model = transformers.Qwen2ForCausalLM(config)
    elif family == "qwen3":
        config = transformers.Qwen3Config(tie_word_embeddings=True, rope_theta=1e6, **({"head_dim": 16} | common))
        model = transformers.Qwen3ForCausalLM(config)
    else:
        raise ValueError(family)
    # Larger-than-default weights make logits spread out, so greedy choices are far from ties.
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.08)
    return model.eval()


def save_hf_model(family: str, path: Path, seed: int = 0) -> Path:
    """Save a tiny random model of `family` to `path` as an HF checkpoint directory."""
    model = make_hf_model(family, seed)
    model.save_pretrained(path)
    return path


# Log-probs of the same token from a float64 engine, computed by differently shaped kernels (a plain row, a verify
# row, another batch): float64 rounding only, ~1e-15. Anything near a float32 ulp (~1e-7) is a bug.
FLOAT64_LOGPROB_TOL = 1e-12


CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def chat_tokenizer():
    """The bundled model's real HF tokenizer with a plain-ASCII chat template (every character is in its vocab)."""
    from fastrl.assets_path import bundled_model_dir
    from fastrl.models.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(bundled_model_dir())
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def save_chat_model(path: Path) -> Path:
    """A copy of the bundled model whose tokenizer carries CHAT_TEMPLATE (a chat model for the commands)."""
    import shutil

    from fastrl.assets_path import bundled_model_dir

    shutil.copytree(bundled_model_dir(), path, dirs_exist_ok=True)
    chat_tokenizer().save_pretrained(path)
    return path


def last_layer_drafter(policy):
    """The shipped bundled drafter's weights but its fuse, as a last-layer EagleDrafter (float32, eval). The shipped
    drafter reads EAGLE-3's fused input; tests of what only a last-layer drafter does (export to SGLang / vLLM, a
    fused drafter starting from the identity fuse) take it from here."""
    from fastrl.assets_path import bundled_drafter_dir
    from fastrl.speculative.drafter import EagleDrafter
    from fastrl.speculative.drafter_checkpoint import load_drafter

    shipped = load_drafter(bundled_drafter_dir(), policy)[0]
    drafter = EagleDrafter(shipped.config)
    drafter.load_state_dict({k: v for k, v in shipped.state_dict().items() if not k.startswith("fuse.")})
    drafter.set_draft_vocab(shipped.draft_vocab)
    return drafter.float().eval()


def write_last_layer_drafter(directory: str | Path) -> Path:
    """`last_layer_drafter` saved as a drafter checkpoint in `directory` (for commands that read one)."""
    from fastrl.assets_path import bundled_model_dir
    from fastrl.models.checkpoint import load_model
    from fastrl.speculative.drafter_checkpoint import save_drafter

    save_drafter(last_layer_drafter(load_model(bundled_model_dir())), directory, "arith-tiny", version=1)
    return Path(directory)


def random_tree_mask(rng, lengths: list[int], queries: int, width: int, first_key: int = 0, link: float = 0.6):
    """Row b's `queries` new entries at cache indices lengths[b] + i under a random tree: each sees the keys
    [first_key, lengths[b]], itself, and each earlier new entry with chance `link`; about one in ten is padding
    (sees nothing).  # -> index [B,S] long, mask [B,S,width] bool"""
    index = torch.tensor([[n + i for i in range(queries)] for n in lengths])
    keys = torch.arange(width)
    mask = (keys >= first_key) & (keys <= index.unsqueeze(-1))
    for b, n in enumerate(lengths):
        for i in range(queries):
            for j in range(i):
                mask[b, i, n + j] = rng.random() < link
            if rng.random() < 0.1:
                mask[b, i] = False
    return index, mask


def triton_or_skip():
    """Triton, which runs its kernels compiled on a GPU and in its interpreter elsewhere (tests/conftest.py sets
    TRITON_INTERPRET without CUDA); skips the calling test module where neither can run."""
    import numpy as np
    import pytest

    triton = pytest.importorskip("triton", reason="the Triton kernel needs triton (installed with the dev extra)")

    def version(text: str) -> tuple[int, ...]:
        return tuple(int(part) for part in text.split(".")[:2])

    if not torch.cuda.is_available() and version(triton.__version__) < (3, 9) and version(np.__version__) >= (2, 4):
        reason = "Triton < 3.9's interpreter fails on NumPy >= 2.4 (scalars as 1-element arrays)"
        pytest.skip(reason, allow_module_level=True)
    return triton


def kernel_test_setup(tmp_path: Path, strategy: str, seed: int, requests: int, max_new: int):
    """What the attention kernels' engine tests generate with: a tiny float64 Llama saved and loaded back, a random
    float64 drafter (None for `disable`), and `requests` prompts of 2-40 tokens, each greedy or at T=1 with its
    own seed and 4-`max_new` new tokens.  # -> model, drafter, [GenerateInput]"""
    import random

    from fastrl.engine.engine import GenerateInput
    from fastrl.models.checkpoint import load_model
    from fastrl.sampling.params import SamplingParams
    from fastrl.speculative.drafter import EagleDrafter

    path = tmp_path / "llama"
    make_hf_model("llama", seed=4).save_pretrained(path)
    model = load_model(path, dtype=torch.float64)
    torch.manual_seed(0)
    drafter = None if strategy == "disable" else EagleDrafter(model.config).to(torch.float64)
    rng = random.Random(seed)
    inputs = [
        GenerateInput(
            [rng.randrange(3, 90) for _ in range(rng.randint(2, 40))],
            SamplingParams(max_new_tokens=rng.randint(4, max_new), temperature=rng.choice([0.0, 1.0]), seed=i),
        )
        for i in range(requests)
    ]
    return model, drafter, inputs
