"""Llama-family decoder (Llama, Qwen2, Qwen3) with HF parameter names, position-addressed KV cache, HF checkpoint IO."""

from fastrl.models.checkpoint import load_model, read_config, save_model
from fastrl.models.config import ModelConfig, RopeScaling
from fastrl.models.decoder import CausalLM, ModelOutput
from fastrl.models.kv_cache import KVCache, SlotRows
from fastrl.models.layers import DecoderLayer
from fastrl.models.masks import attention_mask
from fastrl.models.rope import RotaryEmbedding
from fastrl.models.tokenizer import load_tokenizer

__all__ = [
    "CausalLM",
    "DecoderLayer",
    "KVCache",
    "ModelConfig",
    "ModelOutput",
    "RopeScaling",
    "RotaryEmbedding",
    "SlotRows",
    "attention_mask",
    "load_model",
    "load_tokenizer",
    "read_config",
    "save_model",
]
