"""Trains the bundled policy (a small Llama) from scratch on the arithmetic-chain task, on CPU, and saves it in
Hugging Face format with its tokenizer.

    python recipes/bundled_model/sft.py --out fastrl/assets/arith-tiny --overwrite

Every flag is checked, and ``--out`` too (a directory holding files only with ``--overwrite``), before the model is
built. The model is written through a staged directory renamed into place, so a failed run leaves ``--out`` as it
was; with ``--overwrite`` the model's files there are replaced and a stale ``eval.json`` (the old model's) removed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

# Sleeping (not spinning) OpenMP workers: on a CPU shared with other jobs, spinning threads slow training ~5x.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch
from sft_data import LengthCurriculum, SFTBatches
from tqdm import tqdm
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

from fastrl.bench.cli_args import at_least, number_at_least, positive_float
from fastrl.commands.output_guard import OutputTarget, check_output_dir
from fastrl.commands.staged_output import staged_directory
from fastrl.rl.tasks import ArithChainTask, TaskConfig
from fastrl.rl.tasks.tokenizer import build_tokenizer, save_tokenizer

MODEL_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "training.json",
    "eval.json",  # evaluate.py's, of the model this run replaces
)
"""What a run writes into --out, and removes there when it did not write it (the replaced model's)."""


@dataclass
class SFTConfig:
    """Model shape, data and optimisation of the SFT run (every field is a ``--flag``)."""

    out: str = "fastrl/assets/arith-tiny"
    seed: int = 0
    # model: a Llama with grouped-query attention
    hidden_size: int = 192
    num_layers: int = 6
    num_heads: int = 6
    num_kv_heads: int = 2
    intermediate_size: int = 512
    max_positions: int = 1024
    # data: fresh task samples, batched by length
    size_exponent: float = 1.8
    # length curriculum: sizes capped at curriculum_n_max for the first curriculum_hold of the steps, then the cap
    # grows linearly to the task's n_max at curriculum_full of the steps
    curriculum_n_max: int = 4
    curriculum_hold: float = 0.2
    curriculum_full: float = 0.6
    tokens_per_batch: int = 1024
    chunk_examples: int = 256
    # optimisation: AdamW, linear warmup then cosine decay to min_lr_ratio * lr
    steps: int = 3400
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 100
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    threads: int = 2
    # where to train: "cpu" (float32) or "cuda" (bfloat16 autocast, batches prepared by a background thread)
    device: str = "cpu"
    # stop early after this many seconds of training (0: run all `steps`; the schedule still spans `steps`)
    time_budget_s: float = 0.0

    def __post_init__(self) -> None:
        if self.num_kv_heads >= self.num_heads or self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"--num-kv-heads {self.num_kv_heads} must divide --num-heads {self.num_heads} and be smaller "
                "(grouped-query attention)"
            )
        if self.hidden_size % self.num_heads:
            raise ValueError(f"--hidden-size {self.hidden_size} must be divisible by --num-heads {self.num_heads}")
        if not 0.0 <= self.curriculum_hold <= self.curriculum_full <= 1.0:
            raise ValueError(
                f"--curriculum-hold {self.curriculum_hold} and --curriculum-full {self.curriculum_full} need "
                "0 <= hold <= full <= 1"
            )
        if self.min_lr_ratio > 1.0:
            raise ValueError(f"--min-lr-ratio must be in [0, 1], got {self.min_lr_ratio}")
        if self.steps <= self.warmup_steps:
            raise ValueError(f"--steps {self.steps} must exceed --warmup-steps {self.warmup_steps}")


def torch_device(text: str) -> str:
    """An argparse ``type``: ``cpu`` or ``cuda[:N]`` of a CUDA device this machine has."""
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise argparse.ArgumentTypeError(f"{text!r} is not a torch device; give cpu or cuda") from None
    if device.type not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"{text!r}: this recipe trains on cpu or cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise argparse.ArgumentTypeError(f"{text!r}: no CUDA device is available")
    return text


FLAG_TYPES = {
    "out": str,
    "seed": at_least(0),
    "size_exponent": number_at_least(0.0),
    "curriculum_hold": number_at_least(0.0),
    "curriculum_full": number_at_least(0.0),
    "warmup_steps": at_least(0),
    "lr": positive_float,
    "min_lr_ratio": number_at_least(0.0),
    "weight_decay": number_at_least(0.0),
    "grad_clip": positive_float,
    "device": torch_device,
    "time_budget_s": number_at_least(0.0),
}
"""The argparse type of each SFTConfig field; any other (a size, a count) is an integer >= 1."""


