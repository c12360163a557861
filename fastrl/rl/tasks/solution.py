"""Writing valid step-by-step solutions of a sum: a running total, with random but always correct variations."""

from __future__ import annotations

import random
from dataclasses import dataclass

from fastrl.rl.tasks.config import TERM_LABELS

STEP_SEPARATORS: tuple[str, ...] = (" ", ", ", "; ")
FINAL_PHRASES: tuple[str, ...] = ("so answer {answer}", "thus answer {answer}", "total {answer} so answer {answer}")
CHECK_PHRASE = " (check {total}-{term}={previous})"


@dataclass(frozen=True)
class SolutionChoices:
    """Every free choice of one written solution; together with the terms they determine the text."""

    order: tuple[int, ...]
    separator: str
    checks: tuple[bool, ...]
    final_phrase: str


def sample_choices(
    size: int, rng: random.Random, p_reverse: float, p_swap: float, p_check: float, max_checks: int
) -> SolutionChoices:
    """Draws an addition order (prompt order or reversed, then random adjacent swaps), a separator style, which
    steps get a subtraction check (at most `max_checks`), and the final phrasing."""
    order = list(range(size))
    if rng.random() < p_reverse:
        order.reverse()
    i = 0
    while i < size - 1:
        if rng.random() < p_swap:
            order[i], order[i + 1] = order[i + 1], order[i]
            i += 2
        else:
            i += 1
    separator = rng.choice(STEP_SEPARATORS)
    checks: list[bool] = []
    for _ in range(size - 1):
        checks.append(sum(checks) < max_checks and rng.random() < p_check)
    return SolutionChoices(tuple(order), separator, tuple(checks), rng.choice(FINAL_PHRASES))


def write_solution(numbers: tuple[int, ...], choices: SolutionChoices) -> str:
    """The solution text for `numbers` under `choices`, e.g.
    ``" a+b=23+5=28, +c=28+81=109, +d=109+4=113, so answer 113"``: each step names the term it adds (its label in
    the prompt), then writes the addition. It starts with a space (it continues a prompt ending in ``=``) and
    carries no special tokens.
    """
    first = choices.order[0]
    total = numbers[first]
    steps: list[str] = []
    for index, check in zip(choices.order[1:], choices.checks, strict=True):
        term = numbers[index]
        previous, total = total, total + term
        name = f"{TERM_LABELS[first]}+{TERM_LABELS[index]}" if not steps else f"+{TERM_LABELS[index]}"
        step = f"{name}={previous}+{term}={total}"
        if check:
            step += CHECK_PHRASE.format(total=total, term=term, previous=previous)
        steps.append(step)
    steps.append(choices.final_phrase.format(answer=total))
    return " " + choices.separator.join(steps)


def longest_solution(size: int, value: int, max_checks: int) -> str:
    """The longest text any solution of `size` terms no larger than `value` can have (all terms = `value`)."""
    separator = max(STEP_SEPARATORS, key=len)
    final = max(FINAL_PHRASES, key=len)
    checks = tuple(i < max_checks for i in range(size - 1))
    return write_solution((value,) * size, SolutionChoices(tuple(range(size)), separator, checks, final))
