"""ModelConfig <-> HF config.json, in both the transformers 4.x and 5.x rope formats."""

from __future__ import annotations

import json
import re

import pytest
import torch
from transformers import AutoConfig

from fastrl.assets_path import assets_dir, bundled_model_dir
from fastrl.models import ModelConfig, RopeScaling, read_config
from fastrl.models.config import ARCHITECTURES

LLAMA31_V4 = {  # Llama-3.1 config.json as written by transformers 4.x (shrunk)
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 128,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "tie_word_embeddings": False,
    "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009],
    "torch_dtype": "bfloat16",
    "hidden_act": "silu",
}


def test_reads_transformers_v4_llama31_config():
    config = ModelConfig.from_hf_dict(LLAMA31_V4)
    assert config.model_type == "llama" and config.head_dim == 16 and config.num_key_value_heads == 2
    assert config.rope_theta == 500000.0
    assert config.rope_scaling == RopeScaling(8.0, 1.0, 4.0, 8192)
    assert config.eos_token_id == [128001, 128008, 128009]
    assert config.attention_bias is False and config.qk_norm is False


def test_reads_transformers_v5_rope_parameters():
    d = {k: v for k, v in LLAMA31_V4.items() if k not in ("rope_theta", "rope_scaling")}
    d["rope_parameters"] = {**LLAMA31_V4["rope_scaling"], "rope_theta": 500000.0}
    assert ModelConfig.from_hf_dict(d) == ModelConfig.from_hf_dict(LLAMA31_V4)
    d["rope_parameters"] = {"rope_type": "default", "rope_theta": 1e6}
    plain = ModelConfig.from_hf_dict(d)
    assert plain.rope_scaling is None and plain.rope_theta == 1e6


def test_family_defaults():
    base = dict(vocab_size=10, hidden_size=32, intermediate_size=8, num_hidden_layers=1, num_attention_heads=4)
    qwen2 = ModelConfig.from_hf_dict({**base, "model_type": "qwen2", "num_key_value_heads": 2})
    qwen3 = ModelConfig.from_hf_dict(
        {**base, "architectures": ["Qwen3ForCausalLM"], "head_dim": 16, "num_key_value_heads": 4}
    )
    assert qwen2.attention_bias and not qwen2.qk_norm and not qwen2.o_proj_bias and qwen2.num_key_value_heads == 2
    assert qwen3.qk_norm and not qwen3.attention_bias and qwen3.head_dim == 16
    assert ModelConfig.from_hf_dict({**base, "model_type": "qwen3", "num_key_value_heads": 4}).head_dim == 128  # as HF


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "qwen3"])
def test_to_hf_dict_loads_in_autoconfig(tmp_path, model_type):
    scaling = RopeScaling(8.0, 1.0, 4.0, 64) if model_type == "llama" else None
    config = ModelConfig(model_type, 100, 64, 96, 2, 4, 2, head_dim=32, rope_theta=1e6, rope_scaling=scaling)
    (tmp_path / "config.json").write_text(json.dumps(config.to_hf_dict(dtype=torch.bfloat16)))
    hf = AutoConfig.from_pretrained(tmp_path)
    assert hf.model_type == model_type and hf.head_dim == 32 and hf.num_key_value_heads == 2
    assert hf.rope_parameters["rope_theta"] == 1e6 and hf.dtype == torch.bfloat16
    assert hf.rope_parameters["rope_type"] == ("llama3" if scaling else "default")
    assert ModelConfig.from_hf_dict(json.loads((tmp_path / "config.json").read_text())) == config