def parse_config(argv: list[str] | None = None) -> tuple[SFTConfig, OutputTarget]:
    """SFTConfig from the command line, one ``--field-name`` per dataclass field, and its checked ``--out``: a bad
    value is one usage error naming the flag, before any work."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for f in dataclasses.fields(SFTConfig):
        parser.add_argument(
            "--" + f.name.replace("_", "-"), type=FLAG_TYPES.get(f.name, at_least(1)), default=f.default
        )
    parser.add_argument(
        "--overwrite", action="store_true", help="replace the model in an --out that holds files (the shipped one)"
    )
    args = vars(parser.parse_args(argv))
    overwrite = args.pop("overwrite")
    try:
        cfg = SFTConfig(**args)
        task_config = TaskConfig(size_exponent=cfg.size_exponent, context_length=cfg.max_positions)
    except ValueError as err:
        parser.error(str(err).replace("TaskConfig.context_length", "--max-positions"))
    try:
        ArithChainTask(task_config)
    except ValueError as err:
        parser.error(f"--max-positions {cfg.max_positions} is too short for the task: {err}")
    try:
        target = check_output_dir("--out", cfg.out, {}, overwrite=overwrite)
    except ValueError as err:
        parser.error(str(err).replace("pass overwrite=true", "pass --overwrite"))
    return cfg, target


def build_model(cfg: SFTConfig, vocab_size: int, bos_id: int, eos_id: int, pad_id: int) -> LlamaForCausalLM:
    """A freshly initialised LlamaForCausalLM of the configured shape (untied embeddings)."""
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        max_position_embeddings=cfg.max_positions,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
    )
    return LlamaForCausalLM(config)


def learning_rate(cfg: SFTConfig, step: int) -> float:
    """Linear warmup over `warmup_steps`, then cosine decay from `lr` to `min_lr_ratio * lr` at `steps`."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / (cfg.steps - cfg.warmup_steps)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def add_legacy_rope_theta(config_path: Path) -> None:
    """Adds the top-level ``rope_theta`` of transformers 4.x configs next to 5.x's ``rope_parameters``, so loaders
    of either convention read the same value."""
    config = json.loads(config_path.read_text())
    if "rope_theta" not in config and "rope_parameters" in config:
        config["rope_theta"] = config["rope_parameters"]["rope_theta"]
        config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def make_optimizer(model: torch.nn.Module, cfg: SFTConfig) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (not on norms)."""
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8)


def prefetch(batches: SFTBatches, steps: int, depth: int):
    """`get(step)` of the batches; with depth > 0 a daemon thread builds them ahead (the GPU would wait on them)."""
    if depth == 0:
        return batches.next
    import queue
    import threading

    ready: queue.Queue = queue.Queue(maxsize=depth)

    def work() -> None:
        for step in range(steps):
            ready.put(batches.next(step))

    threading.Thread(target=work, daemon=True).start()
    return lambda step: ready.get()


def train(cfg: SFTConfig, target: OutputTarget) -> None:
    """Runs the SFT and writes the checkpoint, tokenizer and a `training.json` summary to `target` (`cfg.out`),
    through a staged directory renamed into place."""
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    task = ArithChainTask(TaskConfig(size_exponent=cfg.size_exponent, context_length=cfg.max_positions))
    tokenizer = build_tokenizer(cfg.max_positions)
    model = build_model(cfg, len(tokenizer), tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id)
    num_params = sum(p.numel() for p in model.parameters())
    print(f"model: {num_params / 1e6:.2f}M parameters, vocab {len(tokenizer)}", flush=True)
    optimizer = make_optimizer(model, cfg)
    curriculum = LengthCurriculum(
        cfg.curriculum_n_max, int(cfg.curriculum_hold * cfg.steps), int(cfg.curriculum_full * cfg.steps)
    )
    batches = SFTBatches(task, tokenizer, curriculum, cfg.tokens_per_batch, cfg.chunk_examples, cfg.seed)

    model.to(cfg.device).train()
    batch_queue = prefetch(batches, cfg.steps, depth=4 if cfg.device != "cpu" else 0)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=cfg.device.startswith("cuda"))
    start = time.perf_counter()
    tokens_seen = 0
    ema_loss = None
    progress = tqdm(range(cfg.steps), desc="sft", mininterval=5.0)
    for step in progress:
        input_ids, labels = batch_queue(step)  # [B, T], [B, T]
        input_ids, labels = input_ids.to(cfg.device, non_blocking=True), labels.to(cfg.device, non_blocking=True)
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(cfg, step)
        with autocast:
            loss = model(input_ids=input_ids, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        tokens_seen += input_ids.numel()
        ema_loss = loss.item() if ema_loss is None else 0.95 * ema_loss + 0.05 * loss.item()
        elapsed = time.perf_counter() - start
        if step % 10 == 0 or step == cfg.steps - 1:
            stats = {
                "loss": f"{ema_loss:.4f}",
                "lr": f"{learning_rate(cfg, step):.2e}",
                "n_max": curriculum.n_max_at(step, task.config.n_max),
                "tok_s": f"{tokens_seen / elapsed:.0f}",
            }
            progress.set_postfix(stats, refresh=False)
        if cfg.time_budget_s and elapsed > cfg.time_budget_s:
            print(f"time budget {cfg.time_budget_s:.0f}s reached after {step + 1} steps", flush=True)
            break
    train_seconds = time.perf_counter() - start
    model.to("cpu")

    out = Path(cfg.out)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        do_sample=False,
        max_new_tokens=task.max_response_chars() + 1,
    )
    summary = {
        "config": dataclasses.asdict(cfg),
        "num_parameters": num_params,
        "train_seconds": round(train_seconds, 1),
        "tokens_seen": tokens_seen,
        "final_loss_ema": ema_loss,
        "torch": torch.__version__,
    }
    with staged_directory(target, owned=MODEL_FILES) as staging:
        model.save_pretrained(staging, safe_serialization=True)
        add_legacy_rope_theta(staging / "config.json")
        save_tokenizer(staging, cfg.max_positions)
        (staging / "training.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"trained {cfg.steps} steps in {train_seconds:.0f}s, final loss {ema_loss:.4f}; saved to {out}", flush=True)


def main(argv: list[str] | None = None) -> None:
    train(*parse_config(argv))


if __name__ == "__main__":
    main()
