"""Hydra composition of fastrl's command configs (structured configs registered in a ConfigStore)."""

from __future__ import annotations

from dataclasses import is_dataclass
from pathlib import Path
from typing import Any, TypeVar, get_args, get_origin, get_type_hints

from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

T = TypeVar("T")


def conf_dir() -> Path:
    """The directory of fastrl's YAML configs."""
    return Path(__file__).resolve().parent / "conf"


def compose_config(name: str, schema: type[T], overrides: list[str]) -> T:
    """Compose config `name` from conf/ with command-line `overrides`, validated against the dataclass `schema`.

    Unknown keys, wrong types and failing dataclass validation raise ValueError naming the key.
    """
    if not is_dataclass(schema):
        raise TypeError(f"{schema!r} is not a dataclass")
    store = ConfigStore.instance()
    store.store(name=f"{name}_schema", node=schema)
    overrides = quote_string_overrides(schema, overrides)
    try:
        with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
            cfg = compose(config_name=name, overrides=overrides)
        obj: Any = OmegaConf.to_object(cfg)
    except (HydraException, OmegaConfBaseException) as exc:
        raise ValueError(f"bad config for `fastrl {name}`: {_first_line(exc)}") from exc
    return obj


def quote_string_overrides(schema: type, overrides: list[str]) -> list[str]:
    """Quote the values of string-typed keys (dotted keys follow nested dataclasses), so `strategy=8_4_32` stays
    the string "8_4_32" (Hydra's grammar would read digits with underscores as the integer 8432); lists of strings
    are quoted element-wise."""
    out = []
    for item in overrides:
        key, sep, value = item.partition("=")
        kind = _field_type(schema, key.lstrip("+~")) if sep else None
        if kind is None or value[:1] in ("'", '"'):
            out.append(item)
        elif kind is str:
            out.append(f"{key}={_quote(value)}")
        elif _is_str_list(kind) and value.startswith("[") and value.endswith("]"):
            elements = [e.strip() for e in value[1:-1].split(",") if e.strip()]
            out.append(f"{key}=[" + ",".join(e if e[:1] in ("'", '"') else _quote(e) for e in elements) + "]")
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


def _quote(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    cause = exc.__cause__
    if cause is not None and str(cause).strip():
        text = f"{text} ({str(cause).strip().splitlines()[0]})"
    return " ".join(text.splitlines()[:3])
