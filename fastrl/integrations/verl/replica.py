"""``FastrlReplica``: verl's ``RolloutReplica`` for ``actor_rollout_ref.rollout.name=fastrl``. One replica is one
fastrl server actor (plus its engine actor) on one device: tensor/pipeline parallelism is not supported."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from verl.workers.rollout.replica import RolloutMode, RolloutReplica

from fastrl.integrations.verl.drafter_hub import DrafterHub
from fastrl.integrations.verl.options import FastrlRolloutOptions, check_context, rename_keys
from fastrl.integrations.verl.requests import RequestLimits, parse_sampling
from fastrl.integrations.verl.server import FastrlServer
from fastrl.models.checkpoint import read_config

LOG = logging.getLogger("fastrl.verl")


def server_name(replica_rank: int, suffix: str = "", role: str = "") -> str:
    """The Ray actor name of replica ``replica_rank``'s server (the weight-sync adapter finds the policy's by this
    name). ``role``: "" for the policy's rollout, ``"reward_"`` for a generative reward model's servers in the same
    job, as verl names its other backends' (one name, one server)."""
    return f"fastrl_server_{role}{replica_rank}_0{suffix}"


def hub_name(suffix: str = "", role: str = "", mode: str = "STANDALONE") -> str:
    """The Ray actor name of the drafter hub of one model's servers (``role`` as in ``server_name``): a reward
    model's drafters never merge into the policy's. Replicas of another ``mode`` (verl's ``RolloutMode`` name) get
    their own hub: verl's separate-async trainer puts the policy's hybrid replicas, which sleep at every switch to
    the trainer, beside standalone ones that keep serving and never sleep, and a merge round waits for every server
    of its hub (``drafter_sync_timeout_s`` at every switch)."""
    role_part = "_" + role.rstrip("_") if role else ""
    mode_part = "" if mode == "STANDALONE" else "_" + mode.lower()
    return f"fastrl_drafter_hub{role_part}{mode_part}{suffix}"


def replica_role(is_reward_model: bool, is_teacher_model: bool, teacher_key: str = "") -> str:
    """``server_name``'s role of a replica. A teacher is refused (ValueError naming verl's key): verl's teacher loop
    asks every request for the log-probs of its prompt (``prompt_logprobs``, top-k per position), which fastrl's
    prefill does not compute (it keeps the last position's logits only)."""
    if is_teacher_model:
        raise ValueError(
            f"distillation.teacher_models.<teacher>.inference.name=fastrl (teacher {teacher_key!r}): the fastrl "
            "rollout cannot serve a distillation teacher (verl asks it for prompt log-probs, which fastrl does not "
            "compute); set it to vllm or sglang (it defaults to actor_rollout_ref.rollout.name)"
        )
    return "reward_" if is_reward_model else ""


def worker_device(visible_devices: str, local_rank: int) -> str:
    """The one device a trainer worker trains on: its ``CUDA_VISIBLE_DEVICES`` when that names one, else (with
    ``RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES`` every worker sees every GPU) the ``LOCAL_RANK``-th."""
    visible = [d.strip() for d in visible_devices.split(",") if d.strip()]
    if len(visible) <= 1:
        return "".join(visible)
    return visible[local_rank % len(visible)]


def check_sampling_keys(config: object) -> None:
    """verl's rollout keys on what every request samples, checked once in the driver (ValueError naming the key),
    not in every request: ``ignore_eos`` a bool; ``logprobs_mode`` what fastrl returns, the log-probs of the
    processed distribution (temperature, top-k, top-p applied: ``sampling/sampler.py``); and the sampling dicts
    verl's agent loops send, for rollouts and for validation (``val_kwargs``), parsed as the servers parse them."""
    key = "actor_rollout_ref.rollout"
    if not isinstance(config.ignore_eos, bool):
        raise ValueError(f"{key}.ignore_eos must be true or false, got {config.ignore_eos!r}")
    mode = getattr(config, "logprobs_mode", "processed_logprobs")
    if mode != "processed_logprobs":
        raise ValueError(
            f"{key}.logprobs_mode={mode}: the fastrl rollout returns the log-probs of the processed distribution "
            "(temperature, top-k and top-p applied); set it to processed_logprobs"
        )
    sources = [("", config)]
    if getattr(config, "val_kwargs", None) is not None:
        sources.append(("val_kwargs.", config.val_kwargs))
    for prefix, source in sources:
        sampling = {  # as verl's agent loop builds it (AgentLoopWorker.generate_sequences), one token asked
            "temperature": source.temperature,
            "top_p": source.top_p,
            "top_k": source.top_k,
            "repetition_penalty": 1.0,
            "logprobs": config.calculate_log_probs,
            "max_tokens": 1,
        }
        try:
            parse_sampling(sampling, 1, RequestLimits(1, 1, config.ignore_eos), 0)
        except ValueError as err:
            message = str(err).replace("sampling_params.logprobs", f"{key}.calculate_log_probs")
            raise ValueError(message.replace("sampling_params.", f"{key}.{prefix}")) from None


def _node_and_device(worker: object) -> tuple[str, str]:
    """Run inside a trainer worker (``__ray_call__``): its node id and device."""
    device = worker_device(os.environ.get("CUDA_VISIBLE_DEVICES", ""), int(os.environ.get("LOCAL_RANK", "0")))
    return ray.get_runtime_context().get_node_id(), device


