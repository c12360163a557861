"""The drafter's forward on a CPU in one call: fastrl's drafter-step kernel (`fastrl/models/kernels/drafter_step.cpp`).

At a few rows a drafter step on a CPU is mostly the overhead of its ~60 small tensor ops and their Python (a bundled
drafter step: ~0.5 ms, of which its eight matrix-vector products are ~0.15 ms). The kernel computes the same forward
(a fused drafter's projection of the policy states, fc over [embed(token) | feature], one Llama layer without an
input norm, the new K/V stored in the drafter's paged cache and attention under the forward's mask, with the CPU
attention kernel's code) reading the weights in place. It takes drafter forwards of at most `MAX_ROWS` new entries
on a cache whose backend is the CPU attention kernel, on float32 and float64 drafters without per-head q/k norms,
outside autograd. Its results match PyTorch's to rounding (tests/speculative/test_cpu_drafter_step.py), not bit for
bit, which exactness does not need: a draft is only a proposal, and the verifier accepts what the policy samples
whatever was drafted.
"""

from __future__ import annotations

import ctypes
import functools
import weakref
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from fastrl.models.attention import AttentionMetadata
from fastrl.models.cpu_attention import PagedCpuAttention
from fastrl.models.kernel_build import load_kernel
from fastrl.models.kv_cache import KVCache

if TYPE_CHECKING:
    from fastrl.models.decoder import CausalLM
    from fastrl.speculative.drafter import EagleDrafter

_P = ctypes.c_void_p
_ARGS = [_P] * 12 + [ctypes.c_double, _P]
_WEIGHTS = 16  # the kernel's Weight enum
# Measured (bundled drafter, one thread): the kernel is 2.1-2.2x PyTorch's forward at 1-4 new entries, 1.2x at 16-32,
# even at 32-48 and 0.76-0.88x from 64 on (where PyTorch's matrix products block for the cache and this kernel
# does not).
MAX_ROWS = 32  # new entries per forward (rows x entries per row) up to which the kernel runs


_Slot = tuple[str, tuple[str, ...], str, tuple[int, ...]]
"""A kernel weight: (root, "policy" or "drafter"; the submodule path from it; parameter name; expected shape)."""


def _weight_slots(drafter: EagleDrafter) -> list[_Slot]:
    """The kernel's weights in its Weight order (the fuse's path leads to None for a last-layer drafter)."""
    c = drafter.config
    h, q, kv, inter = (
        c.hidden_size,
        c.num_attention_heads * c.head_dim,
        c.num_key_value_heads * c.head_dim,
        c.intermediate_size,
    )
    attn, mlp = ("layer", "self_attn"), ("layer", "mlp")
    slots: list[_Slot] = [("policy", ("model", "embed_tokens"), "weight", (c.vocab_size, h))]
    slots.append(("drafter", ("fuse",), "weight", (h, drafter.feature_size)))
    linears = [(("fc",), h, 2 * h), ((*attn, "q_proj"), q, h), ((*attn, "k_proj"), kv, h)]
    linears += [((*attn, "v_proj"), kv, h), ((*attn, "o_proj"), h, q)]
    for path, out, width in linears:
        slots += [("drafter", path, "weight", (out, width)), ("drafter", path, "bias", (out,))]
    slots.append(("drafter", ("layer", "post_attention_layernorm"), "weight", (h,)))
    for name, out, width in (("gate_proj", inter, h), ("up_proj", inter, h), ("down_proj", h, inter)):
        slots.append(("drafter", (*mlp, name), "weight", (out, width)))
    return slots


def _submodule(root: nn.Module, path: tuple[str, ...]) -> nn.Module | None:
    """The submodule at `path` (None where a step of it is absent), read from the modules' registries directly:
    `nn.Module.__getattr__` costs ~1 µs a step, and the binding is checked before every drafter step."""
    module: nn.Module | None = root
    for name in path:
        module = None if module is None else module._modules.get(name)
    return module


