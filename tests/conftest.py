"""Shared test configuration: GPU tests are skipped where no CUDA device exists."""

import pytest
import torch

# Tests run tiny models on a 2-core machine: one intra-op thread avoids thread hand-off costs per small op.
torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
