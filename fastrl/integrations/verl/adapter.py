"""``FastrlServerAdapter``: verl's ``BaseRollout`` for the fastrl backend. It lives in each trainer worker (hybrid
mode) or placeholder worker (standalone) and streams verl's ``(name, tensor)`` weight generator into the worker's
fastrl server, which installs the weights as a new policy version."""

from __future__ import annotations

import os
from collections.abc import AsyncIterable, Iterable

import ray
from torch import Tensor
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.utils import ensure_async_iterator

from fastrl.engine.device_memory import MEMORY_PARTS
from fastrl.integrations.verl.replica import server_name


class FastrlServerAdapter(BaseRollout):
    """One replica per device: trainer rank ``r`` owns replica ``r`` (tensor parallelism is not supported).

    ``update_weights`` copies each tensor to CPU, sends buckets of ``checkpoint_engine.update_weights_bucket_megabytes``
    to the server, then commits them: the policy version becomes ``global_steps`` (without it, verl re-installs the
    weights it pushed last: the version stays).
    ``resume``/``release`` wake and sleep the server (sleep also merges the co-trained drafters).
    """

    def __init__(self, config, model_config, device_mesh, replica_rank: int = -1, **kwargs: object) -> None:
        super().__init__(config, model_config, device_mesh)
        rank = int(os.environ.get("RANK", "0"))
        self.replica_rank = rank if replica_rank == -1 else int(replica_rank)
        self.is_leader_rank = True
        self._server: ray.actor.ActorHandle | None = None

    def server(self) -> ray.actor.ActorHandle:
        """This replica's server actor (looked up by name on first use)."""
        if self._server is None:
            self._server = ray.get_actor(server_name(self.replica_rank))
        return self._server

    async def resume(self, tags: list[str]) -> None:
        """Wake the server; what its sleep released comes back part by part as ``tags`` name them (the trainer
        resumes the weights, syncs them and offloads its model before it resumes the KV cache)."""
        parts = sorted(MEMORY_PARTS.intersection(tags))
        if parts:
            await self.server().wake_up.remote(parts)

    async def release(self) -> None:
        await self.server().sleep.remote()

    async def update_weights(
        self,
        weights: Iterable[tuple[str, Tensor]] | AsyncIterable[tuple[str, Tensor]],
        wire_format: str = "named_tensors",
        global_steps: int | None = None,
        peft_config: object | None = None,
        **kwargs: object,
    ) -> int:
        """Stream ``weights`` (HF parameter names, fastrl's names too) into the server; returns the new version. verl
        hands a plain generator (its naive checkpoint engine) or an async one (nccl, nixl and the others)."""
        if wire_format != "named_tensors":
            raise NotImplementedError(f"fastrl rollout: wire_format={wire_format!r}; only 'named_tensors' is supported")
        if peft_config is not None:
            raise NotImplementedError("fastrl rollout: LoRA adapters are not supported; set "
                                      "actor_rollout_ref.model.lora.merge=True to sync merged weights")  # fmt: skip
        limit = int(self.config.checkpoint_engine.update_weights_bucket_megabytes) << 20
        server = self.server()
        bucket: dict[str, Tensor] = {}
        size = 0
        async for name, tensor in ensure_async_iterator(weights):
            if hasattr(tensor, "full_tensor"):  # a sharded DTensor: gather it (every rank iterates the generator)
                tensor = tensor.full_tensor()
            cpu = tensor.detach().to("cpu", copy=True)
            bucket[name] = cpu
            size += cpu.numel() * cpu.element_size()
            if size >= limit:
                await server.receive_weights.remote(bucket)
                bucket, size = {}, 0
        if bucket:
            await server.receive_weights.remote(bucket)
        return await server.commit_weights.remote(global_steps)