@dataclass(frozen=True)
class _Binding:
    """The weight pointers of one drafter (and its policy's embedding) in the kernel's order, with what says they are
    still current (the modules on every slot's path, each slot's tensor and that tensor's address), and whether the
    kernel can read them at all (`usable`: every weight a plain parameter of the drafter's dtype and expected shape,
    contiguous, on the CPU; a bias or the fuse may be absent; a parametrised weight, computed on access, is not
    readable)."""

    pointers: ctypes.Array
    modules: tuple[tuple[str, tuple[str, ...], nn.Module | None], ...]
    """Every distinct (root, path) of the slots, with the module found there."""
    slots: tuple[tuple[nn.Module | None, str, Tensor | None, int], ...]
    """Per slot: its module, parameter name, tensor (None where absent) and address (0 where absent)."""
    usable: bool

    @classmethod
    def of(cls, drafter: EagleDrafter, policy: CausalLM) -> _Binding:
        dtype = drafter.fc.weight.dtype
        roots = {"drafter": drafter, "policy": policy}
        modules = {(root, path): _submodule(roots[root], path) for root, path, _, _ in _weight_slots(drafter)}
        slots, usable = [], True
        for root, path, name, shape in _weight_slots(drafter):
            module = modules[root, path]
            tensor = None if module is None else module._parameters.get(name)
            if module is not None and getattr(module, name, None) is not tensor:  # parametrised: computed on access
                usable = False
            if tensor is None:
                usable &= module is None or name == "bias"  # only the fuse and the biases may be absent
            elif tensor.dtype != dtype or tensor.device.type != "cpu" or tuple(tensor.shape) != shape:
                usable = False
            elif not tensor.is_contiguous():
                usable = False
            slots.append((module, name, tensor, 0 if tensor is None else tensor.data_ptr()))
        pointers = (ctypes.c_void_p * _WEIGHTS)(*(slot[3] for slot in slots))
        found = tuple((root, path, module) for (root, path), module in modules.items())
        return cls(pointers, found, tuple(slots), usable)

    def current(self, drafter: EagleDrafter, policy: CausalLM) -> bool:
        """True while every path leads to the same module, holding the same tensor at the same address."""
        roots = {"drafter": drafter, "policy": policy}
        if any(_submodule(roots[root], path) is not module for root, path, module in self.modules):
            return False
        return all(
            (None if module is None else module._parameters.get(name)) is tensor
            and (tensor is None or tensor.data_ptr() == address)
            for module, name, tensor, address in self.slots
        )


