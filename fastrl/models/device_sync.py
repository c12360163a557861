"""Waiting for a device's queued work: what a wall-clock timing around device work needs to be honest."""

from __future__ import annotations

import torch


def drain(device: str | torch.device) -> None:
    """Wait for the work queued on ``device`` (a CPU runs its work as it is issued: nothing to wait for)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
