"""The bandit's learned strategy selection as deployable engine config: per batch-size bucket, the arm with the best
estimate, written as vLLM's speculative-token table and as an SGLang adaptive-speculation JSON.

The state is one bandit's ``state_dict`` or a `fastrl train` checkpoint's ``rollout_selector.json``
(``{"workers": [state, ...]}``), whose workers' observations are merged into one bandit first."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastrl.adaptive.bandit import BanditSelector
from fastrl.adaptive.bandit_merge import merge_bandit_states
from fastrl.adaptive.bandit_state_check import check_state_values
from fastrl.json_values import read_json
from fastrl.strategy.strategy import DISABLE, Strategy


@dataclass(frozen=True)
class BucketWinner:
    """The arm the bandit would exploit for batch sizes from ``min_batch_size`` (its bucket's lower threshold), as
    predicted at ``batch_size`` (``bucket_batch_size``). ``depth``: for a stopping chain, the mean depth its rounds
    reached at that batch size (None otherwise). ``bs_threshold``: the bandit's, when ``batch_size`` is past it (the
    bandit decodes plainly there, and so does the export)."""

    min_batch_size: int
    label: str
    strategy: Strategy
    estimate: float | None
    pulls: int
    depth: float | None = None
    batch_size: int = 1
    bs_threshold: int | None = None


def bucket_batch_size(thresholds: list[int], index: int) -> int:
    """The batch size that stands for bucket ``index`` in the export: the geometric middle of its range (3 for
    2-4, 10 for 5-20, rounded), the lower threshold of the last, open one. A property of the config alone, so the
    winners do not follow the batch size one worker's last round happened to have (``last_batch``)."""
    low = thresholds[index]
    if index + 1 == len(thresholds):
        return low
    return round(math.sqrt(low * (thresholds[index + 1] - 1)))


def bucket_winners(state: dict, prior_hazard: float | None = None) -> list[BucketWinner]:
    """Per bucket, the arm with the best estimate at ``bucket_batch_size`` in a saved bandit ``state_dict`` (ties:
    first in arm order; a bucket with no estimate at all keeps its first arm, as the bandit would). ``prior_hazard``:
    the drafter's held-out chain hazard, which the engine gives the bandit at start (`DrafterInfo.prior_hazard`;
    the state does not hold it), so an arm the run never pulled is predicted as the run predicted it. ValueError
    naming the entry of a state a bandit cannot load (``check_state_values``)."""
    try:
        policy = BanditSelector(check_state_values(state))
        policy.load_state_dict(state)
        if prior_hazard is not None:
            policy.set_prior_hazard(prior_hazard)
    except ValueError as err:
        raise ValueError(f"not a fastrl bandit state_dict ({err})") from None
    except (KeyError, TypeError, AttributeError) as err:
        raise ValueError(f"not a fastrl bandit state_dict ({type(err).__name__}: {err})") from None
    winners = []
    thresholds = policy.config.bs_thresholds
    past = policy.config.bs_threshold  # past it the bandit runs no arm: plain decoding, exported from past + 1 on
    for bucket in policy.telemetry().buckets:
        low = thresholds[bucket.index]
        high = thresholds[bucket.index + 1] - 1 if bucket.index + 1 < len(thresholds) else None
        if past is not None and low > past:
            winners.append(BucketWinner(low, bucket.label, DISABLE, None, 0, None, low, past))
            continue
        batch = bucket_batch_size(thresholds, bucket.index)
        batch = batch if past is None else min(batch, past)  # judged among the sizes the bandit speculates at
        best, best_value = bucket.arms[0], policy.predict(bucket.arms[0].strategy, batch)
        for arm in bucket.arms:
            value = policy.predict(arm.strategy, batch)
            if value is not None and (best_value is None or value > best_value):
                best, best_value = arm, value
        depth = policy.reached_depth(best.strategy, batch) if best.strategy.stop_below else None
        split = past is not None and (high is None or past < high)  # the threshold inside this bucket
        label = size_range(low, past) if split else bucket.label
        winners.append(BucketWinner(low, label, best.strategy, best_value, best.pulls, depth, batch))
        if split:
            winners.append(BucketWinner(past + 1, size_range(past + 1, high), DISABLE, None, 0, None, past + 1, past))
    return winners


