"""Model configuration for the Llama family (Llama, Qwen2, Qwen3), read from and written to HF config.json."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from fastrl.json_values import is_int

ARCHITECTURES = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3"}
MODEL_TYPES = {family: arch for arch, family in ARCHITECTURES.items()}
MAX_POSITIONS = {"llama": 2048, "qwen2": 32768, "qwen3": 32768}  # config.json lacks it: transformers' family default
KV_HEADS = {"qwen2": 32, "qwen3": 32}  # config.json lacks num_key_value_heads: transformers' default (null: the heads)
SPECIAL_IDS = {"llama": {"bos_token_id": 1, "eos_token_id": 2}}  # absent (not null): transformers' family defaults
DTYPE_NAMES = {
    torch.float32: "float32",
    torch.bfloat16: "bfloat16",
    torch.float16: "float16",
    torch.float64: "float64",  # a float64 policy (exactness runs) is checkpointed as it is
}


@dataclass(frozen=True)
class RopeScaling:
    """Llama-3 ("llama3") RoPE frequency scaling, as in HF `rope_parameters` / `rope_scaling`."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int

    def __post_init__(self) -> None:
        factors = (self.factor, self.low_freq_factor, self.high_freq_factor)
        if not all(math.isfinite(f) for f in factors):  # NaN passes every comparison below
            raise ValueError(f"rope_scaling: factors must be finite numbers, got {self}")
        if self.factor <= 0 or self.low_freq_factor <= 0 or self.high_freq_factor <= self.low_freq_factor:
            raise ValueError(f"rope_scaling: need factor > 0 and high_freq_factor > low_freq_factor > 0, got {self}")
        if self.original_max_position_embeddings <= 0:
            raise ValueError(f"rope_scaling.original_max_position_embeddings must be > 0, got {self}")


