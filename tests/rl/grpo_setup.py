"""Shared pieces of the GRPO tests: a tiny random policy over the bundled character tokenizer and a task with a
dense reward (a random policy never solves arithmetic, so the real task's 0/1 reward would give no signal)."""

from __future__ import annotations

import random
from pathlib import Path

import torch

from fastrl.models.checkpoint import save_model
from fastrl.models.config import ModelConfig
from fastrl.models.decoder import CausalLM
from fastrl.rl.tasks import ArithChainTask, Problem, TaskConfig
from fastrl.rl.tasks.tokenizer import build_tokenizer
from fastrl.rl.trainer import GRPOTrainer
from fastrl.rl.trainer_config import GRPOConfig
from fastrl.rollout.local import LocalRollout
from fastrl.rollout.worker_config import RolloutWorkerConfig

DIGITS = set("0123456789")


def char_tokenizer():
    """The bundled character-level tokenizer (built in code)."""
    return build_tokenizer()


def tiny_policy(seed: int = 0, vocab_size: int | None = None, tied: bool = False, positions: int = 128) -> CausalLM:
    """A 2-layer random Llama over the character vocabulary, EOS = 2, weights spread so logits are not flat."""
    vocab = vocab_size or len(char_tokenizer())
    config = ModelConfig(
        model_type="llama",
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=positions,
        tie_word_embeddings=tied,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(seed)
    model = CausalLM(config)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.15)
    return model.eval()


def local_backend(
    directory: Path, weights: CausalLM, strategy: str = "disable", cotrain: bool = False, seed: int = 0
) -> LocalRollout:
    """An in-process rollout backend serving `weights` (saved to `directory`); `seed` initialises its drafter."""
    save_model(weights, directory)
    config = RolloutWorkerConfig(
        model_dir=str(directory),
        strategy=strategy,
        cotrain=cotrain,
        engine={"max_batch_size": 16, "seed": seed},
        slice_seconds=0.05,
    )
    return LocalRollout(config, seed=seed)


class DigitTask:
    """Arithmetic-chain prompts (small sizes), rewarded by the fraction of digit characters in the response: a
    dense signal a random policy can improve on. Full reward (1.0, "correct") needs an all-digit response."""

    def __init__(self) -> None:
        self.arith = ArithChainTask(TaskConfig(n_min=2, n_max=6, bucket_edges=(2, 4), context_length=256))

    def sample_problem(self, rng: random.Random) -> Problem:
        return self.arith.sample_problem(rng)

    def reward(self, problem: Problem, response_text: str) -> float:
        if not response_text:
            return 0.0
        return sum(c in DIGITS for c in response_text) / len(response_text)

    def size_bucket(self, problem: Problem) -> str:
        return self.arith.size_bucket(problem)

    def bucket_names(self) -> list[str]:
        return self.arith.bucket_names()


def digit_trainer(
    directory: Path, strategy: str, seed: int = 0, cotrain: bool = False, **config: object
) -> GRPOTrainer:
    """A GRPO trainer on DigitTask over ``tiny_policy(seed)``, checkpointing to ``directory``, its rollouts from an
    in-process backend of ``strategy`` (serving weights saved at ``directory.served``, co-training its drafter with
    ``cotrain``); ``config``: GRPOConfig keys."""
    grpo = GRPOConfig(checkpoint_dir=str(directory), progress=False, **config)
    backend = local_backend(directory.with_suffix(".served"), tiny_policy(seed=seed), strategy, cotrain, seed)
    return GRPOTrainer(tiny_policy(seed=seed), char_tokenizer(), DigitTask(), backend, grpo)
