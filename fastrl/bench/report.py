"""Benchmark output: an aligned text table on stdout and a JSON file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fastrl.commands.output_guard import write_atomic


def format_table(headers: list[str], rows: list[list[Any]]) -> str:
    """A plain aligned table (floats with 3 significant decimals)."""

    def cell(v: Any) -> str:
        return f"{v:.3f}" if isinstance(v, float) else str(v)

    text = [[cell(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in text)) for i, h in enumerate(headers)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in text]
    return "\n".join(lines)


def write_json(path: str | Path, payload: Any) -> None:
    """Write a benchmark's results (a dict or a list of records) as indented JSON."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(payload, indent=2) + "\n")  # a failed write never leaves half a file
