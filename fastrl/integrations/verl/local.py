"""verl's agent-loop rollout with fastrl servers on a local CPU Ray, without a trainer: the path the CPU tests and
the recipe's smoke run drive (verl's trainer itself needs GPUs: its resource pools always ask for them)."""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from omegaconf import DictConfig

FASTRL = "++actor_rollout_ref.rollout.custom.fastrl."  # ++: add or override (an overlay may set them)
CHAT_TEMPLATE = "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}"


def cpu_overrides(
    model_dir: str | Path, drafter_dir: str | Path = "", replicas: int = 2, prompt_length: int = 32,
    response_length: int = 40,
) -> list[str]:  # fmt: skip
    """Overrides of verl's ppo_trainer for ``replicas`` CPU fastrl replicas of a local checkpoint, one agent-loop
    worker, and a plain chat template (``{{ bos }}`` + the messages' contents) for models that ship none."""
    overrides = [
        f"actor_rollout_ref.model.path={model_dir}",
        f"++actor_rollout_ref.model.custom_chat_template={CHAT_TEMPLATE!r}",
        "actor_rollout_ref.rollout.name=fastrl",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.nnodes=1",
        f"actor_rollout_ref.rollout.n_gpus_per_node={replicas}",  # standalone replica count: n_gpus * nnodes
        "actor_rollout_ref.rollout.agent.num_workers=1",
        f"data.max_prompt_length={prompt_length}",
        f"data.max_response_length={response_length}",
        f"trainer.n_gpus_per_node={replicas}",
        f"{FASTRL}device=cpu",
        f"{FASTRL}num_cpus=0.5",
    ]
    if drafter_dir:
        overrides.append(f"{FASTRL}drafter_dir={drafter_dir}")
    return overrides


def compose_verl_config(overrides: list[str], config_dir: str | Path | None = None, name: str = "ppo_trainer"):
    """Compose verl's trainer config (``config_dir`` holds an overlay whose searchpath includes
    ``pkg://verl.trainer.config``; None composes verl's own ``ppo_trainer``)."""
    from hydra import compose, initialize_config_dir, initialize_config_module

    if config_dir is None:
        with initialize_config_module("verl.trainer.config", version_base=None):
            return compose(name, overrides=overrides)
    with initialize_config_dir(str(Path(config_dir).resolve()), version_base=None):
        return compose(name, overrides=overrides)


def chat_batch(prompts: list[str], n: int):
    """A DataProto of single-message chats, each prompt repeated ``n`` times in a row (GRPO groups)."""
    from verl import DataProto

    raw = np.empty(len(prompts), dtype=object)
    raw[:] = [[{"role": "user", "content": p}] for p in prompts]
    batch = DataProto.from_single_dict(
        {"raw_prompt": raw, "index": np.arange(len(prompts)), "data_source": np.array(["fastrl"] * len(prompts))}
    )
    return batch.repeat(repeat_times=n, interleave=True)


@dataclass
class LocalRollout:
    """verl's ``LLMServerManager`` (fastrl replicas) and ``AgentLoopManager`` on a local Ray."""

    config: DictConfig
    servers: object
    agent_loops: object
    owns_ray: bool

    @classmethod
    def start(cls, config: DictConfig, num_cpus: int | None = None) -> LocalRollout:
        """Register the backend, start (or join) a local Ray, launch the replicas and the agent-loop workers."""
        from verl.experimental.agent_loop import AgentLoopManager
        from verl.workers.rollout.llm_server import LLMServerManager

        import fastrl.integrations.verl.plugin  # noqa: F401  (what verl's entry point does in a pip install)
        from fastrl.rollout.cluster import ensure_ray

        owns = ensure_ray(None, num_cpus or min(2, os.cpu_count() or 1))
        servers = LLMServerManager.create(config=config)
        agent_loops = AgentLoopManager.create(config=config, llm_client=servers.get_client())
        return cls(config, servers, agent_loops, owns)

    def replicas(self) -> list:
        return self.servers.get_replicas()

    def sleep_and_wake(self) -> None:
        """What verl's trainer does between rollouts (the drafter merge happens at sleep)."""

        async def cycle() -> None:
            await asyncio.gather(*[r.sleep() for r in self.replicas()])
            await asyncio.gather(*[r.wake_up() for r in self.replicas()])

        asyncio.run(cycle())

    def reports(self) -> list:
        async def collect() -> list:
            return [report for r in self.replicas() for report in await r.reports()]

        return asyncio.run(collect())

    def shutdown(self) -> None:
        from fastrl.rollout.cluster import shutdown_ray

        for replica in self.replicas():
            asyncio.run(replica.shutdown())
        if self.owns_ray:
            shutdown_ray()