@pytest.mark.parametrize(
    ("d", "message"),
    [
        ({"architectures": ["GPT2LMHeadModel"]}, "architecture 'GPT2LMHeadModel' is not supported"),
        ({"architectures": [], "model_type": "gemma"}, "model_type 'gemma' is not supported"),
        ({"rope_scaling": {"type": "linear", "factor": 2.0}}, "rope_scaling type 'linear' is not supported"),
        ({"rope_scaling": {"rope_type": "llama3", "factor": 2.0}}, "lacks key 'low_freq_factor'"),
        ({"use_sliding_window": True}, "sliding"),
        ({"num_key_value_heads": 3}, "multiple of num_key_value_heads"),
        # values of the wrong type or out of range: one error naming the key (were tracebacks or silent)
        ({"vocab_size": None}, r"vocab_size must be an integer >= 1, got None"),
        ({"vocab_size": [91]}, r"vocab_size must be an integer >= 1, got \[91\]"),
        ({"vocab_size": True}, r"vocab_size must be an integer >= 1, got True"),
        ({"hidden_size": 192.7}, r"hidden_size must be an integer >= 1, got 192.7"),
        ({"num_key_value_heads": "2"}, r"num_key_value_heads must be an integer >= 1, got '2'"),
        ({"head_dim": 32.0}, r"head_dim must be an integer >= 1, got 32.0"),
        ({"max_position_embeddings": 0}, r"max_position_embeddings must be an integer >= 1, got 0"),
        ({"max_position_embeddings": -5}, r"max_position_embeddings must be an integer >= 1, got -5"),
        ({"rms_norm_eps": -1}, r"rms_norm_eps must be a finite number > 0, got -1"),
        ({"rms_norm_eps": "abc"}, r"rms_norm_eps must be a finite number > 0, got 'abc'"),
        ({"rope_theta": 0}, r"rope_theta must be a finite number > 0, got 0"),
        ({"rope_theta": -1e4}, r"rope_theta must be a finite number > 0"),
        ({"tie_word_embeddings": "false"}, r"tie_word_embeddings must be true or false, got 'false'"),
        ({"eos_token_id": "2"}, r"eos_token_id must be a token id >= 0 \(or a list of them\), got '2'"),
        ({"eos_token_id": [2, "x"]}, r"eos_token_id must be a token id"),
        ({"bos_token_id": -1}, r"bos_token_id must be a token id"),
        ({"architectures": [["LlamaForCausalLM"]]}, r"architectures must be a list of class names"),
        ({"architectures": "LlamaForCausalLM"}, r"architectures must be a list of class names"),
        ({"architectures": [], "model_type": ["llama"]}, r"model_type \['llama'\] is not supported"),
        (
            {"rope_scaling": {"rope_type": "llama3", "factor": None, "low_freq_factor": 1, "high_freq_factor": 4}},
            "llama3 rope_scaling needs finite numbers",
        ),
        *(
            (
                {"rope_scaling": {**LLAMA31_V4["rope_scaling"], key: value}},
                "llama3 rope_scaling needs finite numbers",
            )
            for key in ("factor", "low_freq_factor", "high_freq_factor")
            for value in (float("nan"), float("inf"))
        ),
        ({"rope_theta": None, "rope_scaling": None, "rope_parameters": "x"}, "rope parameters 'x' are not supported"),
    ],
)
def test_bad_configs_raise(d, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_hf_dict({**LLAMA31_V4, **d})


def test_inexpressible_configs_refuse_export():
    with pytest.raises(ValueError, match="qk_norm"):
        ModelConfig("llama", 10, 32, 8, 1, 4, qk_norm=True).to_hf_dict()
    with pytest.raises(ValueError, match="model_type 'mistral'"):
        ModelConfig("mistral", 10, 32, 8, 1, 4)


NO_ROPE = {k: v for k, v in LLAMA31_V4.items() if k not in ("rope_theta", "rope_scaling")}
L3 = dict(LLAMA31_V4["rope_scaling"])


@pytest.mark.parametrize(
    ("rope", "values"),
    [
        (
            {"rope_theta": 1e4, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}},
            "rope_theta=10000.0, rope_parameters.rope_theta=1000000.0",
        ),
        (
            {"rope_theta": 1e6, "rope_scaling": {**L3, "rope_theta": 1e4}},
            "rope_theta=1000000.0, rope_scaling.rope_theta=10000.0",
        ),
    ],
)
def test_rope_bases_that_disagree_are_refused(rope, values):
    """transformers 4.x reads the top-level rope_theta, 5.x the rope dict's (rope_scaling's first): two values make
    the checkpoint two models, and rollouts must equal the trainer's policy whichever version it runs."""
    with pytest.raises(ValueError, match=re.escape(f"RoPE bases disagree ({values})")):
        ModelConfig.from_hf_dict({**NO_ROPE, **rope})


@pytest.mark.parametrize(
    "rope",
    [
        {"rope_theta": 500000, "rope_scaling": {**L3, "rope_theta": 5e5}, "rope_parameters": {**L3, "rope_theta": 5e5}},
        {"rope_scaling": {**L3, "rope_theta": 5e5}},
        {"rope_theta": None, "rope_parameters": {**L3, "rope_theta": 5e5}},
        {"rope_parameters": L3},
        # beside rope_scaling, rope_parameters is read by neither transformers 4.x nor 5.x
        {"rope_scaling": {**L3, "rope_theta": 1e4}, "rope_parameters": {**L3, "rope_theta": 1e6}},
        {"rope_scaling": {"rope_type": "default"}, "rope_parameters": {"rope_type": "default", "rope_theta": 5e5}},
        {"rope_scaling": L3, "rope_parameters": {**L3, "rope_theta": 5e5}},
    ],
)
def test_one_rope_base_is_read_as_transformers_reads_it(tmp_path, rope):
    d = {**NO_ROPE, **rope}
    (tmp_path / "config.json").write_text(json.dumps(d))
    hf = AutoConfig.from_pretrained(tmp_path)
    assert ModelConfig.from_hf_dict(d).rope_theta == hf.rope_parameters["rope_theta"]


