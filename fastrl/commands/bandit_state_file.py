"""A bandit's state in a JSON file that one `fastrl generate` run leaves for the next (``bandit_state=FILE``): the
calibration, per-depth acceptance and round times it learned, so the next run starts from them instead of exploring
again (what an RL run's rollout workers carry between rollouts)."""

from __future__ import annotations

import json
from pathlib import Path

from fastrl.adaptive.bandit import BanditSelector, check_state_version
from fastrl.adaptive.bandit_config import BanditConfig
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
    try:
        check_state_version(state)
    except ValueError as err:
        raise ValueError(f"{key}={path}: {err}; remove the file or name another") from None
    missing = [k for k in ("acceptance", "times") if k not in state]
    if missing:
        raise ValueError(f"{key}={path}: a bandit state without {missing}; remove the file or name another")
    try:  # loaded into a bandit of its own config, every arm predicted: what a run would do with it
        probe = BanditSelector(BanditConfig.from_dict(state["config"]))
        probe.warm_start(state)
        for arm in probe.strategies:
            probe.predict(arm, 1)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, ZeroDivisionError) as err:
        raise ValueError(
            f"{key}={path}: a damaged bandit state ({type(err).__name__}: {err}); remove the file or name another"
        ) from None
    return state


def write_state_file(target: OutputTarget, selector: BanditSelector) -> None:
    """Save ``selector``'s state to ``target`` through a temporary file renamed into place."""
    write_atomic(target.path, json.dumps(selector.state_dict(), sort_keys=True) + "\n")
