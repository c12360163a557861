"""HF checkpoint IO: sharded and low-precision loads, save_model round trips through transformers, bad inputs."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from fastrl.models import ModelConfig, load_model, read_config, save_model

TOL = 1e-4


def logits_of(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        if hasattr(model, "rotary"):
            return model(ids, torch.arange(ids.shape[1]).expand_as(ids)).logits
        return model(ids).logits


def test_sharded_checkpoint_loads(hf_checkpoint):
    hf, path = hf_checkpoint("qwen2", max_shard_size="40KB")
    assert (path / "model.safetensors.index.json").is_file() and len(list(path.glob("*.safetensors"))) > 2
    ids = torch.randint(0, 97, (1, 9))
    assert (logits_of(load_model(path), ids) - logits_of(hf, ids)).abs().max() <= TOL


def test_a_single_file_beside_a_shard_index_is_what_both_load(hf_checkpoint):
    """fastrl read a shard index before model.safetensors, transformers the other way: a directory holding both (a
    sharded checkpoint that save_model wrote into) was two models, and save_model's weights did not load back."""
    hf, path = hf_checkpoint("qwen2", max_shard_size="40KB")
    model = load_model(path)
    with torch.no_grad():
        model.lm_head.weight.mul_(2.0)
    save_model(model, path)
    assert (path / "model.safetensors.index.json").is_file()  # the earlier shards stay, unread
    ids = torch.randint(0, 97, (1, 9))
    again = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    assert torch.equal(load_model(path).lm_head.weight, model.lm_head.weight)
    assert (logits_of(load_model(path), ids) - logits_of(again, ids)).abs().max() <= TOL
    assert (logits_of(load_model(path), ids) - logits_of(hf, ids)).abs().max() > 10 * TOL


def test_bf16_checkpoint_is_cast_to_requested_dtype(hf_checkpoint):
    hf, path = hf_checkpoint("llama_gqa")
    hf.to(torch.bfloat16).save_pretrained(path)
    model = load_model(path, dtype=torch.float32)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert torch.equal(model.model.layers[0].mlp.up_proj.weight, hf.model.layers[0].mlp.up_proj.weight.float())
    low = load_model(path, dtype=torch.bfloat16)
    ids = torch.randint(0, 97, (1, 7))
    assert (logits_of(low, ids).float() - logits_of(hf, ids).float()).abs().max() <= 0.05


def test_save_model_loads_in_transformers_and_back(hf_checkpoint, tmp_path, flavour):
    _, path = hf_checkpoint(flavour)
    model = load_model(path)
    out = tmp_path / "saved"
    save_model(model, out)
    stored = load_file(out / "model.safetensors")
    assert ("lm_head.weight" in stored) != model.config.tie_word_embeddings
    ids = torch.randint(0, 97, (2, 8))
    want = logits_of(model, ids)
    hf = AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(hf).__name__ == json.loads((out / "config.json").read_text())["architectures"][0]
    assert (logits_of(hf, ids) - want).abs().max() <= TOL
    again = load_model(out)
    assert again.config == model.config
    assert torch.equal(logits_of(again, ids), want)


def test_save_model_in_bf16(hf_checkpoint, tmp_path):
    _, path = hf_checkpoint("llama_tied")
    save_model(load_model(path), tmp_path / "bf16", dtype=torch.bfloat16)
    assert all(t.dtype == torch.bfloat16 for t in load_file(tmp_path / "bf16" / "model.safetensors").values())
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["torch_dtype"] == "bfloat16"
    model = load_model(tmp_path / "bf16")
    assert model.lm_head.weight is model.model.embed_tokens.weight


def rewrite_weights(path, edit) -> None:
    """Applies `edit(tensors)` to a single-file checkpoint in place."""
    tensors = load_file(path / "model.safetensors")
    edit(tensors)
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})


def test_mismatched_missing_and_unexpected_tensors_listed_in_one_error(hf_checkpoint):
    _, path = hf_checkpoint("llama_gqa")

    def edit(t):
        t["model.layers.0.mlp.up_proj.weight"] = torch.zeros(3, 3)
        del t["model.norm.weight"]
        t["model.layers.0.self_attn.extra"] = torch.zeros(1)

    rewrite_weights(path, edit)
    with pytest.raises(ValueError) as err:
        load_model(path)
    message = str(err.value)
    assert message.startswith(f"checkpoint {path} does not match the config: ")
    assert "model.layers.0.mlp.up_proj.weight: checkpoint (3, 3) vs model (96, 64)" in message
    assert "missing tensors ['model.norm.weight']" in message
    assert "unexpected tensors ['model.layers.0.self_attn.extra']" in message


