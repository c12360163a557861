"""Engine configuration."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fastrl.json_values import is_int

ENGINE_DTYPES = {
    "float64": torch.float64,
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def default_dtype(device: str) -> str:
    """The dtype an engine on ``device`` runs rollouts in unless told: bfloat16 on a GPU, float32 on a CPU."""
    return "bfloat16" if device.startswith("cuda") else "float32"


def check_dtype(key: str, dtype: str) -> None:
    """ValueError naming ``key`` when ``dtype`` is not one an engine computes in."""
    if dtype not in ENGINE_DTYPES:
        raise ValueError(f"{key} must be one of {sorted(ENGINE_DTYPES)}, got {dtype!r}")


@dataclass
class EngineConfig:
    """How the engine runs.

    max_batch_size: KV-cache slots, i.e. the most requests decoded at once (continuous batching admits more as
        slots free up).
    max_model_len: context length (prompt + response); None takes the model's max_position_embeddings, and so does
        a larger value (the engine serves at most the model's positions; a new `fastrl train` run refuses a larger one).
    seed: seeds requests that bring none (request i of the engine gets a seed drawn from this one).
    cuda_graphs: on a CUDA device, capture every decode round at start (plain per batch bucket, speculative per
        strategy and bucket) and replay them; ignored on a CPU.
    prefix_sharing: requests admitted together with identical prompts (a GRPO group) prefill once and copy the
        prompt's KV into each other's slots.
    history_tokens: token budget of the history index that history strategies (suffix_N, hybrids) draft from
        (prompts, sibling responses and kept earlier responses; least recently used groups are evicted first).
    page_size: KV-cache entries per page; requests take pages as their tokens arrive and free them at finish.
    kv_cache_tokens: tokens the shared KV pool holds (rounded up to pages); None sizes it so that every slot can
        reach the context length (nothing ever waits for pages). Smaller pools admit requests while pages last
        and preempt (then recompute) the latest admitted when a round finds too few; it must hold at least one
        request of the context length.
    attention_kernel: on a CPU, forwards of a few new tokens per row (decode, a chain's verify, drafter steps)
        attend with fastrl's paged attention kernel, and drafter forwards of a few rows run whole in its
        drafter-step kernel (both compiled at first use with the system's C++ compiler; when none builds, a
        warning and PyTorch). On a GPU, forwards of up to 64 new tokens per row (decode, tree verifies, drafter
        steps) attend with fastrl's Triton kernel, which reads each row's pages in place over the row's own length
        (checked against PyTorch once at engine start; Triton missing or the check failing: a warning and
        PyTorch). False: PyTorch everywhere (each row's pages gathered per layer).
    layer_kernels: on a GPU, each decoder layer's norms, RoPE and SwiGLU product run as 5 Triton launches instead
        of ~34 PyTorch ones (`models/layer_kernels.py`; checked against PyTorch once at engine start; Triton
        missing or the check failing: a warning and PyTorch). Ignored on a CPU.
    admit_batch: while requests decode and more wait than slots are free, admission waits until this many slots
        are free, so that their prefills run as one forward rather than one eager forward every round or two
        (a queue longer than the slots, as in an RL step's rollouts: 2,048 requests on 256 slots, admitted at once,
        prefilled in 622 steps of 1,317 decode rounds). None: max_batch_size // 8 (at least 1); 1 admits as soon
        as a slot frees; more than max_batch_size waits for every slot. Tokens do not depend on it (each request
        samples from its own seed) beyond the rounding of another batch composition (none in float64).
    drafter_backlog: most tokens a request's drafter may leave unread (with the policy's features it reads them
        by), the tokens that rounds without the drafter emitted; a round that could pass it first has the drafter
        read them (the catch-up the next drafter round would do). None: as many as keep every slot's unread
        entries within 256 MiB (`drafter_feed.BACKLOG_BYTES`; at least 64, at most the context). Tokens do not
        depend on it; drafts only by rounding.
    """

    max_batch_size: int = 64
    max_model_len: int | None = None
    device: str = "cpu"
    dtype: str = "float32"
    seed: int = 0
    cuda_graphs: bool = True
    prefix_sharing: bool = True
    history_tokens: int = 200_000
    page_size: int = 16
    kv_cache_tokens: int | None = None
    attention_kernel: bool = True
    layer_kernels: bool = True
    admit_batch: int | None = None
    drafter_backlog: int | None = None
    key_prefix = "engine"  # how this config's errors name its keys (a class attribute, not a key)

    def __post_init__(self) -> None:
        # types first (a config built from a dict, as verl's options are, may hold "64" or "false")
        for key in ("cuda_graphs", "prefix_sharing", "attention_kernel", "layer_kernels"):
            if not isinstance(getattr(self, key), bool):
                raise ValueError(f"engine.{key} must be true or false, got {getattr(self, key)!r}")
        for key, optional in (
            ("max_batch_size", False),
            ("max_model_len", True),
            ("seed", False),
            ("history_tokens", False),
            ("page_size", False),
            ("kv_cache_tokens", True),
            ("admit_batch", True),
            ("drafter_backlog", True),
        ):
            value = getattr(self, key)
            if not (optional and value is None) and not is_int(value):
                kind = "an integer or None" if optional else "an integer"
                raise ValueError(f"engine.{key} must be {kind}, got {value!r}")
        if not isinstance(self.device, str):
            raise ValueError(f"engine.device must be a string such as 'cpu' or 'cuda:0', got {self.device!r}")
        if not 0 <= self.seed < 2**63:  # seeds live in int64 tensors
            raise ValueError(f"engine.seed must be in [0, 2**63), got {self.seed}")
        if self.max_batch_size < 1:
            raise ValueError(f"engine.max_batch_size must be >= 1, got {self.max_batch_size}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"engine.max_model_len must be >= 2, got {self.max_model_len}")
        if self.history_tokens < 1:
            raise ValueError(f"engine.history_tokens must be >= 1, got {self.history_tokens}")
        if self.page_size < 1:
            raise ValueError(f"engine.page_size must be >= 1, got {self.page_size}")
        if self.kv_cache_tokens is not None and self.kv_cache_tokens < 1:
            raise ValueError(f"engine.kv_cache_tokens must be >= 1 or None, got {self.kv_cache_tokens}")
        if self.admit_batch is not None and self.admit_batch < 1:
            raise ValueError(f"engine.admit_batch must be >= 1 or None, got {self.admit_batch}")
        if self.drafter_backlog is not None and self.drafter_backlog < 1:
            raise ValueError(f"engine.drafter_backlog must be >= 1 or None, got {self.drafter_backlog}")
        check_dtype("engine.dtype", self.dtype)

    @property
    def admission_slots(self) -> int:
        """Free slots an admission waits for while requests decode and the queue outnumbers the free slots."""
        if self.admit_batch is None:
            return max(1, self.max_batch_size // 8)
        return min(self.admit_batch, self.max_batch_size)  # a copy with fewer slots (calibration's) keeps the key

    @property
    def torch_dtype(self) -> torch.dtype:
        return ENGINE_DTYPES[self.dtype]
