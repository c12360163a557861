"""SamplingParams validation: each bad field raises a ValueError that names it."""

import dataclasses
import json

import numpy as np
import pytest
import torch

from fastrl.sampling.params import MIN_TEMPERATURE, SamplingParams


def test_defaults_and_greedy():
    params = SamplingParams()
    assert params.max_new_tokens == 256 and params.temperature == 1.0 and params.top_p == 1.0
    assert params.top_k == 0 and params.seed is None and params.stop_token_ids == () and not params.ignore_eos
    assert not params.greedy
    assert SamplingParams(temperature=0.0).greedy
    assert SamplingParams(temperature=0).greedy


def test_stop_token_ids_list_becomes_tuple_and_params_are_hashable():
    params = SamplingParams(stop_token_ids=[3, 7])
    assert params.stop_token_ids == (3, 7)
    assert isinstance(params.stop_token_ids, tuple)
    assert hash(params) == hash(SamplingParams(stop_token_ids=(3, 7)))


def test_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        SamplingParams().temperature = 0.5  # type: ignore[misc]


def test_valid_edges_accepted():
    SamplingParams(max_new_tokens=1, temperature=0.0, top_p=1.0, top_k=0, seed=0)
    SamplingParams(temperature=MIN_TEMPERATURE)
    SamplingParams(top_p=1e-9, top_k=1, seed=2**63 - 1, stop_token_ids=(0, 2**63 - 1), ignore_eos=True)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_new_tokens", 0),
        ("max_new_tokens", -3),
        ("max_new_tokens", 2.5),
        ("temperature", -0.1),
        ("temperature", float("nan")),
        ("temperature", float("inf")),
        ("temperature", 1e-40),  # a float32 subnormal: every scaled logit overflowed to an infinity
        ("temperature", 9.9e-7),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("top_p", -0.2),
        ("top_k", -1),
        ("top_k", 1.5),
        ("seed", -1),
        ("seed", 2**63),
        ("seed", 1.0),
        ("stop_token_ids", (1, -2)),
        ("stop_token_ids", (2**64,)),  # past int64: it broke inside the engine's step instead
        ("stop_token_ids", (2**63,)),
        ("stop_token_ids", (3.0,)),
        ("stop_token_ids", "12"),
        ("stop_token_ids", 5),
        ("ignore_eos", "yes"),
    ],
)
def test_invalid_field_raises_naming_it(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


@pytest.mark.parametrize("kind", [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16])
def test_numpy_numbers_become_python_ones(kind):
    """A narrow numpy max_new_tokens stayed numpy: the engine's prompt length + max_new_tokens overflowed (np.int8(100)
    with a 30-token prompt stopped after one token), and a numpy seed made outputs that json.dumps refused."""
    p = SamplingParams(
        max_new_tokens=kind(100), top_k=kind(7), seed=kind(5), temperature=np.float32(0.5), top_p=np.float16(0.5)
    )
    values = (p.max_new_tokens, p.top_k, p.seed, p.temperature, p.top_p)
    assert [type(v) for v in values] == [int, int, int, float, float]
    assert values == (100, 7, 5, 0.5, 0.5)
    assert json.loads(json.dumps(dataclasses.asdict(p)))["seed"] == 5
    assert 120 + p.max_new_tokens == 220  # int8 arithmetic would wrap


@pytest.mark.parametrize("ids", [np.array([3, 4]), torch.tensor([3, 4]), [np.int64(3), torch.tensor(4).item()]])
def test_stop_token_ids_from_arrays_and_tensors(ids):
    assert SamplingParams(stop_token_ids=ids).stop_token_ids == (3, 4)


@pytest.mark.parametrize(
    ("ids", "message"),
    [
        (torch.tensor([[3, 4]]), "one row of integers, got 2 dimensions"),
        (torch.tensor([3.0, 4.0]), "must be integers"),
        (np.array([True, False]), "must be integers"),
    ],
)
def test_stop_token_ids_arrays_that_are_not_ids_are_refused(ids, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(stop_token_ids=ids)
