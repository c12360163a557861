"""Reading prompt JSONL files and writing generation results."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class PromptLine:
    """One input line: text or token ids, and an optional seed."""

    line_no: int
    prompt: str | None
    prompt_ids: list[int] | None
    seed: int | None


def read_prompts(path: str | Path) -> list[PromptLine]:
    """Parse a prompts JSONL file; a malformed line raises ValueError naming the file and line."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"prompts file not found: {path}")
    lines = []
    with path.open() as f:
        for line_no, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            where = f"{path}:{line_no}"
            try:
                obj = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{where}: not valid JSON ({exc.msg})") from exc
            if not isinstance(obj, dict) or ("prompt" in obj) == ("prompt_ids" in obj):
                raise ValueError(f'{where}: each line needs exactly one of "prompt" (a string) or "prompt_ids"')
            prompt, ids, seed = obj.get("prompt"), obj.get("prompt_ids"), obj.get("seed")
            if prompt is not None and not isinstance(prompt, str):
                raise ValueError(f'{where}: "prompt" must be a string')
            if ids is not None and not (isinstance(ids, list) and all(isinstance(t, int) for t in ids)):
                raise ValueError(f'{where}: "prompt_ids" must be a list of integers')
            if seed is not None and (not isinstance(seed, int) or not 0 <= seed < 2**63):
                raise ValueError(f'{where}: "seed" must be an integer in [0, 2**63)')
            lines.append(PromptLine(line_no, prompt, ids, seed))
    return lines


def write_jsonl(path: str | Path, records: list[dict[str, Any]]) -> None:
    """Write records atomically (a temporary file renamed into place), so a failure leaves no partial output."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w") as f:
        for record in records:
            f.write(json.dumps(record) + "\n")
    os.replace(tmp, path)
