"""Seeds derived from (run seed, step, index, ...) and the global RNG states a checkpoint keeps.

Every random choice of a GRPO step (which problems, each sample's sampling seed, the order of mini-batches) is
drawn from a seed derived from the run seed and the step, never from a generator carried across steps. A run
is therefore reproducible, and a resumed run continues exactly like an uninterrupted one without replaying
anything.
"""

from __future__ import annotations

import hashlib
import random
import struct
from dataclasses import dataclass, field

import torch

SEED_MODULUS = 2**63  # request seeds live in [0, 2**63) (fastrl.sampling.params.MAX_SEED)

# Streams: the first component after the run seed, so seeds of different purposes never collide.
PROMPT_STREAM = 1
SAMPLE_STREAM = 2
SHUFFLE_STREAM = 3
ACCEPT_STREAM = 4  # train-drafter's held-out accept-length requests


def derive_seed(*parts: int) -> int:
    """A seed in [0, 2**63) that is a pure function of the integers `parts` (stable across processes and
    platforms, unlike `hash`)."""
    data = b"".join(struct.pack("<q", int(p) % SEED_MODULUS) for p in parts)
    digest = hashlib.blake2b(data, digest_size=8, person=b"fastrl-grpo").digest()
    return int.from_bytes(digest, "little") % SEED_MODULUS


def step_rng(seed: int, step: int) -> random.Random:
    """The Python RNG that picks the problems of `step`."""
    return random.Random(derive_seed(seed, PROMPT_STREAM, step))


def sample_seed(seed: int, step: int, group: int, index: int) -> int:
    """The sampling seed of sample `index` of prompt `group` at `step`."""
    return derive_seed(seed, SAMPLE_STREAM, step, group, index)


def shuffle_generator(seed: int, step: int, epoch: int) -> torch.Generator:
    """The torch generator that orders the sequences of (`step`, `epoch`) into mini-batches."""
    return torch.Generator().manual_seed(derive_seed(seed, SHUFFLE_STREAM, step, epoch))


@dataclass
class GlobalRngState:
    """The process-wide RNG states (Python `random`, torch CPU and CUDA) saved with a checkpoint.

    The trainer draws nothing from them (it derives its seeds), but user code around it (tasks, models with
    dropout) may, so a checkpoint restores them too.
    """

    python: list
    torch_cpu: torch.Tensor  # [n] uint8
    torch_cuda: list[torch.Tensor] = field(default_factory=list)  # one [m] uint8 per device; empty without CUDA

    @classmethod
    def capture(cls) -> GlobalRngState:
        """The current states."""
        version, internal, gauss_next = random.getstate()
        cuda = [s.clone() for s in torch.cuda.get_rng_state_all()] if torch.cuda.is_available() else []
        return cls(
            python=[version, list(internal), gauss_next], torch_cpu=torch.get_rng_state().clone(), torch_cuda=cuda
        )

    def restore(self) -> None:
        """Install these states."""
        version, internal, gauss_next = self.python
        random.setstate((version, tuple(internal), gauss_next))
        torch.set_rng_state(self.torch_cpu.to(torch.uint8))
        if self.torch_cuda and torch.cuda.is_available():
            torch.cuda.set_rng_state_all([s.to(torch.uint8) for s in self.torch_cuda])
