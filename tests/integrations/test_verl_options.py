"""The verl backend's options and request conventions (no verl needed): errors name the key."""

from __future__ import annotations

import random

import pytest

from fastrl.assets_path import bundled_model_dir
from fastrl.integrations.verl.options import PREFIX, FastrlRolloutOptions, check_context, rename_keys
from fastrl.integrations.verl.requests import (
    RequestLimits,
    SpecCounts,
    parse_sampling,
    request_seed,
    stop_reason,
    token_ids,
)

LIMITS = RequestLimits(prompt_length=32, response_length=40)


def _worker_config(**options):
    opts = FastrlRolloutOptions.from_custom({"fastrl": options})
    return opts.worker_config(str(bundled_model_dir()), "bfloat16", 72, 42, "cpu", 256)


def test_defaults_make_a_bandit_worker_with_cotraining():
    config = _worker_config()
    assert (
        config.strategy == "bandit" and config.cotrain and config.engine.dtype == "float32" and config.engine.seed == 42
    )
    assert config.max_concurrent_calls == 256 and config.num_gpus == 0


def test_engine_keys_reach_the_worker():
    config = _worker_config(engine={"page_size": 8, "kv_cache_tokens": 4096, "prefix_sharing": False})
    assert (config.engine.page_size, config.engine.kv_cache_tokens, config.engine.prefix_sharing) == (8, 4096, False)
    assert config.engine.max_model_len == 72


@pytest.mark.parametrize(
    ("options", "key"),
    [
        ({"stratgy": "bandit"}, "stratgy"),
        ({"strategy": "9_9"}, "strategy"),
        ({"slice_seconds": -1.0}, "slice_seconds"),
        ({"device": "tpu"}, "device"),
        ({"max_batch_size": 0}, "max_batch_size"),
        ({"engine": {"page_size": 0}}, "engine.page_size"),
        ({"engine": {"max_batch_size": 4}}, "engine.max_batch_size"),
        ({"engine": [1]}, "engine"),
        ({"trainer": {"learning_rate": 1.0}}, "trainer"),
        ({"bandit": {"strategies": ["8_4_32"], "epsilon": 2.0}}, "bandit.epsilon"),
        ({"drafter_sync_timeout_s": 0}, "drafter_sync_timeout_s"),
        # ill-typed values (a bare TypeError, a message without the key, or silently taken before)
        ({"max_batch_size": "64"}, "max_batch_size must be an integer"),
        ({"max_batch_size": 2.5}, "max_batch_size must be an integer"),
        ({"engine": {"page_size": "16"}}, "engine.page_size must be an integer"),
        ({"engine": {"history_tokens": None}}, "engine.history_tokens must be an integer"),
        ({"engine": {"kv_cache_tokens": "big"}}, "engine.kv_cache_tokens must be an integer or None"),
        ({"engine": {"prefix_sharing": "false"}}, "engine.prefix_sharing must be true or false"),
        ({"engine": {"cuda_graphs": "no"}}, "engine.cuda_graphs must be true or false"),
        ({"trainer": {"lr": "fast"}}, "trainer.lr must be a number"),
        ({"trainer": {"lr": -1}}, "trainer.lr must be a finite number > 0"),
        ({"bandit": {"nope": 1}}, "bandit: unknown BanditConfig keys"),
        ({"strategy": "3_1_4", "bandit": {"epsilon": 2.0}}, "bandit.epsilon"),  # checked though not in use
        ({"strategy": "3_1_4", "ema": {"ema_alpha": "x"}}, "ema"),
        ({"num_cpus": float("inf")}, "num_cpus must be a finite number"),  # was Ray's OverflowError in the actor
        ({"export_dir": "/proc/version/states"}, "export_dir=/proc/version/states: /proc/version is not a directory"),
    ],
)
def test_invalid_options_name_their_key(options, key):
    with pytest.raises(ValueError, match="^" + f"{PREFIX}{key}".replace(".", r"\.")) as raised:
        _worker_config(**options)
    assert str(raised.value).count(PREFIX) == 1  # named once ("...bandit: ...bandit.epsilon" before)


