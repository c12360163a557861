"""What a saved bandit state (``BanditSelector.state_dict``) must hold before a bandit loads it.

A state comes back from files (`fastrl generate bandit_state=FILE`, `export-drafter bandit_state=FILE`, a train
checkpoint's workers): a NaN or an entry of the wrong shape there is one ValueError naming its key, before any work,
instead of a bandit that predicts NaN for ever (and saves it back) or silently drops an arm's counts. The round-time
filter and the stopping chains' means are checked by their own loaders (``time_filter.checked_state``,
``chain_depth.checked_state``), the calibration by ``CostModel.fit``; this adds what ``BanditSelector`` reads as it
is: the config, the acceptance counts (one hit and one trial count per depth the arm drafts) and the counters.
"""

from __future__ import annotations

import json
import math

from fastrl.adaptive.bandit_config import BanditConfig
from fastrl.adaptive.catch_up import check_state as check_catch_up
from fastrl.adaptive.chain_depth import checked_state as checked_chain_rounds
from fastrl.adaptive.cost_model import checked_rows
from fastrl.adaptive.depth_acceptance import depth
from fastrl.adaptive.time_filter import checked_state as checked_filter
from fastrl.json_values import is_int, is_real
from fastrl.strategy.strategy import Strategy, strategy_entry

STATE_VERSION = 4
"""The version of ``BanditSelector.state_dict`` this bandit reads and writes."""
COUNTERS = {"round": 0, "since_plain": 0}
"""Integer entries and their least value."""
SECONDS = ("explore_credit", "explore_seconds")
"""Entries that are finite numbers (the credit may be negative: an exploration may cost more than it was allowed)."""


def check_state_values(state: dict) -> BanditConfig:
    """ValueError naming the first entry of ``state`` a bandit cannot load (see the module docstring); entries a
    state may lack (written before they existed) are checked where present. Returns the state's config."""
    check_state_version(state)  # a dict of this version
    if not isinstance(state.get("config"), dict):
        raise ValueError(f"config must be a BanditConfig object, got {state.get('config')!r}")
    config = BanditConfig.from_dict(state["config"])
    _check_acceptance(state.get("acceptance"))
    times = state.get("times")
    if not isinstance(times, dict) or not isinstance(times.get("measured"), list):
        raise ValueError("times must be an object with 'filter' and 'measured' (a list of arms)")
    checked_filter(times.get("filter"))
    for i, arm in enumerate(times["measured"]):
        strategy_entry(f"times.measured[{i}]", arm)
    timed = state.get("timed_by_state", [])  # absent from states saved before warm starts kept it
    if not isinstance(timed, list):
        raise ValueError(f"timed_by_state must be a list of arms, got {timed!r}"[:300])
    for i, arm in enumerate(timed):
        strategy_entry(f"timed_by_state[{i}]", arm)
    checked_chain_rounds(state.get("chain_rounds", {}))
    if "catch_up" in state:  # absent from states saved before catch-ups were charged
        check_catch_up(state["catch_up"])
    pulls = state.get("pulls", {})
    if not isinstance(pulls, dict):
        raise ValueError(f"pulls must be an object {{arm: rounds}}, got {pulls!r}")
    for arm, n in pulls.items():
        _check_int(f"pulls[{arm!r}]", n, 0)
    for key, least in COUNTERS.items():
        if key in state:
            _check_int(key, state[key], least)
    for key in SECONDS:
        if key in state and not (is_real(state[key]) and math.isfinite(state[key])):
            raise ValueError(f"{key} is {state[key]!r}: expected a finite number")
    if "explore_seconds" in state and state["explore_seconds"] < 0:  # time an exploration took
        raise ValueError(f"explore_seconds is {state['explore_seconds']!r}: expected a number >= 0")
    best = state.get("explore_best")
    if best is not None and not (is_real(best) and 0 < best < math.inf):
        raise ValueError(f"explore_best is {best!r}: expected null or a finite number > 0")
    _check_buckets(state, len(config.bs_thresholds))
    _check_timeline(state.get("timeline", []), len(config.bs_thresholds))
    _check_stretch(state.get("stretch"))
    if state.get("calibration") is not None:
        checked_rows(state["calibration"], "calibration")
    context = times.get("context")
    if context is not None and not (is_real(context) and 1 <= context < math.inf):
        raise ValueError(f"times.context is {context!r}: expected null or a number of keys per row >= 1")
    return config


def check_state_version(state: object) -> None:
    """ValueError unless ``state`` is a ``state_dict`` of this bandit's ``STATE_VERSION``: a JSON object whose
    "version" is that integer."""
    if not isinstance(state, dict):
        raise ValueError(f"not a bandit state: expected a JSON object, got {_json_kind(state)}")
    version = state.get("version")
    if version != STATE_VERSION and {"steps", "ema_accept"} <= set(state):
        raise ValueError(  # the verl server saves any selector's state under bandit_state_<server>.json
            "this is the state of an EMA tier controller (strategy=ema), not of a bandit: it holds no per-bucket "
            "choices to export or to start a bandit from"
        )
    if "version" not in state:
        raise ValueError(f'not a bandit state: it has no "version" (a bandit state of this bandit has {STATE_VERSION})')
    if not is_int(version):  # "4" or 4.0: not what a bandit writes (4.0 == 4 would pass the comparison)
        kind = "" if version is None else f", {_json_kind(version)}"
        raise ValueError(
            f'bandit state "version" is {json.dumps(version, default=repr)}{kind}: expected the integer {STATE_VERSION}'
        )
    if version != STATE_VERSION:
        raise ValueError(
            f"bandit state version {version!r} != {STATE_VERSION} (version 3 held round times as running means, "
            "version 2 per-arm time ratios without the shared load, version 1 the epsilon-greedy bandit's window of "
            "rewards: none fits this bandit's model, start without it)"
        )


