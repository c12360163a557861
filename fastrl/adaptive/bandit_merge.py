"""One bandit state from several rollout workers' states (a `fastrl train` checkpoint's rollout_selector.json holds
one per worker): what any worker learned about acceptance, round times and rewards, pooled by count.

The merge is a function of the set of states, not of their order: the workers are taken in one canonical order (by
their JSON text), so sums of floats come out the same bits, and each entry that belongs to one worker's run rather
than to what it learned has a symmetric rule (``merge_bandit_states``)."""

from __future__ import annotations

import json
import statistics

import numpy as np

from fastrl.adaptive.bandit_state_check import check_state_values
from fastrl.adaptive.catch_up import CatchUpCosts
from fastrl.adaptive.chain_depth import ChainRounds
from fastrl.adaptive.time_filter import ArmPrior, shared_indices


def merge_bandit_states(states: object) -> dict:
    """Pool ``BanditSelector.state_dict()``s of one config: acceptance hits and trials, pulls, rounds and rewards
    summed; round-time filters fused (``_merge_times``), recent rewards and stopping chains' depths and tokens per
    bin averaged by their counts; every calibration point kept (the fit takes medians); catch-up rates pooled, the
    least backlog kept (``CatchUpCosts.merge_states``). What belongs to one worker's run: the exploration credit is
    the least any worker had (the merged bandit spends no more than any of them could), ``since_plain`` the least
    (the freshest plain round any worker ran), a bucket's ``last_batch`` that of the worker with the most rounds there
    (the smaller batch size on a tie), and no round, stretch or choice is in flight (``explore_best`` None,
    ``explore_seconds`` 0, ``stretch`` None, ``timeline`` empty). ValueError when they are not bandit states of one
    config (and one ``setting``, where they record it), naming the worker and the entry."""
    if not isinstance(states, list) or not states or not all(isinstance(s, dict) for s in states):
        raise ValueError("'workers' must be a non-empty list of bandit states (one per rollout worker)")
    if any(s.get("config") != states[0].get("config") for s in states):
        raise ValueError("the workers' bandit states have different configs; they cannot be merged")
    if any(s.get("setting") != states[0].get("setting") for s in states):
        raise ValueError("the workers' bandit states were learned with different settings; they cannot be merged")
    for i, state in enumerate(states):
        try:
            check_state_values(state)
        except ValueError as err:
            raise ValueError(f"workers[{i}]: {err}") from None
    states = sorted(states, key=lambda s: json.dumps(s, sort_keys=True))
    try:
        calibration = [point for s in states for point in (s["calibration"] or [])]
        catch_ups = all("catch_up" in s for s in states)  # states saved before catch-ups were charged have none
        bucket_rounds = list(zip(*(s["bucket_rounds"] for s in states), strict=True))
        last_batch = list(zip(*(s["last_batch"] for s in states), strict=True))
        merged = {
            "version": states[0]["version"],
            "config": states[0]["config"],
            "calibration": calibration or None,
            "acceptance": _merge_acceptance([s["acceptance"] for s in states]),
            "times": _merge_times([s["times"] for s in states]),
            "chain_rounds": ChainRounds.merge_states([s.get("chain_rounds", {}) for s in states]),
            **({"catch_up": CatchUpCosts.merge_states([s["catch_up"] for s in states])} if catch_ups else {}),
            "pulls": _sum_by_key([s["pulls"] for s in states]),
            "round": sum(int(s["round"]) for s in states),
            "explore_credit": min(float(s["explore_credit"]) for s in states),
            "explore_best": None,
            "explore_seconds": 0.0,
            "since_plain": min(int(s["since_plain"]) for s in states),
            "bucket_rounds": [sum(n) for n in bucket_rounds],
            "last_batch": [_busiest(r, b) for r, b in zip(bucket_rounds, last_batch, strict=True)],
            "rewards": [
                {arm: _merge_rewards([b[arm] for b in buckets]) for arm in buckets[0]}
                for buckets in zip(*(s["rewards"] for s in states), strict=True)
            ],
            "timeline": [],
            "stretch": None,  # a stretch is one worker's decision in progress, not something learned
        }
    except (KeyError, TypeError, ValueError, IndexError) as err:
        raise ValueError(f"not a fastrl bandit state_dict per worker ({type(err).__name__}: {err})") from None
    return merged | ({"setting": states[0]["setting"]} if "setting" in states[0] else {})


