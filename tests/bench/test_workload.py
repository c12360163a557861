"""Benchmark workloads: task prompts, chat prompts through the chat template, and the KV-cache length."""

from __future__ import annotations

import pytest

from fastrl.assets_path import bundled_model_dir
from fastrl.bench.workload import CHAT_QUESTIONS, bench_prompts
from fastrl.commands.bench_config import BenchConfig
from fastrl.commands.engine_setup import request_context
from fastrl.models.config import ModelConfig
from fastrl.models.tokenizer import load_tokenizer
from tests.helpers import chat_tokenizer, make_hf_model


def test_auto_picks_chat_for_chat_tokenizers_and_task_otherwise():
    tokenizer = chat_tokenizer()
    chat = bench_prompts(tokenizer, "auto", 3, seed=0)
    assert all(tokenizer.decode(p).endswith("\nassistant: ") for p in chat)
    assert bench_prompts(tokenizer, "auto", 3, 0) == chat  # seeded
    task = bench_prompts(load_tokenizer(bundled_model_dir()), "auto", 3, seed=0)
    assert task != chat and not any(tokenizer.decode(p).startswith("<bos>user: ") for p in task)


def test_chat_prompts_cycle_past_the_list():
    prompts = bench_prompts(chat_tokenizer(), "chat", len(CHAT_QUESTIONS) + 2, seed=1)
    assert prompts[len(CHAT_QUESTIONS)] == prompts[0]


def test_context_length_holds_the_longest_prompt_and_the_new_tokens():
    config = make_hf_model("llama").config  # max_position_embeddings 256
    model_config = ModelConfig.from_hf_dict(config.to_dict())
    assert request_context(model_config, [2, 4], 10) == 15
    assert request_context(model_config, [200], 100) == 256  # never past the model's context


def test_unknown_workload_names_the_key():
    with pytest.raises(ValueError, match="bench.workload"):
        BenchConfig(workload="poems")
