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


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"bs1_strategies": ["3_1_4", "foo"]}, "bench.bs1_strategies: strategy 'foo'"),
        ({"bs1_strategies": []}, "bench.bs1_strategies must name at least one"),
        ({"long_tail_selectors": ["bandit", "9_9"]}, "bench.long_tail_selectors: strategy '9_9'"),
        ({"long_tail_bandit_strategies": ["3_1_4", "bandit"]}, "bench.long_tail_bandit_strategies: strategy 'bandit'"),
        ({"bs1_temperatures": [0.0, -1.0]}, r"bench.bs1_temperatures\[1\] must be a finite number >= 0"),
        ({"bs1_temperatures": [float("nan")]}, r"bench.bs1_temperatures\[0\] must be a finite number >= 0"),
        ({"groups_temperatures": [-1.0]}, r"bench.groups_temperatures\[0\] must be a finite number >= 0"),
        ({"kv_memory_new_tokens": [0]}, r"bench.kv_memory_new_tokens must be positive ints"),
        ({"host_time_strategies": ["bogus"]}, r"bench.host_time_strategies: strategy 'bogus'"),
        ({"groups_selectors": ["3_1_4", "bogus"]}, r"bench.groups_selectors: strategy 'bogus'"),
    ],
)
def test_bad_strategy_lists_and_temperatures_name_their_key(keys, message):
    with pytest.raises(ValueError, match=message):
        BenchConfig(**keys)


def test_selectors_and_a_changed_bandit_setting_are_accepted():
    config = BenchConfig(long_tail_selectors=["disable", "12_1_13@0.3", "bandit", "ema", "bandit:explore_budget=0.02"])
    assert config.long_tail_selectors[-1] == "bandit:explore_budget=0.02"