def _busiest(rounds: tuple[int, ...], last_batch: tuple[int, ...]) -> int:
    """The last batch size of the worker with the most rounds in a bucket (the smaller one on a tie)."""
    return min(zip(rounds, last_batch, strict=True), key=lambda pair: (-pair[0], pair[1]))[1]


def _sum_by_key(maps: list[dict]) -> dict:
    out: dict = {}
    for m in maps:
        for key, n in m.items():
            out[key] = out.get(key, 0) + int(n)
    return out


def _merge_acceptance(states: list[dict]) -> dict:
    """{arm: [hits per depth, trials per depth]} summed depth by depth."""
    out: dict[str, list[list[float]]] = {}
    for state in states:
        for arm, (hits, trials) in state.items():
            if arm not in out:
                out[arm] = [list(map(float, hits)), list(map(float, trials))]
            else:
                out[arm] = [
                    [a + float(b) for a, b in zip(out[arm][0], hits, strict=True)],
                    [a + float(b) for a, b in zip(out[arm][1], trials, strict=True)],
                ]
    return out


def _merge_times(states: list[dict]) -> dict:
    """Round-time filters: every arm any worker has, each entry's mean weighted by its precision in each worker
    (a worker that never ran an arm holds it at its prior and barely counts), the covariances averaged (a convex
    mix of covariances is one); the context predictions are made at, the median of the workers' that have one."""
    priors: dict[str, ArmPrior] = {}
    for state in states:
        for arm, saved in state["filter"]["arms"].items():
            priors.setdefault(arm, ArmPrior.from_state(saved["prior"]))
    starts, n = {}, 1
    for arm, prior in priors.items():
        starts[arm], n = n, n + len(prior.sizes)
    means, covs = [], []
    for state in states:
        mean, cov = np.zeros(n), np.zeros((n, n))  # [n], [n, n]
        for arm, prior in priors.items():
            k = slice(starts[arm], starts[arm] + len(prior.sizes))
            mean[k], cov[k, k] = prior.mean, prior.covariance()
        saved_mean, saved_cov = np.asarray(state["filter"]["mean"]), np.asarray(state["filter"]["cov"])
        here, there = shared_indices(state["filter"]["arms"], {arm: (starts[arm], p) for arm, p in priors.items()})
        mean[here] = saved_mean[there]
        cov[np.ix_(here, here)] = saved_cov[np.ix_(there, there)]
        means.append(mean)
        covs.append(cov)
    precision = np.stack([1.0 / np.diag(c) for c in covs])  # [workers, n]
    merged = (precision * np.stack(means)).sum(0) / precision.sum(0)
    arms = {arm: {"start": starts[arm], "prior": p.to_state()} for arm, p in priors.items()}
    contexts = [s["context"] for s in states if s.get("context") is not None]
    return {
        "filter": {"arms": arms, "mean": merged.tolist(), "cov": (sum(covs) / len(covs)).tolist()},
        "measured": sorted({arm for s in states for arm in s["measured"]}),
        "context": statistics.median(contexts) if contexts else None,
    }


def _merge_rewards(arms: list[list]) -> list:
    """ArmRewards states [pulls, recent, total]: pulls and totals summed, recent means weighted by pulls."""
    pulls = sum(int(a[0]) for a in arms)
    recent = sum(float(a[1]) * int(a[0]) for a in arms) / pulls if pulls else 0.0
    return [pulls, recent, sum(float(a[2]) for a in arms)]
