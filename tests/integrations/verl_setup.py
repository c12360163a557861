"""Shared setup of the verl tests: verl's own config composed for the fastrl backend on CPU, and a batch of chat
prompts as verl's dataset hands them to the agent loop."""

from __future__ import annotations

import numpy as np
from omegaconf import DictConfig

from fastrl.assets_path import bundled_drafter_dir, bundled_model_dir

CHAT_TEMPLATE = "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}"
PROMPTS = ["sum a=20 b=51 =", "sum a=10 b=69 c=13 =", "sum a=65 b=28 ="]
N_SAMPLES = 2
SEED = 7
FASTRL = "+actor_rollout_ref.rollout.custom.fastrl."


def verl_config(extra: list[str] | None = None) -> DictConfig:
    """verl's ppo_trainer config with the fastrl rollout: two CPU replicas of the bundled model and its drafter,
    the bandit over three small strategies, co-training in 50 ms slices, deterministic request ids."""
    from hydra import compose, initialize_config_module

    model = bundled_model_dir()
    overrides = [
        f"actor_rollout_ref.model.path={model}",
        f"+actor_rollout_ref.model.custom_chat_template={CHAT_TEMPLATE!r}",
        "actor_rollout_ref.rollout.name=fastrl",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.nnodes=1",
        "actor_rollout_ref.rollout.n_gpus_per_node=2",
        "actor_rollout_ref.rollout.agent.num_workers=1",
        "actor_rollout_ref.rollout.full_determinism=true",
        "actor_rollout_ref.rollout.temperature=1.0",
        f"actor_rollout_ref.rollout.seed={SEED}",
        "data.max_prompt_length=32",
        "data.max_response_length=40",
        "trainer.n_gpus_per_node=2",
        f"{FASTRL}device=cpu",
        f"{FASTRL}num_cpus=0.5",
        f"{FASTRL}max_batch_size=8",
        f"{FASTRL}drafter_dir={bundled_drafter_dir()}",
        f"{FASTRL}strategy=bandit",
        f"{FASTRL}bandit.strategies=['3_1_4','3_2_6',disable]",  # quoted: Hydra reads 3_1_4 as 314
        f"{FASTRL}slice_seconds=0.05",
        f"{FASTRL}trainer.max_tokens_per_batch=256",
        f"{FASTRL}trainer.warmup_steps=0",
        *(extra or []),
    ]
    with initialize_config_module("verl.trainer.config", version_base=None):
        return compose("ppo_trainer", overrides=overrides)


def chat_batch(n: int = N_SAMPLES):
    """A DataProto of chat prompts, each repeated ``n`` times in a row (GRPO style), as verl's trainer builds it."""
    from verl import DataProto

    messages = [[{"role": "user", "content": p}] for p in PROMPTS]
    raw = np.empty(len(messages), dtype=object)
    raw[:] = messages
    batch = DataProto.from_single_dict(
        {"raw_prompt": raw, "index": np.arange(len(PROMPTS)), "data_source": np.array(["arith"] * len(PROMPTS))}
    )
    return batch.repeat(repeat_times=n, interleave=True)
