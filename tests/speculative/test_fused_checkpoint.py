"""Fused drafter checkpoints: extra_layers and fuse.weight survive save/load, old checkpoints (no extra_layers) load
as last-layer drafters, and every malformed fused checkpoint is one ValueError naming the key and the file."""

from __future__ import annotations

import json

import pytest
import torch

from fastrl.models.checkpoint import load_model
from fastrl.speculative.drafter import EagleDrafter
from fastrl.speculative.drafter_checkpoint import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    check_drafter_files,
    load_drafter,
    read_drafter_info,
    save_drafter,
)
from fastrl.speculative.fused_drafter import FusedEagleDrafter
from fastrl.tensor_files import save_tensors
from tests.helpers import make_hf_model
from tests.speculative.fused_helpers import random_fused_drafter


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    path = tmp_path_factory.mktemp("policy")
    make_hf_model("llama").save_pretrained(path)
    return load_model(path).eval()


def test_round_trip_keeps_extra_layers_and_fuse(policy, tmp_path):
    drafter = random_fused_drafter(policy.config, (0, 1), seed=4)
    save_drafter(drafter, tmp_path / "d", "tiny", version=3)
    meta = json.loads((tmp_path / "d" / CONFIG_FILE).read_text())
    assert meta["extra_layers"] == [0, 1] and meta["format_version"] == 2
    loaded, info = load_drafter(tmp_path / "d", policy)
    assert isinstance(loaded, FusedEagleDrafter) and loaded.extra_layers == (0, 1) and info.extra_layers == (0, 1)
    assert loaded.feature_size == 3 * policy.config.hidden_size
    for key, value in drafter.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[key], value)
    assert check_drafter_files(tmp_path / "d", policy.config).extra_layers == (0, 1)


def test_old_checkpoint_without_extra_layers_loads_last_layer_drafter(policy, tmp_path):
    save_drafter(EagleDrafter(policy.config), tmp_path / "d", "tiny")
    file = tmp_path / "d" / CONFIG_FILE
    meta = json.loads(file.read_text())
    del meta["extra_layers"]
    meta["format_version"] = 1
    file.write_text(json.dumps(meta))
    loaded, info = load_drafter(tmp_path / "d", policy)
    assert type(loaded) is EagleDrafter and info.extra_layers == () and loaded.feature_size == 64


def _with_meta(tmp_path, policy, **changes):
    save_drafter(random_fused_drafter(policy.config, (0,)), tmp_path / "d", "tiny")
    file = tmp_path / "d" / CONFIG_FILE
    meta = json.loads(file.read_text())
    meta.update(changes)
    file.write_text(json.dumps(meta))
    return tmp_path / "d"


@pytest.mark.parametrize(
    ("layers", "message"),
    [([1, 0], "distinct and ascending"), ([0, 0], "distinct and ascending"), ([-1], ">= 0"), ("0", "a list")],
)
def test_malformed_extra_layers_name_key_and_file(policy, tmp_path, layers, message):
    path = _with_meta(tmp_path, policy, extra_layers=layers)
    for call in (lambda: load_drafter(path, policy), lambda: check_drafter_files(path, policy.config)):
        with pytest.raises(ValueError, match=f"{CONFIG_FILE}.*extra_layers.*{message}"):
            call()


def test_extra_layers_outside_the_policy(policy, tmp_path):
    path = _with_meta(tmp_path, policy, extra_layers=[0, 2])  # the policy has layers 0 and 1
    for call in (lambda: load_drafter(path, policy), lambda: check_drafter_files(path, policy.config)):
        with pytest.raises(ValueError, match=r"does not fit this policy: extra_layers \[0, 2\] outside"):
            call()


def test_fuse_weight_that_does_not_match_extra_layers(policy, tmp_path):
    path = _with_meta(tmp_path, policy, extra_layers=[0, 1])  # weights hold fuse.weight [64, 128], need [64, 192]
    for call in (lambda: load_drafter(path, policy), lambda: check_drafter_files(path, policy.config)):
        with pytest.raises(ValueError, match=rf"{WEIGHTS_FILE}: .*mis-shaped \['fuse.weight \[64, 128\]"):
            call()


