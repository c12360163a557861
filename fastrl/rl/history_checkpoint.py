"""The rollout workers' history indexes in a training checkpoint: one safetensors file per worker slot.

``worker_<i>.safetensors`` holds int64 tensors: ``tokens``, every prompt and kept response of the index one after
another; ``layout``, for each prompt group in turn (least recently used first) its prompt length, its number of
kept responses and their lengths; and the order the texts arrived in (``HistoryState.orders``): ``order``, (text,
first, end) triples one after another, and ``order_counts``, how many triples each group has (a file written before
they were kept has neither: it loads text by text). A run resumed from it drafts from the responses of the steps
before it as the uninterrupted run would have (the rollout manager's prompt affinity, saved with the selector state,
sends a repeated prompt back to the same slot).
"""

from __future__ import annotations

from pathlib import Path

import torch

from fastrl.models.checkpoint import read_safetensors
from fastrl.rl.worker_files import worker_slots
from fastrl.speculative.history import HistoryState
from fastrl.tensor_files import save_tensors


def save_history_states(states: list[HistoryState | None], directory: Path) -> int:
    """``worker_<i>.safetensors`` for each worker slot i (nothing when no worker keeps a history index); returns the
    number of slots written (what the checkpoint records as ``history_workers``)."""
    if all(state is None for state in states):
        return 0
    directory.mkdir(parents=True)
    for i, state in enumerate(states):
        tokens: list[int] = []
        layout: list[int] = []
        for prompt, responses in (state or HistoryState([])).groups:
            layout += [len(prompt), len(responses), *map(len, responses)]
            tokens += prompt
            for response in responses:
                tokens += response
        tensors = {"tokens": torch.tensor(tokens, dtype=torch.int64), "layout": torch.tensor(layout, dtype=torch.int64)}
        orders = state.orders if state is not None else []
        if orders is not None:
            flat = [value for order in orders for triple in order for value in triple]
            tensors["order"] = torch.tensor(flat, dtype=torch.int64)
            tensors["order_counts"] = torch.tensor([len(order) for order in orders], dtype=torch.int64)
        save_tensors(tensors, directory / f"worker_{i}.safetensors")
    return len(states)


def read_history_states(directory: Path, vocab_size: int, workers: int | None = None) -> list[HistoryState]:
    """What ``save_history_states`` wrote, in slot order: the ``workers`` slots the checkpoint recorded (None, a
    checkpoint written before it recorded them: the slots found; [] when ``directory`` does not exist). ValueError
    naming the file when one is missing, unreadable, inconsistent, or holds a token id outside ``[0, vocab_size)``
    (the policy's: a draft of such a token would fail inside a round)."""
    count = worker_slots(directory, workers, ("worker_{}.safetensors",), "history indexes")
    states = []
    for i in range(count):
        file = directory / f"worker_{i}.safetensors"
        tensors = read_safetensors(file)
        for name in ("tokens", "layout"):
            if name not in tensors:
                raise ValueError(f"{file} lacks the tensor {name!r}")
        state = _state(tensors["tokens"], tensors["layout"], vocab_size, file)
        states.append(_with_orders(state, tensors.get("order"), tensors.get("order_counts"), file))
    return states


def _with_orders(
    state: HistoryState, order: torch.Tensor | None, counts: torch.Tensor | None, file: Path
) -> HistoryState:
    """``state`` with the arrival orders the file holds (none: as it is); ValueError naming ``file`` where they do not
    fit its groups."""
    if order is None and counts is None:
        return state
    if order is None or counts is None:
        raise ValueError(f"{file}: 'order' and 'order_counts' come together, found only one of them")
    for name, tensor in (("order", order), ("order_counts", counts)):
        if tensor.dtype != torch.int64 or tensor.dim() != 1:
            raise ValueError(f"{file}: {name} must be a 1-D int64 tensor, got {tensor.dtype} {tuple(tensor.shape)}")
    sizes, flat = counts.tolist(), order.tolist()
    if any(n < 0 for n in sizes) or 3 * sum(sizes) != len(flat):
        raise ValueError(f"{file}: order_counts name {sum(sizes)} triples, order holds {len(flat) / 3:g}")
    orders, at = [], 0
    for n in sizes:
        orders.append([tuple(flat[at + 3 * j : at + 3 * j + 3]) for j in range(n)])
        at += 3 * n
    try:
        return HistoryState(state.groups, orders)
    except ValueError as err:
        raise ValueError(f"{file}: {err}") from None


def _state(tokens: torch.Tensor, layout: torch.Tensor, vocab_size: int, file: Path) -> HistoryState:
    """The groups that ``layout`` cuts ``tokens`` into; ValueError naming ``file`` where they disagree."""
    for name, tensor in (("tokens", tokens), ("layout", layout)):
        if tensor.dtype != torch.int64 or tensor.dim() != 1:
            raise ValueError(f"{file}: {name} must be a 1-D int64 tensor, got {tensor.dtype} {tuple(tensor.shape)}")
    if bool((layout < 0).any()):
        raise ValueError(f"{file}: lengths must be >= 0")
    outside = tokens[(tokens < 0) | (tokens >= vocab_size)]
    if outside.numel():
        raise ValueError(
            f"{file}: token ids must lie in [0, {vocab_size}) (the policy's vocabulary), found {outside[:5].tolist()}"
        )
    flat, sizes = tokens.tolist(), layout.tolist()
    groups: list[tuple[list[int], list[list[int]]]] = []
    at = read = 0
    while read < len(sizes):
        if read + 2 > len(sizes) or read + 2 + sizes[read + 1] > len(sizes):
            raise ValueError(f"{file}: layout is cut short (the group at entry {read} runs past its end)")
        if sizes[read] < 1:
            raise ValueError(f"{file}: the group at layout entry {read} has an empty prompt")
        prompt_len, count = sizes[read], sizes[read + 1]
        lengths = sizes[read + 2 : read + 2 + count]
        read += 2 + count
        if at + prompt_len + sum(lengths) > len(flat):
            raise ValueError(f"{file}: layout names more tokens than the {len(flat)} stored")
        prompt, at = flat[at : at + prompt_len], at + prompt_len
        responses = []
        for length in lengths:
            responses.append(flat[at : at + length])
            at += length
        groups.append((prompt, responses))
    if at != len(flat):
        raise ValueError(f"{file}: layout covers {at} of the {len(flat)} tokens stored")
    try:
        return HistoryState(groups)
    except ValueError as err:
        raise ValueError(f"{file}: {err}") from None
