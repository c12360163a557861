"""Hydra composition of fastrl's command configs (structured configs registered in a ConfigStore)."""

from __future__ import annotations

import difflib
import re
import types
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any, TypeVar, Union, get_args, get_origin, get_type_hints

from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

T = TypeVar("T")
HYDRA_KEYS = ("hydra.", "hydra/")  # Hydra's own settings and config groups (train runs through Hydra's main)


def conf_dir() -> Path:
    """The directory of fastrl's YAML configs."""
    return Path(__file__).resolve().parent / "conf"


def compose_config(name: str, schema: type[T], overrides: list[str], config_dir: Path | None = None) -> T:
    """Compose config `name` from `config_dir` (default: conf/) with command-line `overrides`, validated against
    the dataclass `schema`.

    Unknown keys (also when added with ``+key=``), wrong types and failing dataclass validation raise ValueError
    naming the key.
    """
    if not is_dataclass(schema):
        raise TypeError(f"{schema!r} is not a dataclass")
    check_override_keys(name, schema, overrides)
    store = ConfigStore.instance()
    store.store(name=f"{name}_schema", node=schema)
    overrides = quote_string_overrides(schema, overrides)
    try:
        with initialize_config_dir(config_dir=str(config_dir or conf_dir()), version_base="1.3"):
            cfg = compose(config_name=name, overrides=overrides)
        obj: Any = OmegaConf.to_object(cfg)
    except MissingMandatoryValue as exc:  # OmegaConf's wording names its own types; say what to type
        key = getattr(exc, "full_key", "") or "a key"
        raise ValueError(
            f"`fastrl {name.replace('_', '-')}` needs {key}: give it as {key}=VALUE (see `fastrl "
            f"{name.replace('_', '-')} --help`)"
        ) from None
    except (HydraException, OmegaConfBaseException) as exc:
        raise _bad_config(name, exc) from exc
    return obj


def merge_config(name: str, schema: type, overrides: list[str], config_dir: Path) -> None:
    """ValueError (one line, as ``compose_config`` words it) when Hydra cannot compose config ``name`` of
    ``config_dir`` with ``overrides``: a value of the wrong type, a key it cannot add or append. The values are not
    validated (no dataclass checks, no key required): what a flag that prints the config needs."""
    ConfigStore.instance().store(name=f"{name}_schema", node=schema)
    try:
        with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
            compose(config_name=name, overrides=quote_string_overrides(schema, overrides))
    except (HydraException, OmegaConfBaseException) as exc:
        raise _bad_config(name, exc) from None


def _bad_config(name: str, exc: BaseException) -> ValueError:
    """Hydra's or OmegaConf's composition error of config ``name`` as one line, with what to type where it helps."""
    said = _first_line(exc)
    return ValueError(f"bad config for `fastrl {name.replace('_', '-')}`: {said}{_override_hint(said)}")


def _override_hint(said: str) -> str:
    """What to type instead, for the merge errors whose OmegaConf wording names no fix: a list key given one value
    (``bandit.strategies=3_1_4``), or a key set below a key that holds one value (``strategy.name=bandit`` where
    ``strategy`` is a string)."""
    match = re.search(r"Error merging override ([\w.]+)=(\S*)", said)
    if match is None:
        return ""
    key, value = match.groups()
    if "is not a ListConfig" in said:
        return f"; {key} takes a list: {key}=[{value}]"
    if "Cannot convert" in said and "to string" in said and "." in key:
        parent = key.rsplit(".", 1)[0]
        return f"; {parent} holds one value, not keys below it: {parent}=VALUE"
    return ""


def in_schema_words(message: str, schema: type) -> str:
    """``message`` with a nested config's own name for its keys replaced by the keys as typed on the command line:
    its class name (``BanditConfig.epsilon`` -> ``bandit.epsilon``) or the short name it gives its keys in messages,
    its ``key_prefix`` (``engine.page_size`` -> ``rollout.engine.page_size`` in `fastrl train`). Only for a config
    that sits at one place in ``schema``, and only where the name starts a key (``rollout.engine.x`` stays)."""
    places: dict[str, set[str]] = {}
    for path, kind in _nested_configs(schema, ""):
        for name in {kind.__name__, getattr(kind, "key_prefix", "")} - {""}:
            places.setdefault(name, set()).add(path)
    for name, paths in sorted(places.items(), key=lambda item: -len(item[0])):
        (path,) = paths if len(paths) == 1 else ("",)
        if path and path != name:
            message = re.sub(key_start(f"{name}."), f"{path}.", message)
    return message


def key_start(name: str) -> str:
    """A regular expression matching ``name`` where it starts a key in a message (not inside ``rollout.engine.x`` or
    a longer word)."""
    return rf"(?<![\w.]){re.escape(name)}"


def _nested_configs(schema: type, prefix: str) -> list[tuple[str, type]]:
    """(dotted path, dataclass) of every dataclass field under ``schema``, depth first."""
    hints = get_type_hints(schema)
    found = []
    for item in fields(schema):
        kind = _unwrap_optional(hints.get(item.name))
        if isinstance(kind, type) and is_dataclass(kind):
            path = f"{prefix}{item.name}"
            found += [(path, kind), *_nested_configs(kind, f"{path}.")]
    return found


class UnknownKeyError(ValueError):
    """An override names a key the command does not have. Its message quotes the key as the user typed it, so the
    CLI prints it as it is (``in_schema_words`` would rewrite a typed ``engine.x`` into ``rollout.engine.x``)."""