def test_shipped_configs_read():
    """The bundled model's config.json and the drafters' layers give rope_theta twice (to_hf_dict), equal."""
    assert read_config(bundled_model_dir()).rope_theta == 10000.0
    for file in assets_dir().glob("*/drafter_config.json"):
        ModelConfig.from_hf_dict(json.loads(file.read_text())["layer"])


@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_absent_max_position_embeddings_takes_the_family_default(tmp_path, arch):
    """As transformers' LlamaConfig (2048) and Qwen2Config/Qwen3Config (32768), llama3 rope scaling's
    original_max_position_embeddings falling back to it."""
    d = {k: v for k, v in NO_ROPE.items() if k != "max_position_embeddings"}
    rope = {k: v for k, v in L3.items() if k != "original_max_position_embeddings"}
    d.update(architectures=[arch], model_type=ARCHITECTURES[arch], head_dim=16, rope_parameters=rope)
    (tmp_path / "config.json").write_text(json.dumps(d))
    hf = AutoConfig.from_pretrained(tmp_path)
    config = ModelConfig.from_hf_dict(d)
    assert config.max_position_embeddings == hf.max_position_embeddings
    assert (
        config.rope_scaling.original_max_position_embeddings == hf.rope_parameters["original_max_position_embeddings"]
    )


def test_head_dim_apart_from_hidden_size_only_where_transformers_allows_it():
    """Qwen2/Qwen3 take 6 heads of 16 on a hidden size of 64 (q_proj 64 -> 96, o_proj back); LlamaConfig refuses."""
    base = dict(
        vocab_size=10,
        hidden_size=64,
        intermediate_size=8,
        num_hidden_layers=1,
        num_attention_heads=6,
        num_key_value_heads=2,
    )
    for model_type in ("qwen2", "qwen3"):
        assert ModelConfig.from_hf_dict({**base, "model_type": model_type, "head_dim": 16}).head_dim == 16
        with pytest.raises(ValueError, match=r"hidden_size \(64\) is not a multiple of num_attention_heads \(6\)"):
            ModelConfig(model_type, **base)  # no head_dim to take
    with pytest.raises(ValueError, match=r"hidden_size \(64\) is not a multiple of num_attention_heads \(6\)"):
        ModelConfig.from_hf_dict({**base, "model_type": "llama", "head_dim": 16})


@pytest.mark.parametrize(
    ("architecture", "model_type"),
    [
        ("LlamaForCausalLM", "mistral"),  # a sliding window transformers applies, dropped here
        ("LlamaForCausalLM", "granite"),  # embedding, residual, attention and logit multipliers, dropped here
        ("Qwen2ForCausalLM", "llama"),  # transformers builds a Llama, without the q/k/v biases this would run
        ("Qwen3ForCausalLM", "qwen2"),
    ],
)
def test_architectures_and_model_type_must_agree(architecture, model_type):
    """transformers builds the model `model_type` names; running the one `architectures` names instead would roll
    out another model than the trainer's, silently (a Mistral labelled Llama: logits 7 apart)."""
    d = {**LLAMA31_V4, "architectures": [architecture], "model_type": model_type}
    with pytest.raises(ValueError, match=f"model_type {model_type!r} disagrees with architectures {architecture!r}"):
        ModelConfig.from_hf_dict(d)
    assert AutoConfig.for_model(model_type).model_type == model_type  # a model_type transformers knows
    agreeing = {**d, "model_type": ARCHITECTURES[architecture]}
    assert ModelConfig.from_hf_dict(agreeing).model_type == ARCHITECTURES[architecture]