@dataclass
class ModelConfig:
    """Architecture of a Llama-family decoder.

    `num_key_value_heads` defaults to `num_attention_heads`, `head_dim` to `hidden_size // num_attention_heads`,
    `attention_bias` to True for qwen2 (q/k/v bias) and False otherwise (for llama/qwen3, True also gives o_proj a
    bias, as in HF), `qk_norm` to True exactly for qwen3. After construction every field is resolved (no None left
    except `rope_scaling`, `bos_token_id`, `eos_token_id`).
    """

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    max_position_embeddings: int = 4096
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    tie_word_embeddings: bool = False
    attention_bias: bool | None = None
    qk_norm: bool | None = None
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None

    def __post_init__(self) -> None:
        if self.model_type not in MODEL_TYPES:
            raise ValueError(f"model_type {self.model_type!r} is not supported (expected one of {list(MODEL_TYPES)})")
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"):
            if int(getattr(self, name)) <= 0:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)!r}")
        if self.num_key_value_heads <= 0 or self.num_attention_heads % self.num_key_value_heads != 0:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        # Qwen2/Qwen3 project hidden_size to heads * head_dim and back whatever they are; transformers' LlamaConfig
        # refuses a hidden_size that is not a multiple of the heads even with a head_dim
        if self.hidden_size % self.num_attention_heads != 0 and (self.head_dim is None or self.model_type == "llama"):
            raise ValueError(
                f"hidden_size ({self.hidden_size}) is not a multiple of "
                f"num_attention_heads ({self.num_attention_heads})"
            )
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.head_dim <= 0 or self.head_dim % 2 != 0:
            raise ValueError(f"head_dim must be a positive even integer (RoPE rotates pairs), got {self.head_dim}")
        if self.attention_bias is None:
            self.attention_bias = self.model_type == "qwen2"
        if self.qk_norm is None:
            self.qk_norm = self.model_type == "qwen3"
        if isinstance(self.rope_scaling, dict):
            self.rope_scaling = _parse_rope(self.rope_scaling, self.max_position_embeddings, None)

    @property
    def o_proj_bias(self) -> bool:
        """Whether o_proj has a bias (HF: llama/qwen3 `attention_bias`; qwen2 never)."""
        return bool(self.attention_bias) and self.model_type != "qwen2"

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> ModelConfig:
        """Reads an HF config.json dict (transformers 4.x `rope_theta`/`rope_scaling` or 5.x `rope_parameters`);
        absent keys take transformers' family defaults. ValueError naming the key for a value of the wrong type or
        out of range (an integer given as a string or a float, a negative norm epsilon or RoPE base, a special token
        id that is not an integer), and for RoPE bases that disagree (see `_rope_theta`)."""
        model_type = _family(d)
        if d.get("hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act {d['hidden_act']!r} is not supported (only 'silu')")
        if d.get("mlp_bias", False):
            raise ValueError("mlp_bias=True is not supported")
        if d.get("use_sliding_window", False):
            raise ValueError("use_sliding_window=True (sliding-window attention) is not supported")
        if d.get("partial_rotary_factor") not in (None, 1.0):  # null: unset, as transformers reads it
            raise ValueError(f"partial_rotary_factor {d['partial_rotary_factor']!r} is not supported (only 1.0)")
        for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"):
            if key not in d:
                raise ValueError(f"config.json lacks required key {key!r}")
        max_pos = _int(d, "max_position_embeddings", MAX_POSITIONS[model_type])
        rope = d.get("rope_scaling") or d.get("rope_parameters") or {}
        if not isinstance(rope, dict) or any(isinstance(v, dict) for v in rope.values()):
            raise ValueError(f"rope parameters {rope!r} are not supported (expected one flat dict)")
        theta = _rope_theta(d)
        attention_bias = True if model_type == "qwen2" else _bool(d, "attention_bias", False)
        vocab = _int(d, "vocab_size", required=True)
        return cls(
            model_type=model_type,
            vocab_size=vocab,
            hidden_size=_int(d, "hidden_size", required=True),
            intermediate_size=_int(d, "intermediate_size", required=True),
            num_hidden_layers=_int(d, "num_hidden_layers", required=True),
            num_attention_heads=_int(d, "num_attention_heads", required=True),
            num_key_value_heads=_kv_heads(d, model_type),
            head_dim=_head_dim(d, model_type),
            max_position_embeddings=max_pos,
            rms_norm_eps=_positive_float(d, "rms_norm_eps", 1e-6),
            rope_theta=theta,
            rope_scaling=_parse_rope(rope, max_pos, d.get("original_max_position_embeddings")),
            tie_word_embeddings=_bool(d, "tie_word_embeddings", False),
            attention_bias=attention_bias,
            qk_norm=model_type == "qwen3",
            bos_token_id=token_ids(d, "bos_token_id", SPECIAL_IDS.get(model_type, {})),
            eos_token_id=token_ids(d, "eos_token_id", SPECIAL_IDS.get(model_type, {})),
        )

    def to_hf_dict(self, dtype: torch.dtype = torch.float32) -> dict[str, Any]:
        """An HF config.json dict (loads in transformers 4.x and 5.x); `dtype` is the stored weights' dtype."""
        if self.qk_norm != (self.model_type == "qwen3"):
            raise ValueError(f"qk_norm={self.qk_norm} cannot be expressed for HF model_type {self.model_type!r}")
        if self.model_type == "qwen2" and not self.attention_bias:
            raise ValueError("HF qwen2 always has q/k/v biases; attention_bias=False cannot be expressed")
        if dtype not in DTYPE_NAMES:
            raise ValueError(f"dtype {dtype} is not supported (expected one of {list(DTYPE_NAMES)})")
        rope_parameters: dict[str, Any] = {"rope_type": "default", "rope_theta": self.rope_theta}
        rope_scaling = None
        if self.rope_scaling is not None:
            s = self.rope_scaling
            rope_scaling = {
                "rope_type": "llama3",
                "factor": s.factor,
                "low_freq_factor": s.low_freq_factor,
                "high_freq_factor": s.high_freq_factor,
                "original_max_position_embeddings": s.original_max_position_embeddings,
            }
            rope_parameters = {**rope_scaling, "rope_theta": self.rope_theta}
        d: dict[str, Any] = {
            "architectures": [MODEL_TYPES[self.model_type]],
            "model_type": self.model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": rope_scaling,
            "rope_parameters": rope_parameters,
            "tie_word_embeddings": self.tie_word_embeddings,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id,
            "torch_dtype": DTYPE_NAMES[dtype],
            "dtype": DTYPE_NAMES[dtype],
            "use_cache": True,
        }
        if self.model_type != "qwen2":
            d["attention_bias"] = bool(self.attention_bias)
        if self.model_type == "llama":
            d["mlp_bias"] = False
        else:
            d.update(use_sliding_window=False, sliding_window=None, max_window_layers=self.num_hidden_layers)
        return d