@pytest.mark.parametrize(
    ("verl_values", "said"),
    [
        ({"max_model_len": 1}, r"^actor_rollout_ref\.rollout\.max_model_len \(or prompt_length \+ response_length\) "),
        ({"rollout_seed": -1}, r"^actor_rollout_ref\.rollout\.seed must be in"),
        ({"rollout_dtype": "bf16", "device": "cuda"}, r"^actor_rollout_ref\.rollout\.dtype must be one of"),
    ],
)
def test_verls_own_rollout_values_are_named_as_verls_keys(verl_values, said):
    """They were blamed on custom.fastrl.max_model_len (no such option), custom.fastrl.seed and custom.fastrl.dtype."""
    given = {"rollout_dtype": "bfloat16", "max_model_len": 72, "rollout_seed": 42, "device": "cpu", **verl_values}
    with pytest.raises(ValueError, match=said):
        FastrlRolloutOptions().worker_config(str(bundled_model_dir()), calls=8, **given)


def test_sampling_dict_translation():
    parsed = parse_sampling({"temperature": 0.7, "top_p": 0.9, "top_k": -1, "logprobs": True}, 10, LIMITS, seed=5)
    assert parsed.return_logprobs and parsed.params.top_k == 0 and parsed.params.seed == 5
    assert parsed.params.max_new_tokens == 40  # min(response_length, prompt + response - len(prompt))
    assert parse_sampling({}, 70, LIMITS, seed=5).params.max_new_tokens == 2
    assert parse_sampling({"max_tokens": 0}, 10, LIMITS, seed=5).params is None
    assert parse_sampling({"seed": 9, "max_new_tokens": 3}, 10, LIMITS, seed=5).params.seed == 9
    # both given: max_tokens, the key verl's fully-async client rewrites when it resumes a partial rollout
    assert parse_sampling({"max_tokens": 3, "max_new_tokens": 5}, 10, LIMITS, seed=5).params.max_new_tokens == 3
    with pytest.raises(ValueError, match="sampling_params.repetition_penalty"):
        parse_sampling({"repetition_penalty": 1.1}, 10, LIMITS, seed=5)
    with pytest.raises(ValueError, match="sampling_params.presence_penalty"):
        parse_sampling({"presence_penalty": 0.5}, 10, LIMITS, seed=5)


def test_numpy_numbers_are_taken_as_the_numbers_they_hold():
    """verl hands over values read from arrays: numpy scalars of the right kind are as good as Python's."""
    import numpy as np

    for penalty in (np.float32(1.0), np.int64(1), np.float64(1.0)):
        assert parse_sampling({"repetition_penalty": penalty}, 10, LIMITS, seed=5).params is not None
    assert parse_sampling({"logprobs": np.bool_(True)}, 10, LIMITS, seed=5).return_logprobs
    assert not parse_sampling({"logprobs": np.bool_(False)}, 10, LIMITS, seed=5).return_logprobs
    assert parse_sampling({"logprobs": np.int64(2)}, 10, LIMITS, seed=5).return_logprobs
    with pytest.raises(ValueError, match="sampling_params.repetition_penalty=1.5"):
        parse_sampling({"repetition_penalty": np.float32(1.5)}, 10, LIMITS, seed=5)


@pytest.mark.parametrize(
    "given",
    [
        {"temperature": 0.5},
        {"top_p": 0.75},
        {"top_k": 3},
        {"top_k": -1},
        {"repetition_penalty": 1.0},
        {"logprobs": True},
        {"logprobs": 2},
        {"max_tokens": 5},
        {"max_new_tokens": 0},
        {"seed": 11},
        {"ignore_eos": True},
    ],
)
def test_every_key_takes_numpy_scalars_and_0d_tensors_as_the_numbers_they_hold(given):
    """ignore_eos=np.bool_(True), temperature=torch.tensor(0.5) and max_tokens=torch.tensor(5) were refused while
    logprobs=np.bool_(True) was accepted: one rule for every key."""
    import numpy as np
    import torch

    ((key, value),) = given.items()
    expected = parse_sampling(given, 10, LIMITS, seed=5)
    for wrapped in (np.array(value)[()], np.array(value), torch.tensor(value)):
        assert parse_sampling({key: wrapped}, 10, LIMITS, seed=5) == expected, (key, wrapped)


