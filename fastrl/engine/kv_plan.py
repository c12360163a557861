"""The memory an engine is about to take for its KV pool, checked before any of it is taken.

An engine's pool is sized by ``engine.max_batch_size`` x ``engine.max_model_len`` (the default: every slot's whole
context, on a CPU mapped only as it is written) or by ``engine.kv_cache_tokens`` (a pool meant to be filled). A size
the machine cannot hold should be one ValueError naming those keys, raised before the caller's modules move, not a
bare MemoryError, an allocator's RuntimeError, or a host swapping its way through a page list of billions.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from fastrl.engine.machine import available_bytes
from fastrl.models.kv_cache import KvShape

# Host bytes the pool's bookkeeping takes per page (free list, free set, reference count), rounded up: what a
# page costs before any KV is written to it; and per page-table entry (the table and its default, int64 each).
BOOKKEEPING_BYTES_PER_PAGE = 128
TABLE_BYTES_PER_ENTRY = 16


@dataclass(frozen=True)
class KvPlan:
    """The pool an engine will allocate: `num_pages` pool pages of `page_size` entries plus `scratch_pages` per
    slot, a page table of `columns` per slot, for each of `caches` (the policy's, the drafter's), in `dtype` on
    `device`. `kv_cache_tokens` says whether the pool's size was asked for (None: the default pool of every slot's
    context)."""

    slots: int
    num_pages: int
    scratch_pages: int
    columns: int
    page_size: int
    caches: tuple[KvShape, ...]
    dtype: torch.dtype
    device: torch.device
    kv_cache_tokens: int | None

    @property
    def total_pages(self) -> int:
        return self.num_pages + self.slots * self.scratch_pages

    @property
    def kv_bytes(self) -> int:
        """Bytes of K and V over every page of every cache."""
        per_entry = sum(c.entry_bytes(self.dtype) for c in self.caches)
        return per_entry * self.page_size * self.total_pages

    def needed_bytes(self, incoming: int = 0) -> int:
        """What must be free: the bookkeeping, the KV wherever it is held at once (a CUDA device holds its pool
        from the start; a CPU pool asked for by size is meant to be filled), and `incoming` bytes of modules about
        to move to the device (negative: the modules there shrink to the engine's dtype, and give bytes back)."""
        held = self.device.type == "cuda" or self.kv_cache_tokens is not None
        bookkeeping = self.num_pages * BOOKKEEPING_BYTES_PER_PAGE + self.slots * self.columns * TABLE_BYTES_PER_ENTRY
        return bookkeeping + (self.kv_bytes if held else 0) + incoming

    @property
    def keys(self) -> str:
        """The keys that size this pool, as an error names them."""
        slots = f"engine.max_batch_size ({self.slots:,} slots) or engine.max_model_len"
        if self.kv_cache_tokens is not None:
            return f"engine.kv_cache_tokens ({self.kv_cache_tokens:,}), {slots}"
        return slots

    def describe(self) -> str:
        return (
            f"a KV pool of {self.total_pages:,} pages of {self.page_size} entries ({self.kv_bytes / 2**30:.2f} GiB "
            f"of {self.dtype} on {self.device}, {self.slots:,} slots)"
        )

    def check(self, incoming: int = 0) -> None:
        """ValueError naming the sizing keys when the pool (and `incoming` module bytes) cannot fit what is free."""
        free = available_bytes(self.device)
        need = self.needed_bytes(incoming)
        if free is not None and need > free:
            moving = ""
            if incoming > 0:
                moving = f" and {incoming / 2**30:.2f} GiB of weights moving there"
            elif incoming < 0:
                moving = f" (less {-incoming / 2**30:.2f} GiB the weights there give back in {self.dtype})"
            raise ValueError(
                f"{self.describe()}{moving} needs {need / 2**30:.2f} GiB, but {free / 2**30:.2f} GiB is free on "
                f"{self.device}: lower {self.keys}"
            )

    @contextmanager
    def allocating(self) -> Iterator[None]:
        """Turns an allocation that fails in the block (the host's or the device's) into the same ValueError."""
        try:
            yield
        except (MemoryError, OverflowError, torch.OutOfMemoryError) as err:
            raise self._refused(err) from err
        except (OSError, RuntimeError) as err:
            if not _allocation_failure(err):
                raise
            raise self._refused(err) from err

    def _refused(self, err: BaseException) -> ValueError:
        return ValueError(f"{self.describe()} could not be allocated ({type(err).__name__}: {err}): lower {self.keys}")


def _allocation_failure(err: BaseException) -> bool:
    """An OSError or RuntimeError that says memory could not be had (mmap's ENOMEM, the CPU allocator's refusal)."""
    text = str(err).lower()
    return "alloc" in text or "out of memory" in text or getattr(err, "errno", None) == 12


def incoming_bytes(modules: list[torch.nn.Module | None], device: torch.device, dtype: torch.dtype) -> int:
    """The net change of `device`'s memory when the modules' tensors move there in `dtype` (``nn.Module.to``):
    a tensor elsewhere adds its size in `dtype`; one already there adds its size in `dtype` less its size now
    (negative when it shrinks, as a float32 policy on the GPU cast to a bfloat16 engine's dtype). Non-floating
    tensors keep their dtype. 0 for a CPU device (the host's memory is not counted against its weights). A tensor
    two modules share counts once."""
    if device.type == "cpu":
        return 0
    seen: set[int] = set()
    moves: list[TensorMove] = []
    for module in modules:
        if module is None:
            continue
        for tensor in [*module.parameters(), *module.buffers()]:
            if id(tensor) in seen:
                continue
            seen.add(id(tensor))
            there = tensor.device.type == device.type and (device.index is None or tensor.device.index == device.index)
            moves.append(TensorMove(there, tensor.numel(), tensor.element_size(), tensor.is_floating_point()))
    return net_bytes(moves, dtype.itemsize)


@dataclass(frozen=True)
class TensorMove:
    """One tensor about to move: whether it is on the target device already, its elements, its bytes per element
    now, and whether it is floating (cast to the engine's dtype) or not (kept in its own)."""

    on_target: bool
    numel: int
    itemsize: int
    is_float: bool


def net_bytes(moves: Iterable[TensorMove], target_itemsize: int) -> int:
    """The target device's net change in bytes when `moves` land there, floating tensors at `target_itemsize`
    bytes per element: what arrives counts whole, what is there already counts its growth (or, negative, its
    shrinking)."""
    total = 0
    for move in moves:
        after = move.numel * (target_itemsize if move.is_float else move.itemsize)
        total += after - move.numel * move.itemsize if move.on_target else after
    return total
