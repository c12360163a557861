"""Bad weights are one clear error naming the file at load: NaN or infinite values, integer dtypes, truncated
safetensors (policy and drafter), a shard index that is not JSON or names a shard outside the directory; pushed
weights are checked the same way."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from fastrl.models.checkpoint import load_model, save_model
from fastrl.rollout.engine_worker import load_policy_weights
from fastrl.speculative.drafter import EagleDrafter
from fastrl.speculative.drafter_checkpoint import load_drafter, save_drafter
from tests.rl.grpo_setup import tiny_policy


@pytest.fixture
def checkpoint(tmp_path):
    save_model(tiny_policy(), tmp_path / "policy")
    return tmp_path / "policy"


def _rewrite(directory, change) -> None:
    file = directory / "model.safetensors"
    tensors = load_file(str(file))
    change(tensors)
    save_file(tensors, str(file))


def _truncate(file) -> None:
    data = file.read_bytes()
    file.write_bytes(data[: len(data) // 2])


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda t: t["model.norm.weight"].__setitem__(0, float("nan")), r"NaN or infinity in \['model.norm.weight'\]"),
        (lambda t: t["lm_head.weight"].__setitem__(0, float("inf")), r"NaN or infinity in \['lm_head.weight'\]"),
        (lambda t: t.__setitem__("model.norm.weight", t["model.norm.weight"].to(torch.int32)), "floating point"),
        (
            lambda t: t.__setitem__("lm_head.weight", t["lm_head.weight"].to(torch.float8_e4m3fn)),
            r"float8 \(quantized\) weights are not supported, found \['lm_head.weight \(torch.float8_e4m3fn\)'\]",
        ),
        (
            lambda t: t.__setitem__("lm_head.weight", t["lm_head.weight"].to(torch.float8_e5m2)),
            r"float8 \(quantized\) weights are not supported",
        ),
    ],
)
def test_bad_values_are_named_with_the_file(checkpoint, change, message):
    _rewrite(checkpoint, change)
    with pytest.raises(ValueError, match=message) as info:
        load_model(checkpoint)
    assert "model.safetensors" in str(info.value)


def test_a_quantized_config_is_refused_by_name(checkpoint):
    config = json.loads((checkpoint / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "weight_block_size": [128, 128]}
    (checkpoint / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"config.json: quantized checkpoints are not supported \(.*'fp8'\)"):
        load_model(checkpoint)


def test_overflow_when_cast_is_an_error(checkpoint):
    _rewrite(checkpoint, lambda t: t["model.norm.weight"].__setitem__(0, 1e38))
    with pytest.raises(ValueError, match="overflow to infinity in torch.float16"):
        load_model(checkpoint, dtype=torch.float16)


def test_truncated_weights_name_the_file(checkpoint):
    _truncate(checkpoint / "model.safetensors")
    with pytest.raises(ValueError, match=r"model.safetensors is not a readable safetensors file \(truncated"):
        load_model(checkpoint)


def test_shard_index_outside_the_directory_or_invalid(checkpoint, tmp_path):
    outside = tmp_path / "outside.safetensors"
    shutil.move(checkpoint / "model.safetensors", outside)
    names = list(load_file(str(outside)))
    index = checkpoint / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {n: "../outside.safetensors" for n in names}}))
    with pytest.raises(ValueError, match="outside the checkpoint directory"):
        load_model(checkpoint)
    index.write_text("{not json")
    with pytest.raises(ValueError, match="index.json is not a valid shard index"):
        load_model(checkpoint)
    index.write_text(json.dumps({"metadata": {}}))  # was: "missing tensors [every tensor]"
    with pytest.raises(ValueError, match="index.json has no weight_map"):
        load_model(checkpoint)


def test_drafter_truncated_or_nan_is_named(checkpoint, tmp_path):
    policy = load_model(checkpoint)
    save_drafter(EagleDrafter(policy.config), tmp_path / "drafter", "tiny")
    weights = tmp_path / "drafter" / "drafter.safetensors"
    tensors = load_file(str(weights))
    next(iter(tensors.values())).view(-1)[0] = float("nan")
    save_file(tensors, str(weights))
    with pytest.raises(ValueError, match="drafter.safetensors: weights hold NaN"):
        load_drafter(tmp_path / "drafter", policy)
    _truncate(weights)
    with pytest.raises(ValueError, match="drafter.safetensors is not a readable safetensors file"):
        load_drafter(tmp_path / "drafter", policy)
    with pytest.raises(ValueError, match="drafter directory .*nope does not exist"):
        load_drafter(tmp_path / "nope", policy)


def test_pushed_nan_weights_are_refused(checkpoint):
    model = load_model(checkpoint)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    state["model.norm.weight"][0] = float("nan")
    with pytest.raises(ValueError, match="pushed policy weights: weights hold NaN"):
        load_policy_weights(model, state)
    assert torch.isfinite(model.model.norm.weight).all(), "nothing was loaded"


def test_a_drafter_with_nan_or_overflowing_weights_is_never_saved(checkpoint, tmp_path):
    """What no command would load is not written: NaN, infinity, or a float16 cast that overflows."""
    policy = load_model(checkpoint)
    drafter = EagleDrafter(policy.config)
    with torch.no_grad():
        drafter.fc.weight[0, 0] = float("nan")
    with pytest.raises(ValueError, match=r"save_drafter .*drafter: weights hold NaN or infinity in \['fc.weight'\]"):
        save_drafter(drafter, tmp_path / "drafter", "tiny")
    with torch.no_grad():
        drafter.fc.weight[0, 0] = 1e5
    save_drafter(drafter, tmp_path / "drafter", "tiny")  # float32 holds it
    with pytest.raises(ValueError, match="weights hold NaN or infinity"):
        save_drafter(drafter, tmp_path / "half", "tiny", dtype="float16")
    assert not (tmp_path / "half").exists()