def test_request_seeds_are_stable_per_id_and_distinct():
    assert request_seed(7, "det-0") == request_seed(7, "det-0")
    assert len({request_seed(7, f"det-{i}") for i in range(100)} | {request_seed(8, "det-0")}) == 101
    assert stop_reason("stop") == "completed" and stop_reason("length") == stop_reason("context") == "length"


def test_spec_counts_are_the_engines_own():
    """verl's accepted count was the accepted drafts a request kept (its accept lengths less one a round): one that
    finished inside an accepted path lost the rest of it (4 of 7 at max_new_tokens=6), and spec_accept_rate read
    low. It is now what the rounds' verification accepted, summed from the rounds themselves."""
    from fastrl.adaptive.fixed import FixedSelector
    from fastrl.assets_path import bundled_drafter_dir, bundled_model_dir
    from fastrl.engine.config import EngineConfig
    from fastrl.engine.engine import Engine, GenerateInput
    from fastrl.models.checkpoint import load_model
    from fastrl.models.tokenizer import load_tokenizer
    from fastrl.rl.tasks.task import ArithChainTask
    from fastrl.sampling.params import SamplingParams
    from fastrl.speculative.drafter_checkpoint import load_drafter

    policy = load_model(bundled_model_dir())
    drafter = load_drafter(bundled_drafter_dir(), policy)[0]
    tokenizer, rng = load_tokenizer(bundled_model_dir()), random.Random(0)
    cut = 0
    for tokens in range(3, 15):
        prompt = tokenizer(ArithChainTask().sample_problem(rng).prompt)["input_ids"]
        engine = Engine(policy, EngineConfig(max_batch_size=1), drafter=drafter, selector=FixedSelector("7_1_8"))
        [out] = engine.generate([GenerateInput(prompt, SamplingParams(max_new_tokens=tokens))])
        counts = SpecCounts.of(out)
        rounds = engine.round_stats
        assert counts.accepted == sum(r.accepted_tokens[0] for r in rounds)
        assert counts.drafted == sum(r.drafted_tokens[0] for r in rounds) and counts.verify_steps == len(rounds)
        kept = sum(n - 1 for n in out.accept_lengths)
        assert counts.accepted >= kept
        cut += counts.accepted > kept
    assert cut >= 1  # a request that ended inside an accepted path: its rounds accepted more than it kept
    assert SpecCounts(drafted=0, accepted=0, verify_steps=2).fields() == {
        "spec_num_draft_tokens": 0,
        "spec_num_accepted_tokens": 0,
        "spec_num_verify_steps": 2,
    }


@pytest.mark.parametrize(
    ("sampling", "prompt_len", "said"),
    [
        ({"temperature": "hot"}, 10, "sampling_params.temperature must be a finite number"),
        ({"top_p": [0.9]}, 10, "sampling_params.top_p"),
        ({"top_k": 1.7}, 10, "sampling_params.top_k must be an integer"),
        ({"top_k": -2}, 10, "sampling_params.top_k must be an integer in \\[0, 2\\*\\*62\\)"),  # only -1 is off
        ({"stop_token_ids": 5}, 10, "sampling_params.stop_token_ids must be a sequence"),
        ({"seed": "1"}, 10, "sampling_params.seed"),
        ({"ignore_eos": "false"}, 10, "sampling_params.ignore_eos must be a bool"),
        ({"max_tokens": -3}, 10, "sampling_params.max_tokens must be >= 0, got -3"),
        ({"max_new_tokens": 2.5}, 10, "sampling_params.max_new_tokens must be an integer"),
        ({}, 73, "a prompt of 73 tokens leaves no room in prompt_length \\+ response_length = 72"),
        ({"repetition_penalty": "abc"}, 10, "sampling_params.repetition_penalty must be a number, got 'abc'"),
        ({"repetition_penalty": [1]}, 10, "sampling_params.repetition_penalty must be a number"),
        ({"logprobs": "false"}, 10, "sampling_params.logprobs must be a bool or a count"),
        ({"logprobs": [1]}, 10, "sampling_params.logprobs must be a bool or a count"),
        ({"max_tokens": 2**62}, 10, "sampling_params.max_tokens must be an integer"),
        ({"max_tokens": 0, "temperature": "hot"}, 10, "sampling_params.temperature"),  # a spent budget checks too
        ({"max_tokens": 0, "top_k": 1.7}, 10, "sampling_params.top_k must be an integer"),
        # every unknown key named (a teacher's request was refused for detokenize, its prompt_logprobs unsaid)
        ({"prompt_logprobs": 2, "detokenize": False}, 10, "sampling_params.detokenize, sampling_params.prompt_logp"),
    ],
)
def test_bad_sampling_values_are_one_error_naming_the_key(sampling, prompt_len, said):
    with pytest.raises(ValueError, match=said):
        parse_sampling(sampling, prompt_len, LIMITS, seed=5)


