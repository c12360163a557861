"""The arithmetic-chain task: heavy-tailed problem sizes, varied step-by-step solutions, a verifiable reward."""

from __future__ import annotations

import random
from itertools import pairwise

from fastrl.rl.tasks.config import TERM_LABELS, TaskConfig
from fastrl.rl.tasks.power_law import TruncatedPowerLaw
from fastrl.rl.tasks.problem import Problem
from fastrl.rl.tasks.reward import answer_reward
from fastrl.rl.tasks.solution import longest_solution, sample_choices, write_solution

SPECIAL_TOKENS_PER_SEQUENCE = 2  # <bos> before the prompt, <eos> after the response


class ArithChainTask:
    """Sum n named small numbers, reasoning as a running total::

        sum a=23 b=5 c=81 d=4 =  →   a+b=23+5=28, +c=28+81=109, +d=109+4=113, so answer 113

    Each step names the term it adds, then copies its value from the prompt: the lookup is a one-token match.

    n follows a truncated power law, so most problems are short and a few are long, as in reasoning RL: the
    response length (in characters, which are the tokens of the bundled tokenizer) grows linearly with n.
    Solutions vary validly (order of addition, separators, optional checks, final phrasing), so a policy trained
    on them keeps real next-token entropy at the forks and near-zero entropy on the arithmetic.
    """

    def __init__(self, config: TaskConfig | None = None) -> None:
        self.config = config if config is not None else TaskConfig()
        self.sizes = TruncatedPowerLaw(self.config.n_min, self.config.n_max, self.config.size_exponent)
        longest = self.max_prompt_chars() + self.max_response_chars() + SPECIAL_TOKENS_PER_SEQUENCE
        if longest > self.config.context_length:
            raise ValueError(
                f"TaskConfig.n_max={self.config.n_max} gives sequences of up to {longest} tokens, more than "
                f"context_length={self.config.context_length}"
            )
        pool_rng = random.Random(self.config.pool_seed)
        self._pool = [self._fresh_problem(pool_rng) for _ in range(self.config.pool_size)]

    def make_problem(self, numbers: tuple[int, ...] | list[int]) -> Problem:
        """The problem of summing `numbers` (in this order)."""
        numbers = tuple(int(x) for x in numbers)
        if len(numbers) > len(TERM_LABELS):
            raise ValueError(f"a problem has at most {len(TERM_LABELS)} terms (got {len(numbers)})")
        prompt = "sum " + " ".join(f"{label}={x}" for label, x in zip(TERM_LABELS, numbers, strict=False)) + " ="
        return Problem(prompt=prompt, answer=sum(numbers), size=len(numbers), numbers=numbers)

    def sample_problem(self, rng: random.Random) -> Problem:
        """One problem: from the fixed pool when the task has one (`pool_size`), else fresh: size from the power
        law, terms uniform in [value_min, value_max]."""
        if self._pool:
            return self._pool[rng.randrange(len(self._pool))]
        return self._fresh_problem(rng)

    def _fresh_problem(self, rng: random.Random) -> Problem:
        size = self.sizes.sample(rng)
        return self.make_problem([rng.randint(self.config.value_min, self.config.value_max) for _ in range(size)])

    def sample_batch(self, n: int, rng: random.Random) -> list[Problem]:
        """`n` independent problems."""
        return [self.sample_problem(rng) for _ in range(n)]

    def solution_text(self, problem: Problem, rng: random.Random) -> str:
        """A random valid reasoning trace for `problem` (no special tokens); its reward is always 1."""
        cfg = self.config
        choices = sample_choices(problem.size, rng, cfg.p_reverse, cfg.p_swap, cfg.p_check, cfg.max_checks)
        return write_solution(problem.numbers, choices)

    def reward(self, problem: Problem, response_text: str) -> float:
        """1.0 if the response ends with ``answer <correct total>``, else 0.0 (any garbage gets 0.0)."""
        return answer_reward(problem.answer, response_text)

    def size_bucket(self, problem: Problem) -> str:
        """The reporting bucket of the problem's size, e.g. ``"2-3"``, ``"4-7"``, ``"8-15"``, ``"16+"``."""
        return self.bucket_of_size(problem.size)

    def bucket_of_size(self, size: int) -> str:
        """The bucket label containing `size` (sizes below the first edge fall in the first bucket)."""
        edges = self.config.bucket_edges
        for low, high in pairwise(edges):
            if size < high:
                return f"{low}-{high - 1}"
        return f"{edges[-1]}+"

    def bucket_names(self) -> list[str]:
        """All bucket labels, smallest sizes first."""
        edges = self.config.bucket_edges
        return [f"{low}-{high - 1}" for low, high in pairwise(edges)] + [f"{edges[-1]}+"]

    def longest_prompt(self) -> str:
        """The longest possible prompt: `n_max` terms, each `value_max`."""
        return self.make_problem([self.config.value_max] * self.config.n_max).prompt

    def max_prompt_chars(self) -> int:
        """Length of the longest possible prompt."""
        return len(self.longest_prompt())

    def max_response_chars(self) -> int:
        """Length of the longest possible solution; a bound for `max_new_tokens` (plus one for <eos>)."""
        return len(longest_solution(self.config.n_max, self.config.value_max, self.config.max_checks))
