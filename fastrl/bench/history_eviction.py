"""What evicting kept responses from a full history group costs: one live sequence drafts from a group that holds
about ``--tokens`` tokens of kept responses; each step finishes a new ``--response``-token response, which pushes the
index over its budget and evicts the oldest ones, then the live sequence drafts again. Prints the step times
(median, 90th percentile, max) and how many steps filtered the group's n-gram lists.

    python -m fastrl.bench.history_eviction --tokens 200000 --response 3000 --steps 40
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from fastrl.bench.cli_args import at_least
from fastrl.speculative.history import HistoryConfig, HistoryIndex

PROMPT, LIVE = 64, 8  # tokens of the group's prompt and of the live sequence's output
TOKEN_BYTES = 1000  # an index token, ~0.8 KB in CPython, a quarter more while dropped ones wait (HistoryConfig)


def longest_response(tokens: int) -> int:
    """The longest response a ``tokens`` budget keeps: besides the prompt, the live sequence (its prompt tail and
    output) and the response's own prompt tail; a longer one would evict itself, leaving no history to draft from."""
    tail = min(HistoryConfig().max_match, PROMPT)
    return tokens - PROMPT - (tail + LIVE) - tail


def eviction_steps(tokens: int, response: int, steps: int, vocab: int, seed: int = 0) -> tuple[list[float], int]:
    """Seconds of each (finish + evict + next draft) step, and how many of them filtered the n-gram lists.

    The group is first filled with kept responses of ``min(response, 1000)`` tokens while the next one fits under
    the budget, so every step's response evicts older ones (``response`` at most ``longest_response(tokens)``)."""
    if not 1 <= response <= longest_response(tokens):
        raise ValueError(f"response must be in [1, {longest_response(tokens)}] for {tokens} tokens, got {response}")
    rng = random.Random(seed)
    config = HistoryConfig(token_budget=tokens)
    index = HistoryIndex(config)
    prompt = [rng.randrange(vocab) for _ in range(PROMPT)]
    index.start("live", None, prompt)
    index.extend("live", [rng.randrange(vocab) for _ in range(LIVE)])
    tail = min(config.max_match, PROMPT)
    serial = 0

    def add_response(length: int) -> None:
        nonlocal serial
        index.start(serial, None, prompt)
        index.extend(serial, [rng.randrange(vocab) for _ in range(length)])
        index.finish(serial, keep=True)
        serial += 1

    chunk = min(1000, response)
    while index.num_tokens + tail + chunk <= tokens:  # no eviction yet: each one adds its tokens
        add_response(chunk)
    index.draft("live", 8, 8)
    group = next(iter(index._groups.values()))
    times, filtered = [], 0
    for _ in range(steps):
        passes = group.filter_passes  # a pass empties the dropped texts: their tokens alone cannot tell one
        start = time.perf_counter()
        add_response(response)
        index.draft("live", 8, 8)
        times.append(time.perf_counter() - start)
        filtered += group.filter_passes > passes
    return times, filtered


def main(argv: list[str] | None = None) -> None:
    """Print the step times."""
    from fastrl.engine.machine import available_bytes

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--tokens", type=at_least(1000), default=200_000, help="the history budget, filled first")
    parser.add_argument("--response", type=at_least(1), default=3000, help="tokens of each new response")
    parser.add_argument("--steps", type=at_least(1), default=40)
    parser.add_argument("--vocab", type=at_least(2), default=50, help="token ids drawn uniformly from [0, vocab)")
    args = parser.parse_args(argv)
    available = available_bytes("cpu")
    if available is not None and args.tokens * TOKEN_BYTES > available:
        parser.error(
            f"argument --tokens: {args.tokens} tokens of history need about {args.tokens * TOKEN_BYTES / 2**30:.1f} "
            f"GiB, but {available / 2**30:.1f} GiB is available; give at most {available // TOKEN_BYTES}"
        )
    if args.response > longest_response(args.tokens):
        parser.error(
            f"argument --response: {args.response} leaves no kept history under --tokens {args.tokens} (a new "
            f"response would evict itself); give at most {longest_response(args.tokens)}, or raise --tokens"
        )
    times, filtered = eviction_steps(args.tokens, args.response, args.steps, args.vocab)
    ms = sorted(1000 * t for t in times)
    p90 = ms[min(len(ms) - 1, int(0.9 * len(ms)))]
    print(
        f"{args.steps} evicting steps at {args.tokens} tokens: median {statistics.median(ms):.1f} ms, "
        f"p90 {p90:.1f} ms, max {ms[-1]:.1f} ms; {filtered} filtered the n-gram lists"
    )


if __name__ == "__main__":
    main()