def test_hf_rotary_buffers_and_tied_head_copies_are_ignored(hf_checkpoint):
    hf, path = hf_checkpoint("llama_tied")

    def edit(t):
        t["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(8)
        t["lm_head.weight"] = t["model.embed_tokens.weight"].clone()

    rewrite_weights(path, edit)
    ids = torch.randint(0, 97, (1, 5))
    assert (logits_of(load_model(path), ids) - logits_of(hf, ids)).abs().max() <= TOL


def test_a_tied_config_beside_a_trained_head_is_refused(hf_checkpoint):
    """config.json says tied, yet the weights hold an LM head that is not the embeddings: tying would silently drop
    the trained head (a config edited by hand), so it is one error naming the key."""
    _, path = hf_checkpoint("llama_tied")
    rewrite_weights(path, lambda t: t.update({"lm_head.weight": t["model.embed_tokens.weight"] * 1.5}))
    with pytest.raises(ValueError, match="tie_word_embeddings=true, but the weights hold an lm_head.weight"):
        load_model(path)


def test_bad_directories_raise(hf_checkpoint, tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_model(tmp_path / "nowhere")
    (tmp_path / "model.safetensors").write_bytes(b"")  # a file given for its directory was said not to exist
    with pytest.raises(ValueError, match="model.safetensors is a file, not a directory"):
        load_model(tmp_path / "model.safetensors")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no config.json"):
        load_model(tmp_path / "empty")
    _, path = hf_checkpoint("qwen3")
    (path / "model.safetensors").rename(path / "other.bin")
    with pytest.raises(ValueError, match=f"{path} has no model.safetensors"):
        load_model(path)
    _, sharded = hf_checkpoint("qwen2", max_shard_size="40KB")
    next(sharded.glob("model-*.safetensors")).unlink()
    with pytest.raises(ValueError, match="names shards missing"):
        load_model(sharded)


@pytest.mark.parametrize(
    ("generation", "eos"),
    [
        (None, [3, 4]),
        ({"do_sample": False}, [3, 4]),
        ({"eos_token_id": None}, [3, 4]),
        ({"eos_token_id": []}, [3, 4]),
        ({"eos_token_id": [5, 0]}, [5, 0]),
        ({"eos_token_id": 0}, 0),
    ],
)
def test_generation_config_eos_ids_replace_config_ones_where_it_has_some(tmp_path, generation, eos):
    """As in transformers' generate (chat models keep their end-of-turn id there only); where generation_config.json
    has none (absent, null or []) generate stops on no token, but a rollout engine stops on the model's EOS."""
    config = ModelConfig("qwen2", 10, 32, 8, 1, 4, eos_token_id=[3, 4])
    (tmp_path / "config.json").write_text(json.dumps(config.to_hf_dict()))
    if generation is not None:
        (tmp_path / "generation_config.json").write_text(json.dumps(generation))
    assert read_config(tmp_path).eos_token_id == eos


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"architectures": ["MistralForCausalLM"]}, "MistralForCausalLM"),
        ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}}, "'yarn'"),
        ({"hidden_act": "gelu"}, "'gelu'"),
    ],
)
def test_unsupported_configs_raise(hf_checkpoint, change, message):
    _, path = hf_checkpoint("llama_gqa")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(ValueError, match=message):
        load_model(path)


def test_random_model_saves_and_loads(tmp_path):
    from fastrl.models import CausalLM

    torch.manual_seed(0)
    model = CausalLM(ModelConfig("llama", 64, 32, 48, 1, 2, eos_token_id=[1, 2])).eval()
    save_model(model, tmp_path)
    ids = torch.randint(0, 64, (1, 6))
    assert torch.equal(logits_of(load_model(tmp_path), ids), logits_of(model, ids))
    assert (logits_of(AutoModelForCausalLM.from_pretrained(tmp_path), ids) - logits_of(model, ids)).abs().max() <= TOL


