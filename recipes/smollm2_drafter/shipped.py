"""The SmolLM2 policy and its shipped drafter, as the cost scripts of this recipe measure them (one torch thread)."""

from __future__ import annotations

import torch

from fastrl.commands.engine_setup import resolve_drafter, resolve_model_dir
from fastrl.models.checkpoint import load_model
from fastrl.models.decoder import CausalLM
from fastrl.speculative.drafter import EagleDrafter


def load_shipped() -> tuple[CausalLM, EagleDrafter]:
    """(policy, shipped drafter) of `model=smollm2`; exits when the drafter has no draft vocabulary to compare."""
    torch.set_num_threads(1)
    model_dir = resolve_model_dir("smollm2")
    policy = load_model(model_dir).eval()
    drafter = resolve_drafter("", model_dir, policy, needed=True)
    if drafter.draft_vocab is None:
        raise SystemExit("the shipped smollm2 drafter has no draft vocabulary")
    return policy, drafter
