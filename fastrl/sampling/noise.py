"""Counter-based noise: a pure function of (seed, position, vocab index, stream).

Every random number fastrl uses while decoding comes from here, so a request's tokens depend only on its own
seed and the absolute positions it samples at, never on the batch, the device or the order of calls.

The hash works on 32-bit words held in int64 tensors. Every intermediate value stays below 2**63: words are
< 2**32, the two multipliers are < 2**30 (so products are < 2**62), sums of two words are < 2**33, and right
shifts only ever see non-negative values. Integer results are therefore bit-identical on CPU and CUDA.

    row key:   two 32-bit lanes, each absorbing (stream, seed_lo, seed_hi, pos_lo, pos_hi) with its own salt
    element:   h = mix(mix(lane_a ^ mix(index ^ SALT_INDEX)) + lane_b)
    uniform:   u = ((h >> 8) + 0.5) / 2**24         in (0, 1), exact in float64
    gumbel:    g = -log(-log(u))                    computed in float64, returned as float32

Over the [N, V] grid the same words are computed in int32 holding each word's bit pattern (`_words32`): the
multiplications wrap modulo 2**32, right shifts are made logical by a mask, and the buffers are reused in place,
which halves the memory every op touches; `tests/sampling/test_gumbel_noise.py` checks them bit for bit against a
pure-Python reference.

Uniforms are returned as float64 because 24-bit uniforms of the form (x + 0.5) / 2**24 are not all
representable in float32 (the largest would round to 1.0). The Gumbel values are computed in float64 and rounded
once to float32, so a last-bit difference between CPU and CUDA ``log`` almost never reaches the float32 result.
"""

from __future__ import annotations

import functools

import torch

from fastrl.sampling.cpu_noise import uniform_bits_kernel

MASK32 = 0xFFFFFFFF
MUL_A = 0x2C1B3C6D  # odd, < 2**30: x * MUL_A < 2**62 for any 32-bit x
MUL_B = 0x297A2D39  # odd, < 2**30
SHIFT_1, SHIFT_2, SHIFT_3 = 15, 12, 15
SALT_LANE_A = 0x9E3779B9
SALT_LANE_B = 0x85EBCA6B
SALT_INDEX = 0xC2B2AE35
UNIFORM_BITS = 24

# Streams: independent noise families over the same (seed, position, index) space.
SAMPLE_STREAM = 0  # the token sampler (policy and drafter)
CLASSIC_ACCEPT_STREAM = 1  # classic verifier: accept/reject uniforms
CLASSIC_RESAMPLE_STREAM = 2  # classic verifier: resampling from the residual or the bonus distribution
MAX_STREAM = 2**32


def mix32_int(x: int) -> int:
    """The 32-bit bijective mixer on a Python int (used for per-call constants)."""
    x &= MASK32
    x ^= x >> SHIFT_1
    x = (x * MUL_A) & MASK32
    x ^= x >> SHIFT_2
    x = (x * MUL_B) & MASK32
    x ^= x >> SHIFT_3
    return x


def _mix32(x: torch.Tensor) -> torch.Tensor:
    # [*] int64 in [0, 2**32) -> [*] int64 in [0, 2**32); bijective on 32-bit words
    x = x ^ (x >> SHIFT_1)
    x.mul_(MUL_A).bitwise_and_(MASK32)
    x.bitwise_xor_(x >> SHIFT_2)
    x.mul_(MUL_B).bitwise_and_(MASK32)
    x.bitwise_xor_(x >> SHIFT_3)
    return x


def lane_salts(stream: int) -> tuple[int, int]:
    """The two row lanes' starting salts for ``stream`` (Python ints: no host copy inside a CUDA graph)."""
    return mix32_int(SALT_LANE_A ^ stream), mix32_int(SALT_LANE_B ^ stream)


def _row_lanes(seeds: torch.Tensor, positions: torch.Tensor, stream: int) -> torch.Tensor:
    # [N] int64, [N] int64 -> [2, N] int64 32-bit lanes (lane a, lane b), both lanes computed at once
    words = (
        seeds & MASK32,
        (seeds >> 32) & MASK32,  # the mask makes this the high word whatever the shift does with a sign bit
        positions & MASK32,
        (positions >> 32) & MASK32,
    )
    salts = lane_salts(stream)
    lanes = _mix32(torch.stack([words[0] ^ salt for salt in salts]))  # scalars: no host copy (CUDA graphs)
    for word in words[1:]:
        lanes = _mix32(lanes ^ word)
    return lanes