def _kv_heads(d: dict[str, Any], model_type: str) -> int | None:
    """The key-value heads as transformers reads them: the key's value, the family's default where the key is absent
    (``KV_HEADS``; ValueError naming the absent key where that default cannot serve the heads), the attention heads
    where it is null."""
    if "num_key_value_heads" in d or model_type not in KV_HEADS:
        return _int(d, "num_key_value_heads", None)
    default, heads = KV_HEADS[model_type], d["num_attention_heads"]
    if is_int(heads) and heads >= 1 and heads % default != 0:
        raise ValueError(
            f"config.json lacks num_key_value_heads: transformers' {model_type} default is {default}, which does not "
            f"divide num_attention_heads ({heads}); write the checkpoint's num_key_value_heads into config.json"
        )
    return default


def _int(d: dict[str, Any], key: str, default: int | None = None, required: bool = False) -> int | None:
    """``d[key]`` as a JSON integer >= 1 (``default`` when absent or null, unless ``required``)."""
    value = d.get(key)
    if value is None and not required:
        return default
    if not is_int(value) or value < 1:
        raise ValueError(f"{key} must be an integer >= 1, got {value!r}")
    return value


def _whole(d: dict[str, Any], key: str) -> int:
    """``d[key]`` as an integer >= 1, also when written as a whole float (``8192.0``: transformers computes with it)."""
    value = d[key]
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return _int({key: value}, key, required=True)


def _head_dim(d: dict[str, Any], model_type: str) -> int | None:
    """`head_dim`: absent takes the family's default (Qwen3: 128, as HF's Qwen3Config; else hidden / heads); null
    is refused for Qwen3, whose default would otherwise hide it (transformers refuses it too)."""
    if model_type == "qwen3" and "head_dim" in d and d["head_dim"] is None:
        raise ValueError("head_dim must be an integer >= 1, got None (Qwen3's head size is not hidden / heads)")
    return _int(d, "head_dim", 128 if model_type == "qwen3" else None)


def _positive_float(d: dict[str, Any], key: str, default: float | None) -> float:
    """``d[key]`` as a finite number > 0 (``default`` when absent or null; None: required)."""
    value = d.get(key)
    if value is None and default is not None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        raise ValueError(f"{key} must be a finite number > 0, got {value!r}")
    return float(value)


def _rope_theta(d: dict[str, Any]) -> float:
    """The RoPE base: the one value among the top-level `rope_theta`, `rope_scaling.rope_theta` and
    `rope_parameters.rope_theta` that are read (10000, every family's default, when none is). ValueError naming
    the keys when they disagree: transformers 4.x reads the top-level key only, 5.x the rope dict's first
    (`rope_scaling`, else `rope_parameters`), so the checkpoint is a different model to each, and a rollout could not
    equal the trainer's policy. Beside a `rope_scaling` dict, `rope_parameters` is read by neither version (5.x
    takes the top-level key, else 10000, where `rope_scaling` has no base), so it is not read here either."""
    rope_dict = "rope_scaling" if d.get("rope_scaling") else "rope_parameters"
    sources = {"rope_theta": d, f"{rope_dict}.rope_theta": d.get(rope_dict)}
    given = {key: m.get("rope_theta") for key, m in sources.items() if isinstance(m, dict)}
    thetas = {key: _positive_float(given, key, None) for key, value in given.items() if value is not None}
    if len(set(thetas.values())) > 1:
        values = ", ".join(f"{key}={value}" for key, value in thetas.items())
        raise ValueError(
            f"RoPE bases disagree ({values}): transformers 4.x reads the top-level rope_theta, 5.x rope_scaling's, "
            "else rope_parameters', so the checkpoint is a different model to each; make them equal"
        )
    return next(iter(thetas.values()), 10000.0)


