"""Shared rollout fixtures: a tiny random policy checkpoint (two weight versions) with a fresh drafter, a real
local Ray for the package, and the reference outputs of a plain in-process Engine."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest
import ray
import torch

from fastrl.cotrain.drafter_trainer import DrafterTrainerConfig
from fastrl.engine.config import EngineConfig
from fastrl.engine.engine import Engine, GenerateInput
from fastrl.engine.request import RequestOutput
from fastrl.models.checkpoint import load_model
from fastrl.rollout.cluster import ensure_ray
from fastrl.rollout.types import RolloutRequest, RolloutResult
from fastrl.rollout.worker_config import RolloutWorkerConfig
from fastrl.sampling.params import SamplingParams
from fastrl.speculative.drafter import EagleDrafter
from fastrl.speculative.drafter_checkpoint import save_drafter
from tests.helpers import make_hf_model

VOCAB = 97


@dataclass
class TinyCheckpoint:
    """policy: weights v0; policy_v1: other random weights of the same shape; drafter: a fresh drafter for both."""

    policy: str
    policy_v1: str
    drafter: str


@pytest.fixture(scope="package")
def checkpoint(tmp_path_factory) -> TinyCheckpoint:
    root: Path = tmp_path_factory.mktemp("rollout-checkpoint")
    make_hf_model("llama", seed=0).save_pretrained(root / "policy")
    make_hf_model("llama", seed=1).save_pretrained(root / "policy_v1")
    torch.manual_seed(0)
    save_drafter(EagleDrafter(load_model(root / "policy").config), root / "drafter", "tiny-llama")
    return TinyCheckpoint(str(root / "policy"), str(root / "policy_v1"), str(root / "drafter"))


@pytest.fixture(scope="package")
def ray_cluster():
    """A real local Ray with (at most) 2 CPUs for the whole package; shut down after its last test."""
    started = ensure_ray(None, min(2, os.cpu_count() or 1))
    yield
    if started:
        ray.shutdown()


def worker_config(ckpt: TinyCheckpoint, **overrides) -> RolloutWorkerConfig:
    """Small, fast worker settings: speculative 3_2_4 rounds, batches of 4, 50 ms co-training slices."""
    settings = dict(
        model_dir=ckpt.policy,
        drafter_dir=ckpt.drafter,
        strategy="3_2_4",
        engine=EngineConfig(max_batch_size=4),
        num_cpus=0.5,
        slice_seconds=0.05,
        trainer=DrafterTrainerConfig(max_tokens_per_batch=512, warmup_steps=0),
    )
    settings.update(overrides)
    return RolloutWorkerConfig(**settings)


def prompt(i: int, length: int | None = None) -> list[int]:
    g = torch.Generator().manual_seed(1000 + i)
    n = length if length is not None else 2 + i % 7
    return torch.randint(3, VOCAB, (n,), generator=g).tolist()


def mixed_requests(n: int, group_size: int = 3, prefix: str = "q") -> list[RolloutRequest]:
    """Uneven lengths (4..32 new tokens), greedy and sampled, some stopping at EOS; `group_size` per group."""
    settings = [dict(temperature=0.0), dict(temperature=1.0), dict(temperature=0.8, top_p=0.9)]
    return [
        RolloutRequest(
            f"{prefix}{i}",
            prompt(i),
            SamplingParams(max_new_tokens=4 + (i * 7) % 29, seed=100 + i, ignore_eos=i % 2 == 0, **settings[i % 3]),
            group=i // group_size,
        )
        for i in range(n)
    ]


def reference(model_dir: str, requests: list[RolloutRequest]) -> list[RequestOutput]:
    """What one plain in-process Engine produces for the same requests (outputs in request order)."""
    engine = Engine(load_model(model_dir), EngineConfig(max_batch_size=16))
    return engine.generate([GenerateInput(r.prompt_ids, r.params, r.request_id) for r in requests])


def assert_same_tokens(results: list[RolloutResult], expected: list[RequestOutput]) -> None:
    assert [r.request_id for r in results] == [e.request_id for e in expected]
    for r, e in zip(results, expected, strict=True):
        assert r.token_ids == e.token_ids, f"{r.request_id}: {r.token_ids} != {e.token_ids}"
        assert r.finish_reason == e.finish_reason.value
        assert r.logprobs == pytest.approx(e.logprobs, abs=1e-4)