def test_llama3_original_context_from_the_rope_dict_or_the_top_level_and_never_two():
    """A top-level original_max_position_embeddings (which transformers 5.x prefers to the rope dict's) was ignored:
    the RoPE frequencies, and every logit, differed from HF's with no error."""
    rope_only = ModelConfig.from_hf_dict(LLAMA31_V4)
    assert rope_only.rope_scaling.original_max_position_embeddings == 8192
    no_dict_value = {
        **LLAMA31_V4,
        "rope_scaling": {k: v for k, v in L3.items() if k != "original_max_position_embeddings"},
    }
    top = ModelConfig.from_hf_dict({**no_dict_value, "original_max_position_embeddings": 4096})
    assert top.rope_scaling.original_max_position_embeddings == 4096
    assert ModelConfig.from_hf_dict(no_dict_value).rope_scaling.original_max_position_embeddings == 131072
    same = ModelConfig.from_hf_dict({**LLAMA31_V4, "original_max_position_embeddings": 8192})
    assert same.rope_scaling == rope_only.rope_scaling
    with pytest.raises(ValueError, match=re.escape("llama3 RoPE's original contexts disagree (the rope dict's")):
        ModelConfig.from_hf_dict({**LLAMA31_V4, "original_max_position_embeddings": 64})
    whole = {**LLAMA31_V4, "rope_scaling": L3 | {"original_max_position_embeddings": 8192.0}}  # loaded before: kept
    assert ModelConfig.from_hf_dict(whole).rope_scaling == rope_only.rope_scaling
    with pytest.raises(ValueError, match="original_max_position_embeddings must be an integer >= 1, got 8192.5"):
        ModelConfig.from_hf_dict({**LLAMA31_V4, "rope_scaling": L3 | {"original_max_position_embeddings": 8192.5}})
    plain = {k: v for k, v in NO_ROPE.items()} | {"original_max_position_embeddings": 64}
    assert ModelConfig.from_hf_dict(plain).rope_scaling is None  # no llama3 scaling: nothing reads it


def test_null_partial_rotary_factor_is_unset_and_a_null_qwen3_head_dim_is_refused():
    assert ModelConfig.from_hf_dict({**LLAMA31_V4, "partial_rotary_factor": None}).rope_scaling is not None
    qwen3 = {**NO_ROPE, "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"}
    assert ModelConfig.from_hf_dict(qwen3).head_dim == 128
    with pytest.raises(ValueError, match=r"head_dim must be an integer >= 1, got None"):
        ModelConfig.from_hf_dict({**qwen3, "head_dim": None})


@pytest.mark.parametrize("family", sorted(ARCHITECTURES))
def test_absent_special_ids_take_transformers_defaults(tmp_path, family):
    """An absent bos/eos id is the family's default, as transformers' config class fills it (LlamaConfig: 1 and
    2, so generation stops on 2); a null stays None."""
    d = {k: v for k, v in LLAMA31_V4.items() if k not in ("bos_token_id", "eos_token_id", "model_type")}
    d["architectures"], d["model_type"] = [family], ARCHITECTURES[family]
    (tmp_path / "config.json").write_text(json.dumps(d))
    hf = AutoConfig.from_pretrained(tmp_path)
    config = ModelConfig.from_hf_dict(d)
    assert (config.bos_token_id, config.eos_token_id) == (hf.bos_token_id, hf.eos_token_id)
    nulls = ModelConfig.from_hf_dict({**d, "bos_token_id": None, "eos_token_id": None})
    assert (nulls.bos_token_id, nulls.eos_token_id) == (None, None)


def test_a_rope_scaling_dict_given_to_the_dataclass_is_parsed():
    """``ModelConfig(rope_scaling={...})`` reads the dict as a config.json's, its errors included."""
    config = ModelConfig("llama", 97, 64, 128, 2, 4, 2, rope_scaling={**LLAMA31_V4["rope_scaling"]})
    assert config.rope_scaling == RopeScaling(8.0, 1.0, 4.0, 8192)
    with pytest.raises(ValueError, match="rope_scaling type 'linear' is not supported"):
        ModelConfig("llama", 97, 64, 128, 2, 4, 2, rope_scaling={"type": "linear", "factor": 2.0})


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("heads", [4, 32, 64])
@pytest.mark.parametrize("given", ["absent", "null"])
def test_absent_or_null_key_value_heads_are_read_as_transformers_reads_them(model_type, heads, given):
    d = dict(model_type=model_type, vocab_size=10, hidden_size=heads * 8, intermediate_size=8, num_hidden_layers=1)
    d |= {"num_attention_heads": heads, "head_dim": 8} | ({"num_key_value_heads": None} if given == "null" else {})
    want = AutoConfig.for_model(**d).num_key_value_heads
    if heads % want != 0:  # transformers builds k/v projections no checkpoint of these heads has
        with pytest.raises(ValueError, match=f"config.json lacks num_key_value_heads: transformers' {model_type}"):
            ModelConfig.from_hf_dict(d)
    else:
        assert ModelConfig.from_hf_dict(d).num_key_value_heads == want