def _bool(d: dict[str, Any], key: str, default: bool) -> bool:
    value = d.get(key, default)
    if not isinstance(value, bool):
        raise ValueError(f"{key} must be true or false, got {value!r}")
    return value


def token_ids(d: dict[str, Any], key: str, defaults: dict[str, int] | None = None) -> int | list[int] | None:
    """A special token id (or, for eos, a list of them, maybe empty): integers >= 0, or None; a key absent from
    ``d`` takes ``defaults[key]`` when there is one (transformers' LlamaConfig fills bos 1 and eos 2), a null stays
    None. (Not checked against the vocabulary: shrunk test checkpoints keep their full model's ids, and
    transformers loads them.)"""
    value = d[key] if key in d else (defaults or {}).get(key)
    ids = value if isinstance(value, list) else [value]
    if value is not None and not all(is_int(t) and t >= 0 for t in ids):
        raise ValueError(f"{key} must be a token id >= 0 (or a list of them), got {value!r}")
    return value


def _family(d: dict[str, Any]) -> str:
    """The model family named by `architectures` (first entry) or, lacking it, by `model_type`; ValueError when
    both are given and disagree (transformers builds a model by `model_type`: a Mistral or Granite checkpoint
    labelled ``LlamaForCausalLM`` would run here as another model, its sliding window or multipliers dropped)."""
    archs = d.get("architectures") or []
    if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
        raise ValueError(f"architectures must be a list of class names, got {archs!r}")
    if archs:
        if archs[0] not in ARCHITECTURES:
            raise ValueError(f"architecture {archs[0]!r} is not supported (expected one of {list(ARCHITECTURES)})")
        family = ARCHITECTURES[archs[0]]
        named = d.get("model_type")
        if named is not None and named != family:
            raise ValueError(
                f"model_type {named!r} disagrees with architectures {archs[0]!r} (model_type {family!r}): "
                "transformers builds the model by model_type, so this checkpoint is not the model that family "
                "computes"
            )
        return family
    model_type = d.get("model_type")
    if not isinstance(model_type, str) or model_type not in MODEL_TYPES:
        raise ValueError(f"model_type {model_type!r} is not supported (expected one of {list(MODEL_TYPES)})")
    return model_type


def _parse_rope(rope: dict[str, Any], max_position_embeddings: int, top_level_original: object) -> RopeScaling | None:
    """HF rope scaling dict -> RopeScaling (llama3) or None (default); other types raise ValueError. The original
    context of llama3 scaling is the rope dict's `original_max_position_embeddings` or the config's top-level one
    (transformers 5.x prefers the latter, 4.x reads the former): ValueError naming both when they disagree, the
    model's `max_position_embeddings` when neither is given."""
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type in (None, "default"):
        return None
    if rope_type != "llama3":
        raise ValueError(f"rope_scaling type {rope_type!r} is not supported (only 'default' and 'llama3')")
    given = {"the rope dict's original_max_position_embeddings": rope.get("original_max_position_embeddings")}
    given["original_max_position_embeddings"] = top_level_original
    originals = {key: _whole(given, key) for key, value in given.items() if value is not None}
    if len(set(originals.values())) > 1:
        values = ", ".join(f"{key}={value}" for key, value in originals.items())
        raise ValueError(
            f"llama3 RoPE's original contexts disagree ({values}): transformers 5.x reads the top-level key, 4.x the "
            "rope dict's, so the checkpoint is a different model to each; make them equal"
        )
    try:
        return RopeScaling(
            factor=float(rope["factor"]),
            low_freq_factor=float(rope["low_freq_factor"]),
            high_freq_factor=float(rope["high_freq_factor"]),
            original_max_position_embeddings=next(iter(originals.values()), max_position_embeddings),
        )
    except KeyError as err:
        raise ValueError(f"llama3 rope_scaling lacks key {err.args[0]!r}: {rope!r}") from None
    except (TypeError, ValueError):
        raise ValueError(f"llama3 rope_scaling needs finite numbers for its factors, got {rope!r}") from None
