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
            obj = _parse_line(data, where)
            if obj is not BLANK:
                lines.append(_prompt_line(obj, where, len(lines), line_no))
    return lines


ARRAY_HINT = "prompts files are JSONL, one JSON object a line"
"""What a JSON array (a list of prompts, on one line or spread over lines) is told."""
BLANK = object()
"""What ``_parse_line`` returns for a blank line (None is a line holding JSON's null)."""


def _parse_line(data: bytes, where: str) -> object:
    """The JSON value of one line of the file (``BLANK``: a blank line); ValueError naming ``where`` (and the
    column) when it is not UTF-8 or not JSON."""
    try:
        raw = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{where}: not valid UTF-8 (byte {exc.start}); prompts files are UTF-8 JSONL") from None
    if not raw.strip():
        return BLANK
    try:
        return json.loads(raw.rstrip("\r\n"))  # an error at the end is at the end of this line, not on the next
    except json.JSONDecodeError as exc:
        at = "" if exc.msg.endswith(" at") else " at"  # "Invalid control character at": the column follows
        hint = f"; it starts a JSON array: {ARRAY_HINT}" if raw.lstrip().startswith("[") else ""
        raise ValueError(f"{where}: not valid JSON ({exc.msg}{at} column {exc.colno}){hint}") from None


def _prompt_line(obj: object, where: str, index: int, line_no: int) -> PromptLine:
    """The prompt line ``obj`` (one line's JSON value) holds; ValueError naming ``where`` and the bad key."""
    if isinstance(obj, list):
        raise ValueError(f"{where}: a JSON array: {ARRAY_HINT}")
    if not isinstance(obj, dict) or sum(key in obj for key in PROMPT_KEYS) != 1:
        got = "" if isinstance(obj, dict) else f"{_json_text(obj)} is not a JSON object: "
        raise ValueError(
            f'{where}: {got}each line needs exactly one of "prompt" (a string), "prompt_ids" (token ids) or '
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
    if "prompt_ids" in obj:
        _check_prompt_ids(ids, where)
    if seed is not None and (not is_int(seed) or not 0 <= seed < 2**63):
        raise ValueError(f'{where}: "seed" must be an integer in [0, 2**63)')
    return PromptLine(index, line_no, prompt, ids, seed, messages)


def _check_prompt_ids(ids: object, where: str) -> None:
    """ValueError naming ``where`` and the first value that is not a token id (an integer >= 0)."""
    if not isinstance(ids, list):
        raise ValueError(f'{where}: "prompt_ids" must be a list of integers >= 0, got {_json_text(ids)}')
    for i, token in enumerate(ids):
        if not _is_token_id(token):
            kind = "a boolean, not an integer" if isinstance(token, bool) else "expected an integer >= 0"
            raise ValueError(f'{where}: "prompt_ids"[{i}] is {_json_text(token)}: {kind}')


def _json_text(value: object, limit: int = 80) -> str:
    """``value`` as the file spells it (JSON: true, null, "text", NaN), cut to ``limit`` characters."""
    text = json.dumps(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _check_messages(messages: object, where: str) -> list[dict[str, str]]:
    """A non-empty list of {"role": str, "content": str} objects, the role not empty. Their roles and other keys
    (name, tool_calls, reasoning_content, ...) are the chat template's to read or refuse: templates differ in what
    they take (developer, ipython, function roles), and a refusal is named with the line."""
    if not isinstance(messages, list) or not messages:
        raise ValueError(f'{where}: "messages" must be a non-empty list of {{"role": ..., "content": ...}} objects')
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise ValueError(f'{where}: "messages"[{i}] must be an object with "role" and "content"')
        for key in ("role", "content"):
            if not isinstance(message.get(key), str):
                raise ValueError(f'{where}: "messages"[{i}].{key} must be a string')
        if not message["role"].strip():
            raise ValueError(f'{where}: "messages"[{i}].role is empty')
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
