"""What a request's inputs must be, checked before it reaches an engine: the engine's ``check_request`` and the
rollout driver (which refuses a bad request before any worker sees its batch) word a refusal alike."""

from __future__ import annotations

import operator
from collections.abc import Iterable, Iterator, Mapping
from collections.abc import Set as AbstractSet

import torch

from fastrl.sampling.params import SamplingParams


def checked_params(params: object, name: str) -> SamplingParams:
    """The params, the defaults for None; ValueError naming ``name`` (e.g. "request 'r1'") when they are not a
    SamplingParams (a dict, say)."""
    if params is None:
        return SamplingParams()
    if not isinstance(params, SamplingParams):
        raise ValueError(f"{name}: params must be a SamplingParams, got {type(params).__name__}")
    return params


def checked_prompt(prompt_ids: Iterable[int], name: str) -> list[int]:
    """The prompt as a list of Python ints; ValueError naming ``name`` when it is not one row of integers (a
    string, a mapping, a float or bool id, a float tensor, a 2-d array). Its length and vocabulary are the
    scheduler's to check, per request."""
    if hasattr(prompt_ids, "ndim") and prompt_ids.ndim != 1:  # a numpy array or a tensor: one row of ids
        raise ValueError(f"{name}: prompt ids must be one row of integers, got {prompt_ids.ndim} dimensions")
    if isinstance(prompt_ids, (str, bytes, Mapping, AbstractSet, Iterator)) or not hasattr(prompt_ids, "__iter__"):
        raise ValueError(f"{name}: prompt ids must be a sequence of integers, got {type(prompt_ids).__name__}")
    if isinstance(prompt_ids, torch.Tensor) and not _integer_dtype(prompt_ids):
        raise ValueError(f"{name}: prompt ids must be integers, got a {prompt_ids.dtype} tensor")
    prompt = []
    for token in prompt_ids:
        if not _is_token(token):
            raise ValueError(f"{name}: prompt ids must be integers, got {token!r} ({type(token).__name__})")
        prompt.append(operator.index(token))
    return prompt


def _integer_dtype(tensor: torch.Tensor) -> bool:
    """A tensor of integers: not floating point, complex or bool (which ``operator.index`` takes as 1 and 0)."""
    return not (tensor.is_floating_point() or tensor.is_complex() or tensor.dtype == torch.bool)


def _is_token(token: object) -> bool:
    """One prompt id: an integer of any kind (Python, numpy, a 0-d integer tensor), not a bool."""
    if isinstance(token, torch.Tensor):
        return token.dim() == 0 and _integer_dtype(token)
    return not isinstance(token, bool) and hasattr(token, "__index__")