def test_llama3_rope_with_a_top_level_original_context_computes_what_transformers_does(tmp_path):
    """The top-level original_max_position_embeddings (the rope dict lacking it) is the one transformers uses."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    rope = dict(rope_type="llama3", rope_theta=5e5, factor=4.0, low_freq_factor=1.0, high_freq_factor=4.0)
    rope["original_max_position_embeddings"] = 16
    config = LlamaConfig(
        vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, rope_parameters=rope,
    )  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(tmp_path)
    edited = json.loads((tmp_path / "config.json").read_text())
    edited["rope_parameters"].pop("original_max_position_embeddings")
    edited["original_max_position_embeddings"] = 64
    (tmp_path / "config.json").write_text(json.dumps(edited))
    hf = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    ours = load_model(tmp_path)
    assert ours.config.rope_scaling.original_max_position_embeddings == 64
    ids = torch.randint(0, 97, (1, 80))  # past the original context, where the scaling matters
    assert (logits_of(ours, ids) - logits_of(hf, ids)).abs().max() <= TOL


def test_the_weights_fingerprint_sees_every_value_and_not_the_layout(hf_checkpoint, tmp_path):
    """generate's resume check tells models apart by ``weights_fingerprint``. It hashed each tensor's first values
    only, so a model whose new token rows, or any value past a tensor's first row, differed from its base's passed
    for it and their results were mixed in one file. Now: any one value changed at random changes it; the same
    weights sharded, or saved with other metadata, keep it; a damaged file is named."""
    import random
    import shutil

    from fastrl.models.checkpoint import weights_fingerprint

    _, path = hf_checkpoint("llama_gqa")
    base = weights_fingerprint(path)
    tensors = load_file(str(path / "model.safetensors"))
    rng = random.Random(7)
    for _ in range(6):
        changed = {k: v.clone() for k, v in tensors.items()}
        name = rng.choice(sorted(changed))
        flat = changed[name].view(-1)
        flat[rng.randrange(flat.numel())] += 1e-3
        other = tmp_path / f"other-{name}"
        shutil.copytree(path, other)
        save_file(changed, str(other / "model.safetensors"), metadata={"format": "pt"})
        assert weights_fingerprint(other) != base, name
    resaved = tmp_path / "resaved"
    shutil.copytree(path, resaved)
    save_file(dict(reversed(tensors.items())), str(resaved / "model.safetensors"), metadata={"note": "a copy"})
    assert weights_fingerprint(resaved) == base
    sharded = tmp_path / "sharded"
    AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).save_pretrained(sharded, max_shard_size="40KB")
    assert not (sharded / "model.safetensors").exists()
    assert weights_fingerprint(sharded) == base
    (resaved / "model.safetensors").write_bytes((path / "model.safetensors").read_bytes()[:100])
    with pytest.raises(ValueError, match="model.safetensors is not a readable safetensors file"):
        weights_fingerprint(resaved)


def test_shards_that_link_into_a_hub_cache_load(hf_checkpoint, tmp_path):
    """A Hugging Face hub snapshot keeps each shard as a link into the cache's blobs (snapshots/<rev>/x ->
    ../../blobs/<hash>); checking the shard names after resolving the links refused every sharded model there as
    'outside the checkpoint directory'. Names that leave the directory as written are still refused."""
    from fastrl.models.checkpoint import weights_fingerprint

    hf, path = hf_checkpoint("qwen2", max_shard_size="40KB")
    blobs, snapshot = tmp_path / "hub" / "blobs", tmp_path / "hub" / "snapshots" / "abc123"
    blobs.mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for i, file in enumerate(sorted(path.iterdir())):
        (blobs / f"blob{i}").write_bytes(file.read_bytes())
        (snapshot / file.name).symlink_to(f"../../blobs/blob{i}")
    ids = torch.randint(0, 97, (1, 9))
    assert torch.equal(logits_of(load_model(snapshot), ids), logits_of(load_model(path), ids))
    assert weights_fingerprint(snapshot) == weights_fingerprint(path)
    index = json.loads((path / "model.safetensors.index.json").read_text())
    for bad in ("../elsewhere.safetensors", "/abs/model.safetensors", "sub/../../x.safetensors", "."):
        name = next(iter(index["weight_map"]))
        (snapshot / "model.safetensors.index.json").unlink()
        (snapshot / "model.safetensors.index.json").write_text(
            json.dumps({"weight_map": {**index["weight_map"], name: bad}})
        )
        with pytest.raises(ValueError, match="outside the checkpoint directory"):
            load_model(snapshot)


def test_a_float64_model_saves_as_float64_and_loads_in_both(tmp_path):
    """A float64 policy (the exactness runs') is checkpointed as it is: every value kept, loadable by both."""
    from fastrl.models import CausalLM

    torch.manual_seed(0)
    model = CausalLM(ModelConfig("llama", 64, 32, 48, 1, 2)).double().eval()
    save_model(model, tmp_path / "f64")
    assert all(t.dtype == torch.float64 for t in load_file(tmp_path / "f64" / "model.safetensors").values())
    ids = torch.randint(0, 64, (1, 6))
    # the same weights in other memory: a product may sum in another order (4e-16 seen)
    again = load_model(tmp_path / "f64", dtype=torch.float64)
    assert (logits_of(again, ids) - logits_of(model, ids)).abs().max() <= 1e-12
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "f64", dtype=torch.float64)
    # transformers' RMSNorm rounds its input through float32 (1.7e-7 seen)
    assert (logits_of(hf, ids) - logits_of(model, ids)).abs().max() <= 1e-5