class FastrlReplica(RolloutReplica):
    """Starts one ``FastrlServer`` per replica.

    * hybrid (``init_hybrid``, the default with a trainer): on the node of the trainer worker that owns the replica,
      with that worker's ``CUDA_VISIBLE_DEVICES`` (the GPU stays the trainer's in Ray's books, as for SGLang/vLLM);
      weights arrive through ``FastrlServerAdapter.update_weights`` in the trainer worker.
    * standalone on GPUs (``init_standalone``): verl's resource pool and placeholder workers hold the GPUs.
    * standalone on CPU (``custom.fastrl.device=cpu``): no resource pool (verl's pools always ask for GPUs); the
      server runs on the local Ray node. This is the mode of the CPU tests and the recipe's smoke run.
    """

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.role = replica_role(self.is_reward_model, self.is_teacher_model, self.name_suffix.removeprefix("_"))
        self.options = FastrlRolloutOptions.from_custom(self.config.custom)
        sizes = {
            "tensor_model_parallel_size": self.config.tensor_model_parallel_size,
            "data_parallel_size": self.config.data_parallel_size,
            "pipeline_model_parallel_size": self.config.pipeline_model_parallel_size,
        }
        for key, size in sizes.items():
            if size != 1:
                raise ValueError(f"actor_rollout_ref.rollout.{key}={size}: the fastrl rollout runs one device per "
                                 "replica; set it to 1")  # fmt: skip
        check_sampling_keys(self.config)
        # Fail in the driver, naming the key, rather than in a server actor: the options with verl's context, seed,
        # dtype (unless the servers run on the CPU, where it is unused) and concurrency, as the servers will have
        # them, and the checkpoints where this node sees them (on a shared file system)
        max_len = self.config.max_model_len or self.config.prompt_length + self.config.response_length
        device = "cpu" if self.options.device == "cpu" else "cuda"  # "auto": the servers may see a GPU
        worker = self.options.worker_config(
            str(self.model_config.path), self.config.dtype, max_len, self.config.seed, device, self.config.max_num_seqs
        )
        if Path(worker.model_dir).is_dir():
            try:
                worker.check_files()
            except ValueError as err:
                raise ValueError(rename_keys(str(err))) from None
            check_context(worker, read_config(worker.model_dir).max_position_embeddings)
        self.server_class = ray.remote(FastrlServer)
        # the job's drafter hub, held by the replica for the job: the actor is owned by the driver handle that
        # made it, and handles found by name (the other replicas', the servers') do not keep it alive, so without
        # this one Ray collected it once the first server was gone (the next server's shutdown found it dead);
        # the last server to leave the hub ends it (ray.kill)
        self._hub: ray.actor.ActorHandle | None = None

    def rollout_worker_use_gpu(self) -> bool:
        return self.options.device != "cpu"

    async def init_standalone(self) -> None:
        if self.options.device == "cpu":
            self.rollout_mode = RolloutMode.STANDALONE
            await self.launch_servers()
            return
        await super().init_standalone()

    async def launch_servers(self) -> None:
        """Start this replica's server next to its worker (or on this node without one) and wait until it is ready."""
        mode = self.rollout_mode.name if self.rollout_mode is not None else "STANDALONE"
        # the memory release the mode allows, refused here (one ValueError naming the key) rather than in the server
        self.options.releases_at_sleep(self.config.free_cache_engine, mode)
        if self.workers:
            node_id, devices = await self.workers[0].__ray_call__.remote(_node_and_device)
        else:
            node_id, devices = ray.get_runtime_context().get_node_id(), ""
        hub = None
        if self.options.cotrain:
            named = hub_name(self.name_suffix, self.role, mode)
            hub = ray.remote(DrafterHub).options(name=named, get_if_exists=True, num_cpus=0)
            hub = hub.remote(self.options.drafter_sync_timeout_s)
        self._hub = hub
        name = server_name(self.replica_rank, self.name_suffix, self.role)
        server = self.server_class.options(
            name=name,
            num_cpus=0,
            max_concurrency=self.max_concurrency,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
        ).remote(
            config=self.config,
            model_config=self.model_config,
            name=name,
            cuda_visible_devices=devices or None,
            hub=hub,
            rollout_mode=mode,
        )
        await server.ready.remote()
        self.servers = [server]
        self._server_handle = server
        self._server_address = f"fastrl://{name}"

    async def abort_all_requests(self, reject_request: bool = False) -> None:
        """Abort on every server (none after shutdown, as verl's other calls on a shut-down replica do nothing)."""
        for server in self.servers:
            await server.abort_all_requests.remote(reject_request=reject_request)

    async def reports(self) -> list:
        """Each server's ``ServerReport``."""
        return [await s.report.remote() for s in self.servers]

    async def shutdown(self) -> None:
        """Stop the engine actors and kill the servers (verl itself never tears replicas down)."""
        servers, self.servers = self.servers, []
        for server in servers:
            try:  # a server whose engine died still leaves the hub (its shutdown says so); a dead server is killed
                await server.shutdown.remote()
            except ray.exceptions.RayError as err:
                LOG.warning("fastrl replica: a server's shutdown failed (%s); killing it", err)
            ray.kill(server)
