"""The attention benchmark times both backends over the same pages and reports how far their outputs differ."""

from __future__ import annotations

import json

import pytest
import torch

from fastrl.bench.attention import main, time_case
from fastrl.models.cpu_attention import PagedCpuAttention
from tests.helpers import triton_or_skip


def test_the_cpu_table_compares_the_kernel_with_pytorch(capsys, tmp_path):
    if PagedCpuAttention.load() is None:
        pytest.skip("no C++ compiler: the CPU kernel cannot be built")
    out = tmp_path / "attention.json"
    main(["--repeats", "1", "--json", str(out)])
    printed = capsys.readouterr().out.splitlines()
    cases = json.loads(out.read_text())["cases"]
    assert len(printed) == 1 + len(cases) == 17
    assert all(case["max_abs_diff"] < 1e-4 and case["kernel_ms"] > 0 for case in cases)


def test_the_gpu_kernel_is_timed_against_pytorch_on_the_same_pages():
    triton_or_skip()
    from fastrl.models.gpu_attention import PagedTritonAttention

    device = "cuda" if torch.cuda.is_available() else "cpu"  # on a CPU, in Triton's interpreter
    torch_ms, kernel_ms, diff = time_case(
        "bundled", 3, 4, "long-tail", PagedTritonAttention(), 1, device, torch.float32
    )
    assert torch_ms > 0 and kernel_ms > 0 and diff < 1e-4
