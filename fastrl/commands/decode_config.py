"""The keys shared by commands that decode a prompts file (`fastrl generate`, `fastrl check-exact`)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from fastrl.adaptive.bandit_config import BanditConfig
from fastrl.adaptive.ema_config import EmaConfig
from fastrl.adaptive.factory import build_selector
from fastrl.engine.config import EngineConfig, check_dtype
from fastrl.engine.machine import check_device
from fastrl.sampling.params import MAX_SEED, SamplingParams

MAX_REQUESTS = 1_000_000  # prompts x n of one run: each request's prompt, tokens and record are held in memory
MAX_NEW_TOKENS = 1 << 20  # above any model's context (a request also stops at its model's context)
ENGINE_KEYS_SET_ELSEWHERE = {
    "max_batch_size": "batch_size",
    "max_model_len": "max_new_tokens (the context is the longest prompt plus max_new_tokens)",
    "device": "device",
    "dtype": "dtype",
    "seed": "seed (or a prompt line's own seed)",
}
"""The engine keys a decoding command sets from its own keys, and those keys."""


@dataclass
class DecodeConfig:
    """What is decoded and how: prompts, model, sampling keys, samples per prompt, batch, device, strategy and its
    selector settings. chat_template: "prompt" text is one user turn through the tokenizer's chat template
    ("messages" lines always are). engine: the engine's other settings (``EngineConfig``: cuda_graphs,
    prefix_sharing, history_tokens, page_size, kv_cache_tokens, attention_kernel, layer_kernels, admit_batch,
    drafter_backlog); its slots, context, device, dtype and seed come from the keys above
    (``ENGINE_KEYS_SET_ELSEWHERE``)."""

    prompts: str
    model: str = ""
    chat_template: bool = False
    max_new_tokens: int = 512
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0
    batch_size: int = 16
    device: str = "cpu"
    dtype: str = "float32"
    progress: bool = True
    threads: int = 1
    strategy: str = "disable"
    drafter: str = ""
    bandit: BanditConfig = field(default_factory=BanditConfig)
    ema: EmaConfig = field(default_factory=EmaConfig)
    ema_json: str = ""
    engine: EngineConfig = field(default_factory=EngineConfig)

    def engine_config(self, slots: int, context: int) -> EngineConfig:
        """The engine's settings for a run of ``slots`` requests at once over ``context`` positions."""
        return replace(self.engine, max_batch_size=slots, max_model_len=context, device=self.device, dtype=self.dtype)

    def check_decode_keys(self, command: str) -> None:
        """ValueError naming `command.key` for the first shared key out of range."""
        if not self.prompts:
            raise ValueError(f"{command}.prompts: give an input JSONL file, e.g. prompts=in.jsonl")
        if not 1 <= self.n <= MAX_REQUESTS:
            raise ValueError(f"{command}.n (samples per prompt) must be in [1, {MAX_REQUESTS}], got {self.n}")
        if self.max_new_tokens > MAX_NEW_TOKENS:
            raise ValueError(f"{command}.max_new_tokens must be <= {MAX_NEW_TOKENS}, got {self.max_new_tokens}")
        if self.batch_size < 1:
            raise ValueError(f"{command}.batch_size must be >= 1, got {self.batch_size}")
        if self.threads < 0:
            raise ValueError(f"{command}.threads must be >= 0 (0 = torch's default), got {self.threads}")
        if not 0 <= self.seed < MAX_SEED:
            raise ValueError(f"{command}.seed must be in [0, 2**63), got {self.seed}")
        check_device(f"{command}.device", self.device)
        check_dtype(f"{command}.dtype", self.dtype)
        default = EngineConfig()
        for key, instead in ENGINE_KEYS_SET_ELSEWHERE.items():
            if getattr(self.engine, key) != getattr(default, key):
                raise ValueError(f"{command}.engine.{key}: {command} sets it from its own keys; set {instead}")
        try:  # the sampling keys, checked as every request will be
            SamplingParams(
                max_new_tokens=self.max_new_tokens, temperature=self.temperature, top_p=self.top_p, top_k=self.top_k
            )
        except ValueError as err:
            raise ValueError(f"{command}.{err}") from None
        try:  # the selector as the engine will build it (an EMA config from ema_json is checked when read)
            if not (self.strategy == "ema" and self.ema_json):
                build_selector(self.strategy, self.bandit, self.ema)
        except ValueError as err:
            raise ValueError(f"{command}.strategy={self.strategy}: {err}") from None

    def check_workload(self, command: str, prompt_lines: int) -> None:
        """ValueError naming the key when the prompts file has no prompt line, or prompts x n is over the limit
        (checked before any request is built)."""
        if prompt_lines == 0:
            raise ValueError(f"{command}.prompts={self.prompts}: the file has no prompt lines; nothing to do")
        if prompt_lines * self.n > MAX_REQUESTS:
            raise ValueError(
                f"{command}.n={self.n}: {prompt_lines} prompts x n = {prompt_lines * self.n} requests, over the limit "
                f"of {MAX_REQUESTS} per run; lower n or split the prompts file"
            )
