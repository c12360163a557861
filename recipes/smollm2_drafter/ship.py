"""Copy a trained drafter into the package assets with its weights in bfloat16 (half the size; `load_drafter`
casts them to the policy's dtype).

    python recipes/smollm2_drafter/ship.py DRAFTER_DIR fastrl/assets/smollm2-drafter
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file


def ship(source: Path, target: Path) -> None:
    """Write drafter_config.json, metrics.json, the draft vocabulary (when there is one) and a bfloat16
    drafter.safetensors from `source` to `target`."""
    target.mkdir(parents=True, exist_ok=True)
    for name in ("drafter_config.json", "metrics.json", "draft_vocab.safetensors"):
        if (source / name).is_file():
            shutil.copyfile(source / name, target / name)
    tensors = {k: v.to(torch.bfloat16).contiguous() for k, v in load_file(source / "drafter.safetensors").items()}
    save_file(tensors, str(target / "drafter.safetensors"), metadata={"format": "pt"})
    size = (target / "drafter.safetensors").stat().st_size
    print(f"drafter shipped to {target} ({size / 2**20:.1f} MiB of bfloat16 weights)")


if __name__ == "__main__":
    ship(Path(sys.argv[1]), Path(sys.argv[2]))
