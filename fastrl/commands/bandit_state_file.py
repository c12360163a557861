"""A bandit's state in a JSON file that one `fastrl generate` run leaves for the next (``bandit_state=FILE``): the
calibration, per-depth acceptance and round times it learned, so the next run starts from them instead of exploring
again (what an RL run's rollout workers carry between rollouts)."""

from __future__ import annotations

import json
from pathlib import Path

from fastrl.adaptive.bandit import STATE_VERSION, BanditSelector
from fastrl.commands.output_guard import OutputTarget, write_atomic


def read_state_file(key: str, path: Path) -> dict | None:
    """The state saved at ``path``; None when there is none yet (no file, or an empty one). A file that is not a
    bandit state of this version is a ValueError naming ``key`` (the file is left as it is)."""
    if not path.exists() or path.stat().st_size == 0:
        return None
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{key}={path}: not a bandit state JSON file ({err}); remove it or name another") from None
    version = state.get("version") if isinstance(state, dict) else None
    missing = [k for k in ("acceptance", "times") if not isinstance(state, dict) or k not in state]
    if version != STATE_VERSION or missing:
        raise ValueError(
            f"{key}={path}: a bandit state of version {version!r} (missing {missing or 'nothing'}); this fastrl "
            f"reads version {STATE_VERSION}: remove the file or name another"
        )
    return state


def write_state_file(target: OutputTarget, selector: BanditSelector) -> None:
    """Save ``selector``'s state to ``target`` through a temporary file renamed into place."""
    write_atomic(target.path, json.dumps(selector.state_dict(), sort_keys=True) + "\n")