def test_a_dtype_that_cannot_be_written_is_refused_before_the_directory_is_made(tmp_path):
    from fastrl.models import CausalLM

    model = CausalLM(ModelConfig("llama", 64, 32, 48, 1, 2))
    with pytest.raises(ValueError, match="dtype torch.int8 is not supported"):
        save_model(model, tmp_path / "int8", dtype=torch.int8)
    assert not (tmp_path / "int8").exists()


def _tiny_checkpoint(path):
    """A tiny random model saved as an HF checkpoint directory at ``path`` (single-file safetensors)."""
    from fastrl.models import CausalLM

    save_model(CausalLM(ModelConfig("llama", 64, 32, 48, 1, 2)), path)
    return path


def _replace_with(file, kind: str) -> str:
    """Put a dangling symlink or a directory where ``file`` was; the message ``file_problem`` gives for it."""
    file.unlink(missing_ok=True)
    if kind == "dangling":
        file.symlink_to("/nonexistent/blob")
        return r"is a dangling symlink \(to /nonexistent/blob\)"
    file.mkdir()
    return "is a directory, not a file"


@pytest.mark.parametrize("kind", ["dangling", "directory"])
@pytest.mark.parametrize("name", ["config.json", "model.safetensors", "generation_config.json"])
def test_a_checkpoint_file_that_is_not_a_file_is_named_for_what_it_is(tmp_path, name, kind):
    """A half-downloaded hub snapshot leaves dangling links; config.json or model.safetensors one (or a directory in
    its place) was reported as absent ('has no config.json'), a generation_config.json one was silently ignored."""
    path = _tiny_checkpoint(tmp_path / "m")
    what = _replace_with(path / name, kind)
    with pytest.raises(ValueError, match=f"checkpoint directory {path}: {name} {what}"):
        load_model(path)


@pytest.mark.parametrize("kind", ["dangling", "directory"])
def test_a_shard_index_or_shard_that_is_not_a_file_is_named_for_what_it_is(tmp_path, kind):
    from fastrl.models.checkpoint import weight_files

    index = tmp_path / "model.safetensors.index.json"
    what = _replace_with(index, kind)
    with pytest.raises(ValueError, match=f"checkpoint directory {tmp_path}: model.safetensors.index.json {what}"):
        weight_files(tmp_path)
    if index.is_dir():
        index.rmdir()
    else:
        index.unlink()
    index.write_text(json.dumps({"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}}))
    (tmp_path / "s1.safetensors").write_bytes(b"")
    what = _replace_with(tmp_path / "s2.safetensors", kind)
    with pytest.raises(ValueError, match=f"names shards that are not files in {tmp_path}: \\['s2.safetensors {what}"):
        weight_files(tmp_path)


@pytest.mark.parametrize("text", ["[1, 2]", "7", "null"])
def test_a_generation_config_that_is_not_an_object_is_refused(tmp_path, text):
    """Valid JSON but not an object was silently ignored, while non-JSON was an error."""
    config = ModelConfig("qwen2", 10, 32, 8, 1, 4, eos_token_id=[3, 4])
    (tmp_path / "config.json").write_text(json.dumps(config.to_hf_dict()))
    (tmp_path / "generation_config.json").write_text(text)
    with pytest.raises(ValueError, match="generation_config.json must hold a JSON object"):
        read_config(tmp_path)
