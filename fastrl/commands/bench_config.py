"""Structured config of `fastrl bench`."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from fastrl.bench.long_tail import check_selector_names
from fastrl.bench.workload import WORKLOADS
from fastrl.engine.machine import check_device
from fastrl.sampling.params import MAX_COUNT, MAX_SEED, check_temperature
from fastrl.strategy.strategy import Strategy, check_strategy_names

SUITES = ("plain_vs_hf", "spec_bs1", "long_tail", "prefix_sharing", "groups_bs1", "kv_memory", "host_time")


@dataclass
class BenchConfig:
    """Keys of `fastrl bench` (see conf/bench.yaml)."""

    model: str = ""
    workload: str = "auto"
    drafter: str = ""
    output: str = "runs/bench.json"
    suites: list[str] = field(default_factory=lambda: list(SUITES[:3]))
    batch_sizes: list[int] = field(default_factory=lambda: [1, 8, 64])
    new_tokens: int = 128
    repeats: int = 3
    seed: int = 0
    device: str = "cpu"
    threads: int = 1
    bs1_prompts: int = 8
    bs1_max_new_tokens: int = 512
    bs1_strategies: list[str] = field(
        default_factory=lambda: ["1_1_2", "3_1_4", "5_1_6", "7_1_8", "12_1_13@0.3", "5_4_8", "6_2_12", "8_4_32"]
    )
    bs1_temperatures: list[float] = field(default_factory=lambda: [0.0, 1.0])
    long_tail_requests: int = 64
    long_tail_max_new_tokens: int = 1024
    long_tail_selectors: list[str] = field(default_factory=lambda: ["3_1_4", "5_1_6", "8_4_32", "bandit", "ema"])
    long_tail_repeats: int = 1
    long_tail_bandit_strategies: list[str] = field(default_factory=lambda: ["3_1_4", "5_1_6", "8_4_32", "disable"])
    long_tail_group_size: int = 1
    groups_prompts: int = 6
    groups_n: int = 4
    groups_max_new_tokens: int = 512
    groups_temperatures: list[float] = field(default_factory=lambda: [1.0, 0.0])
    groups_selectors: list[str] = field(
        default_factory=lambda: ["3_1_4", "5_1_6", "suffix_8", "suffix_16", "3_1_4+suffix_8", "bandit"]
    )
    groups_bandit_strategies: list[str] = field(
        default_factory=lambda: ["3_1_4", "5_1_6", "suffix_8", "suffix_16", "3_1_4+suffix_8", "disable"]
    )
    prefix_sharing_prompts: int = 16
    prefix_sharing_group_sizes: list[int] = field(default_factory=lambda: [1, 4, 8, 16])
    kv_memory_requests: int = 64
    kv_memory_new_tokens: list[int] = field(default_factory=lambda: [73, 960])
    host_time_strategies: list[str] = field(default_factory=lambda: ["disable", "3_1_4"])

    def __post_init__(self) -> None:
        if not self.output:
            raise ValueError("bench.output must be a file path (the JSON of the results), got ''")
        if not isinstance(self.threads, int) or self.threads < 0:
            raise ValueError(f"bench.threads must be an integer >= 0 (0: torch's default), got {self.threads!r}")
        check_device("bench.device", self.device)
        if self.workload not in WORKLOADS:
            raise ValueError(f"bench.workload must be one of {list(WORKLOADS)}, got {self.workload!r}")
        unknown = [s for s in self.suites if s not in SUITES]
        if unknown or not self.suites:
            raise ValueError(f"bench.suites must be a non-empty subset of {list(SUITES)}, got {self.suites}")
        if not self.prefix_sharing_group_sizes or min(self.prefix_sharing_group_sizes) < 1:
            raise ValueError(
                f"bench.prefix_sharing_group_sizes must be positive ints, got {self.prefix_sharing_group_sizes}"
            )
        if not self.batch_sizes or min(self.batch_sizes) < 1:
            raise ValueError(f"bench.batch_sizes must be a non-empty list of positive ints, got {self.batch_sizes}")
        for key in (
            "new_tokens",
            "repeats",
            "bs1_prompts",
            "bs1_max_new_tokens",
            "long_tail_requests",
            "long_tail_max_new_tokens",
            "prefix_sharing_prompts",
            "long_tail_group_size",
            "groups_prompts",
            "groups_n",
            "groups_max_new_tokens",
            "long_tail_repeats",
            "kv_memory_requests",
        ):
            if not 1 <= getattr(self, key) < MAX_COUNT:  # counts of requests and tokens: bounded as a request's are
                raise ValueError(f"bench.{key} must be an integer in [1, 2**62), got {getattr(self, key)}")
        if not 0 <= self.seed < MAX_SEED:
            raise ValueError(f"bench.seed must be an integer in [0, 2**63), got {self.seed}")
        if self.long_tail_requests % self.long_tail_group_size:  # the header said one thing, the run did another
            raise ValueError(
                f"bench.long_tail_requests={self.long_tail_requests} must be a multiple of "
                f"bench.long_tail_group_size={self.long_tail_group_size} (whole GRPO groups)"
            )
        check_strategy_names("bench.bs1_strategies", self.bs1_strategies)
        for name in self.bs1_strategies:  # the suite's physical limit costs an EAGLE tree's verify and drafter steps
            strategy = Strategy.parse(name)
            if not strategy.uses_drafter or strategy.is_history:
                raise ValueError(
                    f"bench.bs1_strategies: {name} is not an EAGLE tree (plain decoding is always measured; "
                    "history strategies run in suites=[groups_bs1])"
                )
        check_strategy_names("bench.long_tail_selectors", self.long_tail_selectors, ("bandit", "ema", "bandit:"))
        check_strategy_names("bench.long_tail_bandit_strategies", self.long_tail_bandit_strategies)
        check_selector_names(  # bandit:KEY=VALUE: the bandit with one setting changed
            "bench.long_tail_selectors", self.long_tail_selectors, self.long_tail_bandit_strategies
        )
        for key in ("bs1_temperatures", "groups_temperatures"):
            if not getattr(self, key):
                raise ValueError(f"bench.{key} must name at least one temperature, got []")
            for i, t in enumerate(getattr(self, key)):  # as every request will check it, before any suite runs
                check_temperature(f"bench.{key}[{i}]", t)
        if not self.kv_memory_new_tokens or min(self.kv_memory_new_tokens) < 1:
            raise ValueError(f"bench.kv_memory_new_tokens must be positive ints, got {self.kv_memory_new_tokens}")
        check_strategy_names("bench.groups_selectors", self.groups_selectors, ("bandit", "ema"))
        check_strategy_names("bench.groups_bandit_strategies", self.groups_bandit_strategies)
        check_strategy_names("bench.host_time_strategies", self.host_time_strategies)
        for f in fields(self):
            if isinstance(getattr(self, f.name), list):
                check_distinct(f"bench.{f.name}", getattr(self, f.name))


def check_distinct(key: str, values: list) -> None:
    """ValueError naming ``key`` and the entry when a list repeats one (a strategy however it is spelled): a suite
    runs each entry once, and a repeated one printed its rows twice."""
    seen: dict = {}
    for value in values:
        same = _identity(value)
        if same in seen:
            spelled = f" (as {seen[same]!r})" if seen[same] != value else ""
            raise ValueError(f"{key}: {value!r} is listed twice{spelled}; list each once")
        seen[same] = value


def _identity(value: object) -> object:
    """What makes two list entries the same: the strategy a string parses to, else the value itself."""
    if isinstance(value, str):
        try:
            return Strategy.parse(value)
        except ValueError:
            return value
    return value
