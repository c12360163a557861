"""Shared setup of the verl tests: verl's own config composed for the fastrl backend on CPU."""

from __future__ import annotations

from omegaconf import DictConfig

from fastrl.assets_path import bundled_drafter_dir, bundled_model_dir
from fastrl.integrations.verl.local import FASTRL, cpu_overrides

PROMPTS = ["sum a=20 b=51 =", "sum a=10 b=69 c=13 =", "sum a=65 b=28 ="]
N_SAMPLES = 2
SEED = 7


def verl_config(extra: list[str] | None = None) -> DictConfig:
    """verl's ppo_trainer config with the fastrl rollout: two CPU replicas of the bundled model and its drafter,
    the bandit over three small strategies, co-training in 50 ms slices, deterministic request ids."""
    from fastrl.integrations.verl.local import compose_verl_config

    overrides = cpu_overrides(bundled_model_dir(), bundled_drafter_dir(), replicas=2) + [
        "actor_rollout_ref.rollout.full_determinism=true",
        "actor_rollout_ref.rollout.temperature=1.0",
        f"actor_rollout_ref.rollout.seed={SEED}",
        f"{FASTRL}max_batch_size=8",
        f"{FASTRL}strategy=bandit",
        f"{FASTRL}bandit.strategies=['3_1_4','3_2_6',disable]",  # quoted: Hydra reads 3_1_4 as 314
        f"{FASTRL}slice_seconds=0.05",
        f"{FASTRL}trainer.max_tokens_per_batch=256",
        f"{FASTRL}trainer.warmup_steps=0",
        *(extra or []),
    ]
    return compose_verl_config(overrides)
