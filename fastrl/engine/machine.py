"""What this machine offers an engine: the torch devices it has and the memory free on them."""

from __future__ import annotations

from pathlib import Path

import torch


def check_device(key: str, device: str | torch.device) -> None:
    """ValueError naming ``key`` when ``device`` is not a torch device this machine has."""
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"{key}={device!r} is not a torch device ({err})") from None
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"{key}={device}: this machine has no CUDA device (torch.cuda.is_available() is False)")
        if parsed.index is not None and parsed.index >= torch.cuda.device_count():
            raise ValueError(f"{key}={device}: only {torch.cuda.device_count()} CUDA devices here")
    elif parsed.type != "cpu":
        raise ValueError(f"{key}={device!r}: fastrl runs on cpu or cuda")


def available_bytes(device: str | torch.device) -> int | None:
    """Memory free now on ``device``: on a CUDA device what the driver has free plus what PyTorch's caching
    allocator holds unused (it hands that out first), else the host's MemAvailable (None where the host does not
    say)."""
    parsed = torch.device(device)
    if parsed.type == "cuda":
        cached = torch.cuda.memory_reserved(parsed) - torch.cuda.memory_allocated(parsed)
        return torch.cuda.mem_get_info(parsed)[0] + cached
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None