def _as_int32(words: torch.Tensor) -> torch.Tensor:
    # [*] int64 in [0, 2**32) -> [*] int32 with the same 32-bit pattern
    return (words - ((words >> 31) << 32)).to(torch.int32)


def _mix32_words_(x: torch.Tensor, tmp: torch.Tensor) -> torch.Tensor:
    # [*] int32 bit patterns, in place (tmp: a buffer of the same shape) -> x = mix32(x); what _mix32 computes
    for shift, mul in ((SHIFT_1, MUL_A), (SHIFT_2, MUL_B)):
        torch.bitwise_right_shift(x, shift, out=tmp).bitwise_and_((1 << (32 - shift)) - 1)  # logical shift
        x.bitwise_xor_(tmp).mul_(mul)  # int32 products wrap modulo 2**32
    torch.bitwise_right_shift(x, SHIFT_3, out=tmp).bitwise_and_((1 << (32 - SHIFT_3)) - 1)
    return x.bitwise_xor_(tmp)


def _index_key(vocab_size: int, device: torch.device) -> torch.Tensor:
    # -> [V] int32: mix32(index ^ SALT_INDEX), the per-column half of every element's hash
    return _as_int32(_mix32(torch.arange(vocab_size, device=device, dtype=torch.int64) ^ SALT_INDEX))


@functools.lru_cache(maxsize=8)
def _cpu_index_key(vocab_size: int) -> torch.Tensor:
    # -> [V] int32, computed once per vocabulary size on the CPU (read only: callers never write it). Not cached
    # on other devices, where the first call may happen inside a CUDA-graph capture.
    return _index_key(vocab_size, torch.device("cpu"))


