"""One bandit state from several rollout workers' states (a `fastrl train` checkpoint's rollout_selector.json holds
one per worker): what any worker learned about acceptance, round times and rewards, pooled by count."""

from __future__ import annotations

import numpy as np

from fastrl.adaptive.chain_depth import ChainRounds
from fastrl.adaptive.time_filter import ArmPrior, shared_indices


def merge_bandit_states(states: object) -> dict:
    """Pool ``BanditSelector.state_dict()``s of one config: acceptance hits and trials, pulls, rounds and rewards
    summed; round-time filters fused (``_merge_times``), recent rewards and stopping chains' depths and tokens per
    bin averaged by their counts; every calibration point kept (the fit takes medians). ValueError when they are not
    bandit states of one config."""
    if not isinstance(states, list) or not states or not all(isinstance(s, dict) for s in states):
        raise ValueError("'workers' must be a non-empty list of bandit states (one per rollout worker)")
    if any(s.get("config") != states[0].get("config") for s in states):
        raise ValueError("the workers' bandit states have different configs; they cannot be merged")
    try:
        first = states[0]
        calibration = [point for s in states for point in (s["calibration"] or [])]
        return first | {
            "calibration": calibration or None,
            "acceptance": _merge_acceptance([s["acceptance"] for s in states]),
            "times": _merge_times([s["times"] for s in states]),
            "chain_rounds": ChainRounds.merge_states([s.get("chain_rounds", {}) for s in states]),
            "pulls": _sum_by_key([s["pulls"] for s in states]),
            "round": sum(int(s["round"]) for s in states),
            "bucket_rounds": [sum(n) for n in zip(*(s["bucket_rounds"] for s in states), strict=True)],
            "rewards": [
                {arm: _merge_rewards([b[arm] for b in buckets]) for arm in buckets[0]}
                for buckets in zip(*(s["rewards"] for s in states), strict=True)
            ],
            "timeline": [],
            "stretch": None,  # a stretch is one worker's decision in progress, not something learned
        }
    except (KeyError, TypeError, ValueError, IndexError) as err:
        raise ValueError(f"not a fastrl bandit state_dict per worker ({type(err).__name__}: {err})") from None


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
    mix of covariances is one)."""
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
    return {
        "filter": {"arms": arms, "mean": merged.tolist(), "cov": (sum(covs) / len(covs)).tolist()},
        "measured": sorted({arm for s in states for arm in s["measured"]}),
    }


def _merge_rewards(arms: list[list]) -> list:
    """ArmRewards states [pulls, recent, total]: pulls and totals summed, recent means weighted by pulls."""
    pulls = sum(int(a[0]) for a in arms)
    recent = sum(float(a[1]) * int(a[0]) for a in arms) / pulls if pulls else 0.0
    return [pulls, recent, sum(float(a[2]) for a in arms)]
