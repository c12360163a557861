"""Writing tensors to safetensors files with the permissions of any other file the user creates."""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import save_file

from fastrl.atomic_files import current_umask

OS_ERROR = re.compile(r"\(os error (\d+)\)")  # how safetensors' Rust side reports a failed write


def save_tensors(tensors: dict[str, torch.Tensor], path: Path | str, metadata: dict[str, str] | None = None) -> None:
    """``save_file`` of safetensors, then the mode ``open()`` would have given the file (0666 less the umask):
    safetensors creates its files 0600, which hides a model or drafter from the other users of a shared run
    directory. A write the operating system refused (a full disk) is the OSError it is, not safetensors' own
    error, so callers that say "no space left" in one line see it."""
    try:
        save_file(tensors, str(path), metadata=metadata)
    except SafetensorError as err:
        code = OS_ERROR.search(str(err))
        if code is None:
            raise
        raise OSError(int(code.group(1)), os.strerror(int(code.group(1))), str(path)) from err
    os.chmod(path, 0o666 & ~current_umask())