def check_override_keys(command: str, schema: type, overrides: list[str]) -> None:
    """ValueError for the first override whose key is not in ``schema`` (``+``, ``++`` and ``~`` prefixes included:
    adding keys the command does not read is a mistake, never a setting), with the closest known key."""
    for item in overrides:
        if item.startswith("-"):
            continue  # a flag (-m, --cfg job, ...)
        key = item.partition("=")[0].lstrip("+~")
        if key.startswith(HYDRA_KEYS):
            continue
        problem = _unknown_key(schema, key)
        if problem is not None:
            name = command.replace("_", "-")  # the command as typed (its config file is check_exact.yaml, ...)
            raise UnknownKeyError(f"`fastrl {name}` has no key {key!r}{problem}")


def _unknown_key(schema: type, dotted: str) -> str | None:
    """None when ``dotted`` names a key of the (nested) dataclass ``schema`` or lies inside a free-form field
    (dict, Any); else a hint: ``"; did you mean 'x.temperature'?"`` or the known keys."""
    current: Any = schema
    done: list[str] = []
    parts = dotted.split(".")
    for i, part in enumerate(parts):
        current = _unwrap_optional(current)
        if not is_dataclass(current):
            return None
        hints = get_type_hints(current)
        if part not in hints:
            within = _keys_ending(schema, dotted)
            if len(within) == 1:  # a nested key typed without its section: `engine.x` for `rollout.engine.x`
                return f"; did you mean {within[0]!r}?"
            prefix = ".".join(done + [""])
            close = difflib.get_close_matches(part, list(hints), n=1, cutoff=0.6)
            if close:
                whole = ".".join([prefix + close[0], *parts[i + 1 :]])  # the rest of the key, when it fits there
                meant = whole if _field_type(schema, whole) is not None else prefix + close[0]
                return f"; did you mean {meant!r}?"
            return f"; {(prefix or 'top-level ')}keys are {sorted(hints)}"
        done.append(part)
        current = hints[part]
    return None


def _keys_ending(schema: type, dotted: str) -> list[str]:
    """The keys of ``schema`` that end with the whole dotted name ``dotted`` below some section."""
    sections = [path for path, _ in _nested_configs(schema, "")]
    return [f"{path}.{dotted}" for path in sections if _field_type(schema, f"{path}.{dotted}") is not None]


def _unwrap_optional(kind: Any) -> Any:
    """``X | None`` -> ``X`` (for a union of one dataclass with None)."""
    if get_origin(kind) in (Union, types.UnionType):
        args = [a for a in get_args(kind) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return kind


def quote_string_overrides(schema: type, overrides: list[str], sweep: bool = False) -> list[str]:
    """Quote the values of string-typed keys (dotted keys follow nested dataclasses), so `strategy=8_4_32` stays
    the string "8_4_32" (Hydra's grammar would read digits with underscores as the integer 8432); lists of strings
    are quoted element-wise (also as the values of a dict, ``{1:[3_1_4]}``, whose override becomes ``++key=``: a
    dict's keys are new to Hydra's struct mode), and so are a multirun's (``sweep``) comma-separated values."""
    out = []
    for item in overrides:
        key, sep, value = item.partition("=")
        kind = _field_type(schema, key.lstrip("+~")) if sep else None
        if kind is not None and _unwrap_optional(kind) is str and value.lower() != "null":  # `str | None`; Hydra
            kind = str  # reads null in any case as None
        if kind is None or value[:1] in ("'", '"'):
            out.append(item)
        elif kind is str and sweep and "," in value:
            out.append(f"{key}=" + ",".join(e if e[:1] in ("'", '"') else _quote(e) for e in value.split(",")))
        elif kind is str:
            out.append(f"{key}={_quote(value)}")
        elif _is_str_list(kind) and value.startswith("[") and value.endswith("]"):
            out.append(f"{key}={_quote_list(value)}")
        elif get_origin(kind) is dict and _is_str_list(get_args(kind)[1]) and value.startswith("{"):
            # `++`: Hydra's struct mode refuses new keys in a dict node (even an empty default) on a plain override
            quoted = re.sub(r"\[[^\]]*\]", lambda m: _quote_list(m.group(0)), value)
            out.append(f"++{key.lstrip('+')}={quoted}")
        else:
            out.append(item)
    return out


def _field_type(schema: type, dotted: str) -> Any:
    """The annotated type of a dotted key in a (nested) dataclass schema, or None."""
    current: Any = schema
    for part in dotted.split("."):
        if not is_dataclass(current):
            return None
        hints = get_type_hints(current)
        if part not in hints:
            return None
        current = hints[part]
    return current


def _is_str_list(kind: Any) -> bool:
    return get_origin(kind) is list and get_args(kind) == (str,)


def _quote_list(value: str) -> str:
    """``[a, 'b']`` with every bare element quoted: ``['a','b']``."""
    elements = [e.strip() for e in value[1:-1].split(",") if e.strip()]
    return "[" + ",".join(e if e[:1] in ("'", '"') else _quote(e) for e in elements) + "]"


def _quote(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    cause = exc.__cause__
    if cause is not None and str(cause).strip():
        text = f"{text} ({str(cause).strip().splitlines()[0]})"
    return " ".join(text.splitlines()[:3])
