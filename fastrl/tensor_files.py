"""Writing tensors to safetensors files with the permissions of any other file the user creates."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from safetensors.torch import save_file


def save_tensors(tensors: dict[str, torch.Tensor], path: Path | str, metadata: dict[str, str] | None = None) -> None:
    """``save_file`` of safetensors, then the mode ``open()`` would have given the file (0666 less the umask):
    safetensors creates its files 0600, which hides a model or drafter from the other users of a shared run
    directory."""
    save_file(tensors, str(path), metadata=metadata)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)
