"""Benchmark output: an aligned text table on stdout and the JSON text of the results."""

from __future__ import annotations

import json
from typing import Any


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


def json_text(payload: Any) -> str:
    """A benchmark's results (a dict or a list of records) as indented JSON text."""
    return json.dumps(payload, indent=2) + "\n"