def test_fuse_weight_missing_or_unexpected(policy, tmp_path):
    path = _with_meta(tmp_path, policy)
    weights = {k: v for k, v in random_fused_drafter(policy.config, (0,)).state_dict().items() if k != "fuse.weight"}
    save_tensors(weights, path / WEIGHTS_FILE)
    with pytest.raises(ValueError, match=r"missing \['fuse.weight'\]"):
        check_drafter_files(path, policy.config)
    save_drafter(EagleDrafter(policy.config), tmp_path / "plain", "tiny")
    save_tensors(random_fused_drafter(policy.config, (0,)).state_dict(), tmp_path / "plain" / WEIGHTS_FILE)
    with pytest.raises(ValueError, match=r"unexpected \['fuse.weight'\].*no extra_layers"):
        load_drafter(tmp_path / "plain", policy)


def test_newer_format_version_is_named(policy, tmp_path):
    path = _with_meta(tmp_path, policy, format_version=99)
    with pytest.raises(ValueError, match="format_version is 99"):
        read_drafter_info(path)


def test_fused_drafter_rejects_bad_feature_width(policy):
    drafter = random_fused_drafter(policy.config, (0,))
    tokens = torch.zeros(1, 3, dtype=torch.long)
    positions = torch.arange(3).unsqueeze(0)
    with pytest.raises(ValueError, match=r"features must be \[.., 128\]"):
        drafter(policy, tokens, torch.zeros(1, 3, 96), positions)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"layer": [1]}, "policy and layer must be JSON objects"),
        ({"policy": "tiny"}, "policy and layer must be JSON objects"),
        ({"format_version": True}, "format_version is True"),
        ({"version": "abc"}, "version must be an integer >= 0, got 'abc'"),
        ({"draft_vocab_size": 0}, "draft_vocab_size must be an integer >= 1, got 0"),
        ({"draft_vocab_size": -3}, "draft_vocab_size must be an integer >= 1, got -3"),
        ({"draft_vocab_size": 10.5}, "draft_vocab_size must be an integer >= 1, got 10.5"),
        ({"layer_edit": {"num_hidden_layers": 2}}, r"layer has hidden size, vocabulary and layers \(64, 97, 2\)"),
        ({"layer_edit": {"vocab_size": 50}}, r"layer has hidden size, vocabulary and layers \(64, 50, 1\)"),
        ({"layer_edit": {"vocab_size": "x"}}, "vocab_size must be an integer >= 1, got 'x'"),
    ],
)
def test_a_malformed_drafter_config_is_one_error_naming_the_file(policy, tmp_path, changes, message):
    """drafter_config.json values of the wrong type or that contradict the policy it names (an AttributeError
    traceback, or silently ignored, before)."""
    path = _with_meta(tmp_path, policy)
    meta = json.loads((path / CONFIG_FILE).read_text())
    edit = changes.pop("layer_edit", None)
    meta |= changes
    if edit:
        meta["layer"] |= edit
    (path / CONFIG_FILE).write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=rf"{CONFIG_FILE}: malformed drafter config \(.*{message}"):
        read_drafter_info(path)


@pytest.mark.parametrize("accept", [float("nan"), -5.0, 99.0, 0.5])
def test_a_held_out_accept_length_outside_its_chain_is_refused(policy, tmp_path, accept):
    path = _with_meta(tmp_path, policy)
    record = {"strategy": "3_1_4", "mean_accept_length": accept, "temperature": 0.0}
    (path / "metrics.json").write_text(json.dumps({"accept_lengths": [record]}))
    with pytest.raises(ValueError, match=r"metrics.json: malformed drafter metrics \(3_1_4's mean_accept_length"):
        read_drafter_info(path)


def test_a_drafter_of_another_family_is_refused(policy, tmp_path):
    """A drafter's layer mirrors the family of the policy it was trained for: a Qwen3 drafter on a Llama policy of
    the same sizes loaded without a word (exact, but drafting from features it never saw)."""
    import tempfile

    save_drafter(EagleDrafter(policy.config), tmp_path / "d", "tiny")
    with tempfile.TemporaryDirectory() as tmp:
        sizes = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16)
        make_hf_model("qwen3", **sizes).save_pretrained(tmp)
        other = load_model(tmp)
    assert other.config.model_type != policy.config.model_type
    with pytest.raises(ValueError, match=r"does not fit this policy: .*its layer is a llama layer, the policy a qwen3"):
        load_drafter(tmp_path / "d", other)
