"""One bandit state from several rollout workers' states (a `fastrl train` checkpoint's rollout_selector.json holds
one per worker): what any worker learned about acceptance, round times and rewards, pooled by count."""

from __future__ import annotations


def merge_bandit_states(states: object) -> dict:
    """Pool ``BanditSelector.state_dict()``s of one config: acceptance hits and trials, pulls, rounds and rewards
    summed; round-time log-means and recent rewards averaged by their counts; every calibration point kept (the fit
    takes medians). ValueError when they are not bandit states of one config."""
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
            "pulls": _sum_by_key([s["pulls"] for s in states]),
            "round": sum(int(s["round"]) for s in states),
            "bucket_rounds": [sum(n) for n in zip(*(s["bucket_rounds"] for s in states), strict=True)],
            "rewards": [
                {arm: _merge_rewards([b[arm] for b in buckets]) for arm in buckets[0]}
                for buckets in zip(*(s["rewards"] for s in states), strict=True)
            ],
            "timeline": [],
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


def _pool(means: list[list]) -> list:
    """[value, count] log-means pooled: the count-weighted mean value, the summed count."""
    count = sum(int(n) for _, n in means)
    value = sum(float(v) * int(n) for v, n in means) / count if count else 0.0
    return [value, count]


def _merge_times(states: list[dict]) -> dict:
    """Round-time state: the shared load, the per-arm biases and per-size means, each pooled by its count."""
    bias: dict[str, list[list]] = {}
    sizes: dict[str, dict[int, list[list]]] = {}
    for state in states:
        for arm, mean in state["bias"].items():
            bias.setdefault(arm, []).append(mean)
        for arm, rows in state["sizes"].items():
            for b, v, n in rows:
                sizes.setdefault(arm, {}).setdefault(int(b), []).append([v, n])
    return {
        "load": _pool([s["load"] for s in states]),
        "bias": {arm: _pool(means) for arm, means in bias.items()},
        "sizes": {arm: [[b, *_pool(means)] for b, means in sorted(by_b.items())] for arm, by_b in sizes.items()},
    }


def _merge_rewards(arms: list[list]) -> list:
    """ArmRewards states [pulls, recent, total]: pulls and totals summed, recent means weighted by pulls."""
    pulls = sum(int(a[0]) for a in arms)
    recent = sum(float(a[1]) * int(a[0]) for a in arms) / pulls if pulls else 0.0
    return [pulls, recent, sum(float(a[2]) for a in arms)]