JSON_KINDS = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", int: "an integer"}
"""How a JSON value's kind is named (by its Python type)."""


def _json_kind(value: object) -> str:
    """The kind of a JSON value in words: "an array", "a string", "a number" (a float), "null"."""
    if value is None:
        return "null"
    return JSON_KINDS.get(type(value), "a number" if isinstance(value, float) else type(value).__name__)


def _check_timeline(timeline: object, buckets: int) -> None:
    """[[round >= 0, batch size >= 1, bucket, strategy, reason], ...]."""
    if not isinstance(timeline, list):
        raise ValueError(f"timeline must be a list, got {timeline!r}"[:300])
    for i, entry in enumerate(timeline):
        where = f"timeline[{i}]"
        if not (isinstance(entry, list) and len(entry) == 5):
            raise ValueError(f"{where} must be [round, batch size, bucket, strategy, reason], got {entry!r}"[:300])
        _check_int(f"{where}[0]", entry[0], 0)
        _check_int(f"{where}[1]", entry[1], 1)
        _check_int(f"{where}[2]", entry[2], 0)
        if entry[2] >= buckets:
            raise ValueError(f"{where}[2] is {entry[2]}: there are {buckets} buckets")
        strategy_entry(f"{where}[3]", entry[3])
        if not isinstance(entry[4], str):
            raise ValueError(f"{where}[4] is {entry[4]!r}: expected the reason, a string")


STRETCH_KEYS = {"strategy", "batch_size", "credit", "explore_cost", "anchor_in", "seconds", "rounds"}


def _check_stretch(stretch: object) -> None:
    """null, or the exploit stretch in progress: its strategy, batch size, counters and (optional) thresholds."""
    if stretch is None:
        return
    if not isinstance(stretch, dict) or set(stretch) != STRETCH_KEYS:
        raise ValueError(f"stretch must be null or an object with {sorted(STRETCH_KEYS)}, got {stretch!r}"[:300])
    strategy_entry("stretch.strategy", stretch["strategy"])
    _check_int("stretch.batch_size", stretch["batch_size"], 1)
    _check_int("stretch.rounds", stretch["rounds"], 0)
    if stretch["anchor_in"] is not None:
        _check_int("stretch.anchor_in", stretch["anchor_in"], 0)
    for key in ("credit", "seconds", "explore_cost"):
        value = stretch[key]
        if (key != "explore_cost" or value is not None) and not (is_real(value) and math.isfinite(value)):
            raise ValueError(f"stretch.{key} is {value!r}: expected a finite number")
    if stretch["seconds"] < 0:  # the stretch's time so far: a negative one would hold its arm for ever
        raise ValueError(f"stretch.seconds is {stretch['seconds']!r}: expected a number >= 0")


def _check_int(key: str, value: object, least: int) -> None:
    if not is_int(value) or value < least:
        raise ValueError(f"{key} is {value!r}: expected an integer >= {least}")


def _check_acceptance(acceptance: object) -> None:
    """{arm: [hits per depth, trials per depth]}: one count of each per depth the arm drafts, 0 <= hits <= trials."""
    if not isinstance(acceptance, dict):
        raise ValueError(f"acceptance must be an object {{arm: [hits, trials]}}, got {acceptance!r}"[:300])
    for arm, entry in acceptance.items():
        where = f"acceptance[{arm!r}]"
        try:
            steps = depth(Strategy.parse(arm))
        except ValueError as err:
            raise ValueError(f"{where}: {err}") from None
        counts = entry if isinstance(entry, list) and len(entry) == 2 else [None, None]
        if not all(isinstance(c, list) and len(c) == steps for c in counts):
            raise ValueError(f"{where} must be [hits, trials], {steps} counts each (one per depth), got {entry!r}")
        hits, trials = counts
        if not all(is_real(h) and is_real(t) and 0 <= h <= t < math.inf for h, t in zip(hits, trials, strict=True)):
            raise ValueError(f"{where}: counts must be finite numbers with 0 <= hits <= trials, got {entry!r}")


def _check_buckets(state: dict, buckets: int) -> None:
    """One entry per bucket in bucket_rounds (>= 0), last_batch (>= 1) and rewards ({arm: [pulls, recent, total]})."""
    for key, least in (("bucket_rounds", 0), ("last_batch", 1)):
        values = state.get(key)
        if values is None:
            continue
        if not isinstance(values, list) or len(values) != buckets:
            raise ValueError(f"{key} must hold one integer per bucket ({buckets}), got {values!r}")
        for i, value in enumerate(values):
            _check_int(f"{key}[{i}]", value, least)
    rewards = state.get("rewards")
    if rewards is None:
        return
    if not isinstance(rewards, list) or len(rewards) != buckets or not all(isinstance(b, dict) for b in rewards):
        raise ValueError(f"rewards must hold one object per bucket ({buckets}), got {rewards!r}"[:300])
    for i, bucket in enumerate(rewards):
        for arm, entry in bucket.items():
            where = f"rewards[{i}][{arm!r}]"
            if not (isinstance(entry, list) and len(entry) == 3):
                raise ValueError(f"{where} must be [pulls, recent mean, total], got {entry!r}")
            _check_int(f"{where}[0]", entry[0], 0)
            if not all(is_real(x) and math.isfinite(x) for x in entry[1:]):
                raise ValueError(f"{where} is {entry!r}: the rewards must be finite numbers")
