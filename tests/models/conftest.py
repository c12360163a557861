"""Tiny random HF reference models (built from configs in code, never downloaded) for fastrl.models tests."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from transformers import (  # noqa: E402
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

TINY = dict(
    vocab_size=97,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    max_position_embeddings=128,
    rms_norm_eps=1e-5,
)
HEADS6 = {**TINY, "num_attention_heads": 6, "num_key_value_heads": 2, "head_dim": 16}  # q_proj 64 -> 96, o_proj back
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}


def hf_reference(name: str) -> PreTrainedModel:
    """A tiny HF model of the named flavour with all parameters (norms and biases too) randomised, seed fixed."""
    torch.manual_seed(0)
    if name == "llama_gqa":
        model = LlamaForCausalLM(LlamaConfig(**TINY, num_key_value_heads=2, bos_token_id=1, eos_token_id=2))
    elif name == "llama_tied":
        model = LlamaForCausalLM(LlamaConfig(**TINY, num_key_value_heads=4, tie_word_embeddings=True))
    elif name == "llama3_rope":
        model = LlamaForCausalLM(LlamaConfig(**TINY, num_key_value_heads=1, rope_parameters=dict(LLAMA3_ROPE)))
    elif name == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**TINY, num_key_value_heads=2, eos_token_id=[3, 4]))
    elif name == "qwen3":
        config = Qwen3Config(**TINY, num_key_value_heads=2, head_dim=32, attention_bias=True, tie_word_embeddings=True)
        model = Qwen3ForCausalLM(config)
    elif name == "qwen2_heads6":
        model = Qwen2ForCausalLM(Qwen2Config(**HEADS6))
    elif name == "qwen3_heads6":
        model = Qwen3ForCausalLM(Qwen3Config(**HEADS6))
    else:
        raise ValueError(f"unknown reference model {name!r}")
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(0.1 * torch.randn_like(p))
    return model.eval()


FLAVOURS = ["llama_gqa", "llama_tied", "llama3_rope", "qwen2", "qwen3", "qwen2_heads6", "qwen3_heads6"]


@pytest.fixture(params=FLAVOURS)
def flavour(request: pytest.FixtureRequest) -> str:
    """Every reference flavour: Llama GQA, Llama tied MHA, Llama-3 rope scaling, Qwen2 (bias), Qwen3 (qk norm), and
    Qwen2/Qwen3 with heads that do not divide the hidden size (transformers' LlamaConfig refuses those)."""
    return request.param


@pytest.fixture
def hf_checkpoint(tmp_path: Path) -> Callable[[str], tuple[PreTrainedModel, Path]]:
    """Factory: flavour name -> (HF model, directory it was saved to with save_pretrained)."""

    def make(name: str, **save_kwargs) -> tuple[PreTrainedModel, Path]:
        model = hf_reference(name)
        directory = tmp_path / name
        model.save_pretrained(directory, **save_kwargs)
        return model, directory

    return make
