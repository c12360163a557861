"""`fastrl train`'s command line in the user's words: a config-group option that does not exist is one error with
the valid choices and the right spelling, ``model=DIR`` works as for `fastrl generate`, and errors raised deep
inside (``rollout.worker.strategy``, ``GRPOConfig.steps``) name the key the user types (``strategy.name``,
``rl.steps``)."""

from __future__ import annotations

import difflib
import re
from pathlib import Path

from fastrl.commands.train_config import parses_as_strategy
from fastrl.config_compose import UnknownKeyError, key_start
from fastrl.models.named import is_named_model

# Internal key names in error messages -> the keys of `fastrl train` (the most specific first).
USER_KEYS = (
    ("strategy selector", "strategy.name"),
    ("rollout.worker.strategy", "strategy.name"),
    ("rollout.worker.model_dir", "model.path"),
    ("rollout.worker.drafter_dir", "drafter.path"),
    ("rollout.worker.torch_threads", "rollout.torch_threads"),
    ("rollout.worker.buffer_tokens", "drafter.buffer_tokens"),
    ("rollout.worker.retention_versions", "drafter.retention_versions"),
    ("rollout.worker.recency_decay", "drafter.recency_decay"),
    ("rollout.worker.slice_seconds", "drafter.slice_seconds"),
    ("rollout.worker.cotrain", "drafter.cotrain"),
)  # the nested configs' own names for their keys (GRPOConfig.steps, engine.page_size): in_schema_words


def in_user_words(message: str) -> str:
    """``message`` with internal key names replaced by the keys of `fastrl train` (a name only where it starts a key:
    ``rollout.engine.x`` is left as it is)."""
    for internal, user in USER_KEYS:
        message = re.sub(key_start(internal), user, message)
    return message


def in_user_words_error(err: ValueError) -> ValueError:
    """The error as `fastrl train` shows it: an unknown key as the user typed it, any other with internal key
    names in the user's words (``in_user_words``)."""
    return err if isinstance(err, UnknownKeyError) else ValueError(in_user_words(str(err)))


def group_options(config_dir: Path, group: str) -> list[str]:
    """The options of config group ``group`` (its YAML files), sorted."""
    return sorted(p.stem for p in (config_dir / group).glob("*.yaml"))


def check_groups(config_dir: Path, overrides: list[str]) -> list[str]:
    """The overrides with every config-group choice checked (``-m`` sweeps value by value); ``model=DIR`` (a
    directory or a named model such as smollm2, not an option of the model group) becomes ``model=local
    model.path=DIR``. ValueError with the valid choices and, where the mistake is a known one, the right spelling."""
    groups = {p.name for p in config_dir.iterdir() if p.is_dir()}
    out: list[str] = []
    for item in overrides:
        key, sep, value = item.partition("=")
        group = key.lstrip("+~")
        if not sep or group not in groups:
            out.append(item)
            continue
        options = group_options(config_dir, group)
        if all(v in options for v in value.split(",")):
            out.append(item)
        elif group == "model" and "," not in value and (Path(value).is_dir() or is_named_model(value)):
            out += ["model=local", f"model.path={value}"]
        else:
            wrong = next(v for v in value.split(",") if v not in options)
            raise ValueError(
                f"{group}={wrong}: no such {group} option; choose one of {options}{_hint(group, wrong, options)}"
            )
    return out


def _hint(group: str, value: str, options: list[str]) -> str:
    """How to say what ``group=value`` probably meant."""
    if group == "strategy":
        spelled = value.replace("-", "_")
        if not parses_as_strategy(spelled):
            return "; a fixed strategy is strategy=static strategy.name=S_K_N (e.g. strategy.name=4_3_10)"
        return f"; a fixed strategy is spelled strategy=static strategy.name={spelled}"
    if group == "model":
        return f"; or a checkpoint directory, model=DIR ({value} is not a directory)"
    close = difflib.get_close_matches(value, options, n=1)
    return f"; did you mean {group}={close[0]}?" if close else ""