class CpuDrafterStep:
    """Runs an `EagleDrafter`'s forward through the drafter-step kernel where it applies (see the module docstring)."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self._entry = {}
        for dtype, suffix in ((torch.float32, "f32"), (torch.float64, "f64")):
            fn = getattr(library, f"fastrl_drafter_step_{suffix}")
            fn.argtypes, fn.restype = _ARGS, ctypes.c_int
            self._entry[dtype] = fn
        self._bindings: weakref.WeakKeyDictionary[EagleDrafter, _Binding] = weakref.WeakKeyDictionary()

    def _binding(self, drafter: EagleDrafter, policy: CausalLM) -> _Binding:
        """The kernel's weight pointers for this drafter and policy, taken once and retaken when a weight changed
        object or storage (in-place updates, optimiser steps and `load_state_dict` keep them)."""
        bound = self._bindings.get(drafter)
        if bound is None or not bound.current(drafter, policy):
            bound = self._bindings[drafter] = _Binding.of(drafter, policy)
        return bound

    def _checked(self, drafter: EagleDrafter, policy: CausalLM) -> _Binding:
        """The binding `prepare` checked just before (checked again only when there is none)."""
        bound = self._bindings.get(drafter)
        return self._binding(drafter, policy) if bound is None else bound

    def prepare(
        self, drafter: EagleDrafter, policy: CausalLM, cache: KVCache, meta: AttentionMetadata
    ) -> AttentionMetadata | None:
        """`meta` with the kernel plan this forward runs on when it goes to the kernel, else None: at most
        `MAX_ROWS` new entries, a cache whose backend is the CPU attention kernel (its plan, made here too where the
        attention alone would have gone to PyTorch: at a few rows the whole forward still gains), no gradient
        wanted, and the drafter, its policy's embedding and the cache sharing one dtype the kernel has, on a CPU,
        without q/k norms."""
        dtype = drafter.fc.weight.dtype
        backend = getattr(cache, "backend", None)  # a training-time unroll's store has none
        if (
            meta.mask.shape[0] * meta.mask.shape[2] > MAX_ROWS
            or not isinstance(backend, PagedCpuAttention)
            or (torch.is_grad_enabled() and drafter.fc.weight.requires_grad)  # no autograd through the kernel
            or dtype not in self._entry
            or cache.dtype != dtype
            or drafter.layer.input_layernorm is not None
            or drafter.layer.self_attn.q_norm is not None
        ):
            return None
        if not self._binding(drafter, policy).usable:  # every weight (the embedding's too) in `dtype`, on the CPU
            return None
        if meta.kernel is not None:
            return meta
        kernel = backend.kernel_plan(cache, meta)
        return None if kernel is None else replace(meta, kernel=kernel)

    def __call__(
        self,
        drafter: EagleDrafter,
        policy: CausalLM,
        tokens: Tensor,
        features: Tensor,
        positions: Tensor,
        cache: KVCache,
        meta: AttentionMetadata,
    ) -> Tensor:
        """The drafter's output, its new K/V stored (`features`: the drafter's input, [.., H], or a fused drafter's
        policy states, fused here; `meta` as `prepare` gave it, right before: the weights it checked are read).
        # tokens [B,S], features [B,S,F], positions [B,S] -> [B,S,H]"""
        plan = meta.kernel
        if plan is None:
            raise ValueError("CpuDrafterStep runs the metadata `prepare` gives (with a kernel plan)")
        b, s = tokens.shape
        if positions.shape != tokens.shape or features.shape[:-1] != tokens.shape or plan.mask.shape[:3] != (b, 1, s):
            raise ValueError(
                f"CpuDrafterStep: tokens {tuple(tokens.shape)}, positions {tuple(positions.shape)}, features "
                f"{tuple(features.shape)} and mask {tuple(plan.mask.shape)} must share [B,S]"
            )
        config = drafter.config
        dtype = drafter.fc.weight.dtype
        dims = torch.tensor(
            [
                b,
                s,
                config.hidden_size,
                features.shape[-1],
                config.num_attention_heads,
                config.num_key_value_heads,
                config.head_dim,
                config.intermediate_size,
                plan.mask.shape[-1],
                meta.pages.stride(0),
                cache.page_size,
            ]
        )
        tokens = tokens.to(torch.long).contiguous()
        features = features.to(dtype).contiguous()
        positions = positions.to(torch.long).contiguous()
        out = torch.empty(b, s, config.hidden_size, dtype=dtype)
        failed = self._entry[dtype](
            self._checked(drafter, policy).pointers,
            drafter.rotary.inv_freq.data_ptr(),
            dims.data_ptr(),
            tokens.data_ptr(),
            features.data_ptr(),
            positions.data_ptr(),
            meta.write.data_ptr(),
            cache.k[0].data_ptr(),
            cache.v[0].data_ptr(),
            meta.pages.data_ptr(),
            plan.mask.data_ptr(),
            plan.extents.data_ptr(),
            drafter.layer.post_attention_layernorm.eps,
            out.data_ptr(),
        )
        if failed:
            raise RuntimeError(f"drafter step kernel: no instance for head size {config.head_dim}")
        return out


@functools.cache
def cpu_drafter_step() -> CpuDrafterStep | None:
    """The kernel's runner, built on first use; None where it cannot be built (a warning says why)."""
    library = load_kernel("drafter_step")
    return None if library is None else CpuDrafterStep(library)


def drafter_step_for(cache: KVCache) -> CpuDrafterStep | None:
    """The kernel's runner for forwards over `cache`: only a cache the CPU attention kernel serves gets one (so
    nothing is built on a GPU, or for a training-time unroll's store, which has no backend)."""
    return cpu_drafter_step() if isinstance(getattr(cache, "backend", None), PagedCpuAttention) else None
