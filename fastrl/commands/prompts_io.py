"""Reading prompt JSONL files (UTF-8 JSON objects, one per line)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from fastrl.json_values import is_int


@dataclass
class PromptLine:
    """One input line: text, token ids or chat messages, and an optional seed. ``index``: its position among the
    prompt lines (blank lines skipped); ``line_no``: its line in the file."""

    index: int
    line_no: int
    prompt: str | None
    prompt_ids: list[int] | None
    seed: int | None
    messages: list[dict[str, str]] | None = None


PROMPT_KEYS = ("prompt", "prompt_ids", "messages")
LINE_KEYS = (*PROMPT_KEYS, "seed")


def prompts_path_problem(path: str | Path) -> str | None:
    """Why ``path`` is no prompts file (a directory, missing), as the end of a sentence naming it; None: a file."""
    if Path(path).is_dir():
        return "is a directory; give a JSONL file (one prompt a line)"
    if Path(path).exists() and not Path(path).is_file():  # a pipe or a device: a run may read its prompts twice
        return "is not a regular file (a pipe or a device); write the prompts to a JSONL file (one prompt a line)"
    if not Path(path).is_file():
        return "is not found; give a JSONL file (one prompt a line)"
    return None


def read_prompts(path: str | Path) -> list[PromptLine]:
    """Parse a prompts JSONL file; a malformed line (or a key a line may not have: a typo such as "sed" would
    otherwise be ignored) raises ValueError naming the file and line."""
    path = Path(path)
    problem = prompts_path_problem(path)
    if problem is not None:
        raise ValueError(f"prompts file {path} {problem}")
    lines: list[PromptLine] = []
    with path.open("rb") as f:
        for line_no, data in enumerate(f, start=1):
            where = f"{path}:{line_no}"
            try:
                raw = data.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ValueError(
                    f"{where}: not valid UTF-8 (byte {exc.start}); prompts files are UTF-8 JSONL"
                ) from None
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{where}: not valid JSON ({exc.msg})") from None
            if not isinstance(obj, dict) or sum(key in obj for key in PROMPT_KEYS) != 1:
                raise ValueError(
                    f'{where}: each line needs exactly one of "prompt" (a string), "prompt_ids" (token ids) or '
                    '"messages" (a chat: [{"role": ..., "content": ...}, ...])'
                )
            unknown = [key for key in obj if key not in LINE_KEYS]
            if unknown:
                raise ValueError(f"{where}: unknown key {unknown[0]!r}; a line has only the keys {list(LINE_KEYS)}")
            prompt, ids, seed = obj.get("prompt"), obj.get("prompt_ids"), obj.get("seed")
            messages = _check_messages(obj["messages"], where) if "messages" in obj else None
            if "prompt" in obj and not isinstance(prompt, str):  # null too: the key is there, its value is not
                raise ValueError(f'{where}: "prompt" must be a string, got {prompt!r}')
            texts = [('"prompt"', prompt)] + [
                (f'"messages"[{i}].{key}', value)
                for i, message in enumerate(messages or [])
                for key, value in message.items()
                if isinstance(value, str)
            ]
            for key, text in texts:
                _check_encodable(text, where, key)
            if "prompt_ids" in obj and not (isinstance(ids, list) and all(_is_token_id(t) for t in ids)):
                raise ValueError(f'{where}: "prompt_ids" must be a list of integers >= 0 (not booleans)')
            if seed is not None and (not is_int(seed) or not 0 <= seed < 2**63):
                raise ValueError(f'{where}: "seed" must be an integer in [0, 2**63)')
            lines.append(PromptLine(len(lines), line_no, prompt, ids, seed, messages))
    return lines


def _check_messages(messages: object, where: str) -> list[dict[str, str]]:
    """A non-empty list of {"role": str, "content": str} objects (other keys are kept for the chat template)."""
    if not isinstance(messages, list) or not messages:
        raise ValueError(f'{where}: "messages" must be a non-empty list of {{"role": ..., "content": ...}} objects')
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise ValueError(f'{where}: "messages"[{i}] must be an object with "role" and "content"')
        for key in ("role", "content"):
            if not isinstance(message.get(key), str):
                raise ValueError(f'{where}: "messages"[{i}].{key} must be a string')
    return messages


def _check_encodable(text: str | None, where: str, key: str) -> None:
    """ValueError naming the line when ``text`` holds a lone surrogate (JSON's "\\ud800" escape decodes to one): no
    tokenizer can encode it (transformers raised a TypeError from deep inside, or it read as the chat template's
    refusal)."""
    if text is None:
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise ValueError(
            f"{where}: {key} holds a lone surrogate ({text[err.start]!r} at character {err.start}), which is not "
            "text: an escape such as \\ud800 without its pair"
        ) from None


def _is_token_id(value: object) -> bool:
    return is_int(value) and value >= 0  # type: ignore[operator]