def _checked(
    seeds: torch.Tensor, positions: torch.Tensor, vocab_size: int, device: torch.device | str | None, stream: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The arguments of every hash checked (ValueError naming the first bad one), seeds and positions as int64 on
    ``device`` (``seeds.device`` when None).  # [N], [N] -> [N], [N]"""
    if seeds.dim() != 1 or positions.shape != seeds.shape:
        raise ValueError(
            f"seeds and positions must both be 1-D of equal length, got {seeds.shape} and {positions.shape}"
        )
    if not 0 <= stream < MAX_STREAM:
        raise ValueError(f"stream must be an integer in [0, 2**32), got {stream}")
    if vocab_size < 1:
        raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
    device = seeds.device if device is None else torch.device(device)
    return seeds.to(device=device, dtype=torch.int64), positions.to(device=device, dtype=torch.int64)


def _words32(
    seeds: torch.Tensor, positions: torch.Tensor, vocab_size: int, stream: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The hash of every (row, vocab index) as int32 bit patterns, and a spare buffer of the same shape; seeds and
    positions as ``_checked`` gives them, on the device to compute on.

    # [N], [N] -> [N, V] int32, [N, V] int32 (scratch)
    """
    device = seeds.device
    lanes = _as_int32(_row_lanes(seeds, positions, stream))
    index_key = _cpu_index_key(vocab_size) if device.type == "cpu" else _index_key(vocab_size, device)
    h = torch.bitwise_xor(lanes[0].unsqueeze(1), index_key.unsqueeze(0))
    tmp = torch.empty_like(h)
    _mix32_words_(h, tmp)
    h.add_(lanes[1].unsqueeze(1))  # wraps modulo 2**32
    return _mix32_words_(h, tmp), tmp


def _uniform_bits(words: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    # [N, V] int32 bit patterns -> out = the top UNIFORM_BITS bits of each word, as non-negative int32
    torch.bitwise_right_shift(words, 32 - UNIFORM_BITS, out=out)
    return out.bitwise_and_((1 << UNIFORM_BITS) - 1)


def hash_bits(
    seeds: torch.Tensor,
    positions: torch.Tensor,
    vocab_size: int,
    device: torch.device | str | None = None,
    stream: int = 0,
) -> torch.Tensor:
    """32 random bits for every (row, vocab index): int64 values in [0, 2**32).

    Args:
        seeds: [N] int64 request seeds in [0, 2**63).
        positions: [N] int64 absolute positions (index in the prompt + response sequence) being sampled.
        vocab_size: number of columns V.
        device: where to compute; defaults to ``seeds.device``.
        stream: an independent noise family, an int in [0, 2**32) (see the ``*_STREAM`` constants).
    """
    # [N], [N] -> [N, V] int64
    words, _ = _words32(*_checked(seeds, positions, vocab_size, device, stream), vocab_size, stream)
    return words.to(torch.int64).bitwise_and_(MASK32)


def uniform_bits(
    seeds: torch.Tensor,
    positions: torch.Tensor,
    vocab_size: int,
    device: torch.device | str | None = None,
    stream: int = 0,
) -> torch.Tensor:
    """The uniforms' 24-bit integers h >> 8, as int32 in [0, 2**24): ``u = (bits + 0.5) / 2**24``.

    Same arguments as :func:`hash_bits`. An element's uniform and Gumbel value are monotone non-decreasing
    functions of these bits, which the lazy Gumbel-argmax (`sampling/gumbel_argmax.py`) uses to bound values it
    does not compute. On a CPU the bits come from one C++ pass (`fastrl.sampling.cpu_noise`), equal to these ops'.
    """
    # [N], [N] -> [N, V] int32
    seeds, positions = _checked(seeds, positions, vocab_size, device, stream)
    if seeds.device.type == "cpu" and (kernel := uniform_bits_kernel()) is not None:
        return kernel(seeds, positions, vocab_size, lane_salts(stream))
    return _uniform_bits(*_words32(seeds, positions, vocab_size, stream))


def uniform_bits_torch(seeds: torch.Tensor, positions: torch.Tensor, vocab_size: int, stream: int = 0) -> torch.Tensor:
    """:func:`uniform_bits` in PyTorch's ops, on ``seeds``' device (what a GPU runs, and the CPU without the
    kernel).  # [N], [N] -> [N, V] int32"""
    return _uniform_bits(*_words32(*_checked(seeds, positions, vocab_size, None, stream), vocab_size, stream))


def uniform_from_bits(bits: torch.Tensor) -> torch.Tensor:
    """``(bits + 0.5) / 2**24`` in (0, 1), exact in float64.  # [*] int32 in [0, 2**24) -> [*] float64"""
    return bits.to(torch.float64).add_(0.5).mul_(2.0**-UNIFORM_BITS)


def gumbel_from_bits(bits: torch.Tensor) -> torch.Tensor:
    """``-log(-log(u))`` of the uniforms of :func:`uniform_bits`, in float64, rounded once to float32.

    An element's value does not depend on the tensor it is computed in (its shape, the other elements), which
    the lazy Gumbel-argmax relies on (`tests/sampling/test_gumbel_argmax.py`).  # [*] int32 -> [*] float32
    """
    return uniform_from_bits(bits).log_().neg_().log_().neg_().to(torch.float32)


def uniform_noise(
    seeds: torch.Tensor,
    positions: torch.Tensor,
    vocab_size: int,
    device: torch.device | str | None = None,
    stream: int = 0,
) -> torch.Tensor:
    """Uniforms in (0, 1) on a 2**-24 grid, ((h >> 8) + 0.5) / 2**24, as exact float64.

    Same arguments as :func:`hash_bits`; the same (seed, position, index, stream) always gives the same value.
    """
    # [N], [N] -> [N, V] float64
    return uniform_from_bits(uniform_bits(seeds, positions, vocab_size, device=device, stream=stream))


def gumbel_noise(
    seeds: torch.Tensor,
    positions: torch.Tensor,
    vocab_size: int,
    device: torch.device | str | None = None,
    stream: int = 0,
) -> torch.Tensor:
    """Standard Gumbel noise -log(-log(u)) from :func:`uniform_noise`, as float32.

    ``argmax(log_probs + gumbel_noise(...))`` is an exact sample from ``softmax(log_probs)`` up to the 2**-24
    grid of u; the values are finite, between about -2.9 and 17.3. What the grid costs, computed exactly over all
    2**24 values: a token more than ~20.2 below a row's best is never drawn, and one 15-20 below is drawn less
    often than its probability (a 32000-token row with one token 19 above the rest draws the rest 9.3e-6 of the
    time, against softmax's 1.8e-4); ties at the grid go to the lower index (a flat 32000-token row: the first
    token 1.00095 / V, the last 0.99905 / V).
    """
    # [N], [N] -> [N, V] float32
    return gumbel_from_bits(uniform_bits(seeds, positions, vocab_size, device=device, stream=stream))