def test_absent_or_none_sampling_values_take_the_defaults():
    given = {"temperature": None, "top_p": None, "top_k": None, "seed": None, "stop_token_ids": None}
    params = parse_sampling(given, 10, LIMITS, seed=5).params
    assert (params.temperature, params.top_p, params.top_k, params.seed, params.stop_token_ids) == (1.0, 1.0, 0, 5, ())
    assert parse_sampling({}, 72, LIMITS, seed=5).params is None  # the conversation's budget is spent exactly


def test_a_none_length_limit_is_absent_as_none_is_under_every_other_key():
    """``max_tokens=None`` was refused ("must be an integer") while None meant absent under every other key."""
    default = parse_sampling({}, 10, LIMITS, seed=5)
    assert parse_sampling({"max_tokens": None}, 10, LIMITS, seed=5) == default
    assert parse_sampling({"max_tokens": None, "max_new_tokens": None}, 10, LIMITS, seed=5) == default
    assert parse_sampling({"max_tokens": None, "max_new_tokens": 3}, 10, LIMITS, seed=5).params.max_new_tokens == 3


def test_prompt_ids_are_integers():
    import numpy as np
    import torch

    assert token_ids([1, 2]) == token_ids(np.array([1, 2])) == token_ids(torch.tensor([1, 2])) == [1, 2]
    assert all(type(t) is int for t in token_ids(np.array([3, 4])))
    for bad, said in (
        ("abc", "a list of token ids, got str"),
        ([1, 2.5], "integer token ids, got 2.5"),
        (7, "got int"),
    ):
        with pytest.raises(ValueError, match=said):
            token_ids(bad)


def test_a_context_beyond_the_model_or_a_pool_too_small_is_refused_in_the_driver():
    with pytest.raises(ValueError, match=r"max_model_len \(or prompt_length \+ response_length\) = 72 exceeds .* 64"):
        check_context(_worker_config(), max_positions=64)
    check_context(_worker_config(), max_positions=72)
    small = _worker_config(strategy="3_1_4", engine={"kv_cache_tokens": 64, "page_size": 8})
    with pytest.raises(ValueError, match=r"^engine\.kv_cache_tokens = 64 cannot hold .* needs >= 80") as err:
        small.check_files()  # 72 tokens plus a 3_1_4 round's 4, in pages of 8: the worker config's own check
    assert rename_keys(str(err.value)).startswith(f"{PREFIX}engine.kv_cache_tokens = 64 cannot hold")
    _worker_config(strategy="3_1_4", engine={"kv_cache_tokens": 80, "page_size": 8}).check_files()


@pytest.mark.parametrize("section", [0, False, "", [], "bandit"])
def test_a_fastrl_section_that_is_not_a_mapping_is_refused(section):
    """Falsy non-mappings used to read as "no options" (every default, silently)."""
    with pytest.raises(ValueError, match="must be a mapping of options"):
        FastrlRolloutOptions.from_custom({"fastrl": section})
    assert FastrlRolloutOptions.from_custom({"fastrl": None}) == FastrlRolloutOptions.from_custom(None)
