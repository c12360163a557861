"""Drafter training's rollouts and accept lengths run in the engine dtype an RL rollout runs in (bfloat16 on a GPU),
on cast copies: the policy and the drafter in training keep their float32 weights, and a stream remembers the
dtype its shards were generated in."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from fastrl.cotrain.offline import OfflineDrafterConfig, accept_inputs, fingerprint, measure, train_offline
from fastrl.cotrain.rollout_plan import RolloutPlan, RolloutShards, cast_copy
from fastrl.engine.engine import Engine
from fastrl.models.checkpoint import load_model
from fastrl.speculative.drafter import EagleDrafter
from tests.cotrain.test_stream_trainer import make_run
from tests.helpers import make_hf_model

PROMPTS = [[5, 6, 7], [8, 9], [10, 11, 12, 13], [14, 3, 9, 9, 2]]


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    path = tmp_path_factory.mktemp("policy")
    make_hf_model("llama", seed=4).save_pretrained(path)
    return load_model(path)


def _reference(policy, plan: RolloutPlan) -> list[list[int]]:
    """The plan's rollouts from an engine given its own copy of the policy in the plan's dtype."""
    config = plan.engine_config(4, "cpu")
    model = copy.deepcopy(policy).to(config.torch_dtype)
    outs = Engine(model, config).generate([plan.request(r) for r in range(len(plan))])
    return [o.prompt_ids + o.token_ids for o in outs]


def test_shards_are_generated_in_the_plan_dtype_and_the_policy_keeps_its_own(policy, tmp_path):
    weights = {k: v.clone() for k, v in policy.state_dict().items()}
    ids = {}
    for dtype in ("bfloat16", "float32"):
        plan = RolloutPlan(PROMPTS, [0.0, 1.0], samples=2, max_new_tokens=24, seed=3, dtype=dtype)
        shards = RolloutShards(plan, shard_size=len(plan), directory=tmp_path / dtype)
        ids[dtype] = shards.ids(0, policy, 4, "cpu")
        assert ids[dtype] == _reference(policy, plan), dtype
        assert all(p.dtype == torch.float32 for p in policy.parameters())
    assert all(torch.equal(v, policy.state_dict()[k]) for k, v in weights.items())
    # the two dtypes' rollouts are not the same data (else the dtype would not matter to what is trained on)
    assert ids["bfloat16"] != ids["float32"]


def test_accept_length_runs_in_the_plan_dtype_on_copies(policy):
    torch.manual_seed(2)
    drafter = EagleDrafter(policy.config)
    before = {k: v.clone() for k, v in drafter.state_dict().items()}
    cfg = OfflineDrafterConfig(accept_requests=3, accept_batch_size=3, max_new_tokens=12, rollout_dtype="bfloat16")
    plan = RolloutPlan(PROMPTS, [1.0], 1, cfg.max_new_tokens, 0, cfg.engine_dtype)
    inputs = accept_inputs(PROMPTS, 1.0, cfg)
    length = measure(policy, drafter, plan, inputs, "3_1_4", cfg).mean_accept_length
    assert length >= 1.0
    assert {p.dtype for p in drafter.parameters()} == {torch.float32}
    assert {p.dtype for p in policy.parameters()} == {torch.float32}
    assert all(torch.equal(v, drafter.state_dict()[k]) for k, v in before.items())
    # the same figure as an engine given bfloat16 copies of both
    same = measure(cast_copy(policy, torch.bfloat16), cast_copy(drafter, torch.bfloat16), plan, inputs, "3_1_4", cfg)
    assert same.mean_accept_length == length


def test_cast_copy_returns_the_module_itself_in_its_own_dtype(policy):
    assert cast_copy(policy, torch.float32) is policy
    half = cast_copy(policy, torch.bfloat16)
    assert half is not policy and next(half.parameters()).dtype == torch.bfloat16


def test_the_rollout_dtype_defaults_by_device_and_a_bad_one_is_named():
    assert OfflineDrafterConfig(device="cpu").engine_dtype == "float32"
    assert OfflineDrafterConfig(device="cuda").engine_dtype == "bfloat16"
    assert OfflineDrafterConfig(device="cuda:1").engine_dtype == "bfloat16"
    assert OfflineDrafterConfig(device="cuda", rollout_dtype="float32").engine_dtype == "float32"
    with pytest.raises(ValueError, match=r"train_drafter\.rollout_dtype must be one of .*got 'bf16'"):
        OfflineDrafterConfig(rollout_dtype="bf16")


def test_a_stream_remembers_its_rollout_dtype(policy, tmp_path):
    """The device may change on resume; the dtype its shards came from may not. A stream saved before the key
    existed ran its rollouts in float32 (the engines' default then): it resumes in float32 and is refused in
    bfloat16, on a CPU and on a GPU alike."""
    cpu, gpu = OfflineDrafterConfig(device="cpu"), OfflineDrafterConfig(device="cuda")
    assert fingerprint(cpu, {}) != fingerprint(gpu, {})
    assert fingerprint(gpu, {}) == fingerprint(OfflineDrafterConfig(device="cpu", rollout_dtype="bfloat16"), {})
    gpu_float32 = fingerprint(OfflineDrafterConfig(device="cuda", rollout_dtype="float32"), {})
    torch.manual_seed(0)
    drafter = EagleDrafter(policy.config)
    for name, resumed in (("cpu", fingerprint(cpu, {})), ("gpu", gpu_float32)):
        old = {k: v for k, v in fingerprint(cpu, {}).items() if k != "rollout_dtype"}
        make_run(policy, tmp_path / name, drafter, []).run(old, stop_after_shards=1)
        with pytest.raises(ValueError, match=r"other settings \(rollout_dtype\)"):
            make_run(policy, tmp_path / name, drafter, []).run(fingerprint(gpu, {}))
        assert make_run(policy, tmp_path / name, drafter, []).run(resumed, stop_after_shards=1).shard == 2


def test_cast_copy_keeps_tied_weights_tied_and_the_original_untouched(policy):
    tied = copy.deepcopy(policy)
    tied.lm_head.weight = tied.model.embed_tokens.weight
    half = cast_copy(tied, torch.bfloat16)
    assert half.lm_head.weight is half.model.embed_tokens.weight
    assert half.lm_head.weight.dtype == torch.bfloat16 and not half.lm_head.weight.requires_grad
    assert tied.lm_head.weight.dtype == torch.float32 and tied.lm_head.weight is tied.model.embed_tokens.weight
    assert torch.equal(half.model.embed_tokens.weight, tied.model.embed_tokens.weight.to(torch.bfloat16))


def test_a_bfloat16_training_run_streams_bfloat16_rollouts_and_trains_float32_weights(policy, tmp_path):
    torch.manual_seed(0)
    drafter = EagleDrafter(policy.config)
    cfg = OfflineDrafterConfig(
        num_prompts=len(PROMPTS), eval_prompts=2, max_new_tokens=12, epochs=1, shard_requests=len(PROMPTS),
        gen_batch_size=4, accept_requests=2, accept_batch_size=2, accept_strategies=["3_1_4"],
        rollout_dtype="bfloat16",
    )  # fmt: skip
    train_offline(policy, drafter, PROMPTS, PROMPTS[:2], cfg, tmp_path / "stream", "test")
    assert {p.dtype for p in policy.parameters()} == {p.dtype for p in drafter.parameters()} == {torch.float32}
    plan = RolloutPlan(PROMPTS, cfg.temperatures, 1, cfg.max_new_tokens, cfg.seed, "bfloat16")
    shard = json.loads((tmp_path / "stream" / "shard_00000.json").read_text())
    assert shard == _reference(policy, plan)