def size_range(low: int, high: int | None) -> str:
    """``"5"``, ``"5-8"`` or ``"9+"`` (no upper end), as a bucket's label reads."""
    return f"{low}+" if high is None else str(low) if high == low else f"{low}-{high}"


def vllm_table(winners: list[BucketWinner], draft_model: str) -> dict:
    """vLLM ``speculative_config``: ``num_speculative_tokens`` of the batch-size-1 winner, plus the per-batch-size
    table ``num_speculative_tokens_per_batch_size`` ({min batch size: tokens}, 0 = no speculation). vLLM's EAGLE
    proposer drafts a chain, so a tree winner ``S_K_N`` contributes its depth ``S``. Where batch size 1's winner is
    plain decoding, ``num_speculative_tokens`` is 1 (vLLM needs at least 1, so the config stays valid) and a
    ``note`` says so (``vllm_plain_note``): serve batch size 1 without ``--speculative-config``."""
    table = {str(w.min_batch_size): exported_strategy(w).steps for w in winners}
    doc = {
        "method": "eagle",
        "model": draft_model,
        "num_speculative_tokens": max(table["1"], 1),
        "num_speculative_tokens_per_batch_size": table,
    }
    note = vllm_plain_note(winners)
    return doc | ({"note": note} if note else {})


def vllm_plain_note(winners: list[BucketWinner]) -> str | None:
    """Why the vLLM config's ``num_speculative_tokens`` is not what the bandit learned: batch size 1's winner
    decodes plainly (0 tokens) and vLLM needs at least 1. None when batch size 1's winner drafts."""
    first = next(w for w in winners if w.min_batch_size == 1)
    if exported_strategy(first).steps:
        return None
    return (
        f"batch size 1's learned choice is plain decoding ({disable_reason(first)}); num_speculative_tokens is 1 only "
        "because vLLM needs at least 1: serve batch size 1 without --speculative-config"
    )


def sglang_adaptive(winners: list[BucketWinner]) -> dict:
    """SGLang adaptive-speculation JSON: the flat keys of its EMA tier controller (``candidate_steps`` = every
    winner's depth; fastrl's ``EmaConfig`` reads the same keys) plus one section per bucket, keyed by its lower
    batch size, pinning that bucket's winner (steps, topk, num_draft_tokens)."""
    steps = sorted({exported_strategy(w).steps for w in winners})
    doc: dict = {
        "candidate_steps": steps,
        "ema_alpha": 0.2,
        "warmup_batches": 10,
        "update_interval": 5,
        "down_hysteresis": -0.25,
        "up_hysteresis": 0.0,
    }
    for w in winners:
        s = exported_strategy(w)
        doc[str(w.min_batch_size)] = (
            {
                "speculative_num_steps": s.steps,
                "speculative_eagle_topk": s.topk,
                "speculative_num_draft_tokens": s.num_draft_tokens,
                "disable": s.is_disabled,
            }
            | ({"disable_reason": reason} if (reason := disable_reason(w)) else {})
            | ({"note": note} if (note := stop_note(w)) else {})
        )
    return doc


def exported_strategy(winner: BucketWinner) -> Strategy:
    """The fixed EAGLE strategy a bucket's winner is exported as (``eagle_part``); a stopping chain, which neither
    engine has, as the fixed chain of the depth its rounds reached in that bucket (rounded; its full depth when it
    ran no round there)."""
    part = eagle_part(winner.strategy)
    if winner.strategy.stop_below and winner.depth is not None:
        return part.truncated(min(part.steps, max(1, round(winner.depth))))
    return part


def stop_note(winner: BucketWinner) -> str | None:
    """What a bucket's export rests on beyond its winner's own rounds there: a stopping chain's depth (neither engine
    stops a chain), a winner predicted for a bucket the bandit ran no round of. None when neither applies."""
    notes = []
    if winner.pulls == 0 and winner.estimate is not None:
        notes.append(f"the bandit ran no round of {winner.strategy} in this bucket: it won on its prediction")
    if winner.strategy.stop_below:
        stop = f"{winner.strategy} stops drafting where the drafter is unsure, which SGLang and vLLM cannot"
        if winner.depth is None:
            notes.append(f"{stop}; it ran no round, so its full depth {winner.strategy.steps} is exported")
        else:
            where = "here" if winner.pulls else "at the nearest batch size it ran"
            notes.append(
                f"{stop}; exported as the fixed chain of the depth its rounds reached {where} "
                f"({winner.depth:.2f} levels on average)"
            )
    return "; ".join(notes) or None


