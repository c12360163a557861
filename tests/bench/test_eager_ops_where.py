"""The eager-ops bench names the line of fastrl that dispatched each op (what to move into a graph next)."""

from __future__ import annotations

import collections

import torch

from fastrl.bench.eager_ops import OpCounter, print_lines
from fastrl.engine.finish import finish_rows


def test_ops_are_attributed_to_the_fastrl_line_that_made_them(capsys):
    tokens, logprobs = torch.tensor([[5, 2]]), torch.tensor([[-0.1, -0.2]])
    stop = torch.tensor([[False, True]])
    args = (tokens, logprobs, torch.tensor([2]), torch.tensor([3]), stop, torch.tensor([9]), 64)
    counter = OpCounter(where=True)
    with counter:
        finish_rows(*args)
        torch.zeros(1).add_(1)  # this test's own op: no fastrl line made it
    files = collections.Counter(line.split(":")[0] for line, _ in counter.lines.elements())
    assert sum(counter.lines.values()) == sum(counter.ops.values()) > 10
    assert files["engine/finish.py"] == sum(counter.lines.values()) - 2  # zeros and add_ are the test's
    assert counter.lines[("(outside fastrl)", "add_")] == 1
    counter.ops.clear()
    plain = OpCounter()
    with plain:
        finish_rows(*args)
    assert not plain.lines and sum(plain.ops.values()) == files["engine/finish.py"]
    print_lines(counter.lines, steps=1)
    out = capsys.readouterr().out
    assert out.startswith(f"  engine/finish.py: {files['engine/finish.py']} a step\n") and " finish_rows: " in out