def disable_reason(winner: BucketWinner) -> str | None:
    """Why an exported bucket runs plain decoding (None when it speculates)."""
    if not eagle_part(winner.strategy).is_disabled:
        return None
    if winner.bs_threshold is not None:
        past = f"batch size {winner.batch_size} is past the bandit's bs_threshold={winner.bs_threshold}"
        return f"{past}: it decodes plainly"
    if not winner.strategy.is_disabled:
        return (
            f"the bandit's winner {winner.strategy} drafts from history (suffix), which an EAGLE-only engine cannot "
            "run; plain decoding instead"
        )
    if winner.estimate is None:
        return "the bandit observed no round in this bucket; its first arm (plain decoding) is kept"
    return f"plain decoding had the best estimate ({winner.estimate:.4g}; {winner.pulls} rounds of it in this bucket)"


def read_bandit_state(state_file: str | Path, key: str = "bandit_state") -> list[BucketWinner]:
    """The bucket winners of a bandit state JSON (``read_state``, ``state_winners``)."""
    return state_winners(read_state(state_file, key), f"{key}={state_file}")


def read_state(state_file: str | Path, key: str = "bandit_state") -> Any:
    """The JSON value of a bandit state file; ValueError naming ``key`` and the file when it is missing or not
    JSON."""
    path = Path(state_file)
    if not path.is_file():
        raise ValueError(f"{key}={state_file}: file not found")
    return read_json(path, f"{key}={state_file}")


def state_winners(state: Any, label: str, prior_hazard: float | None = None) -> list[BucketWinner]:
    """The bucket winners of one bandit's state_dict, or of a train checkpoint's rollout_selector.json with every
    worker's state, merged (``prior_hazard`` as in ``bucket_winners``); ValueError starting with ``label``
    (``key=file``)."""
    try:
        if isinstance(state, dict) and "workers" in state:
            state = merge_bandit_states(state["workers"])
        return bucket_winners(state, prior_hazard)
    except ValueError as err:
        raise ValueError(f"{label}: {err}") from None


SELECTION_FILES = ("vllm_speculative_config.json", "sglang_adaptive_config.json", "bandit_winners.json")
"""What ``selection_files`` writes (an export without a bandit state removes an earlier export's)."""


def selection_files(winners: list[BucketWinner], draft_model: str) -> dict[str, str]:
    """File name -> text of the three selection configs: vLLM's table, SGLang's adaptive JSON and the winners."""
    rows = [
        {"min_batch_size": w.min_batch_size, "bucket": w.label, "strategy": str(w.strategy), "estimate": w.estimate,
         "estimated_at_batch_size": w.batch_size, "pulls": w.pulls, "exported": str(exported_strategy(w)),
         "disable_reason": disable_reason(w), "note": stop_note(w)}
        for w in winners
    ]  # fmt: skip
    docs = dict(zip(SELECTION_FILES, (vllm_table(winners, draft_model), sglang_adaptive(winners), rows), strict=True))
    return {name: json.dumps(doc, indent=2) + "\n" for name, doc in docs.items()}


def write_selection_configs(state_file: str | Path, output: str | Path, draft_model: str) -> list[BucketWinner]:
    """Read a bandit state JSON (``read_bandit_state``); write ``selection_files`` into ``output``; returns the
    winners."""
    winners = read_bandit_state(state_file)
    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    for name, text in selection_files(winners, draft_model).items():
        (out / name).write_text(text)
    return winners


def eagle_part(strategy: Strategy) -> Strategy:
    """What an EAGLE-only engine can run of `strategy`: a hybrid's EAGLE tree; plain decoding for a history arm
    (SGLang's and vLLM's EAGLE configs have no history drafts)."""
    return Strategy(strategy.steps, strategy.topk, strategy.num_draft_tokens) if strategy.uses_drafter else DISABLE
