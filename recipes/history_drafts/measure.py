"""Tokens per round of history drafts, replayed over real rollouts of the bundled model (exact-match replay).

Step 1 (``--generate``) samples ``--prompts`` arithmetic problems x ``--samples`` responses at T=1 with plain
decoding (``fastrl generate strategy=disable``), twice (two "epochs" with other seeds), into ``--data``.
Step 2 replays every response token by token: before each round the index drafts a tree for the sequence; the
round accepts the longest tree path equal to the next tokens of the real response (what the exact verifier
accepts, since the response is what the policy samples there) and emits those tokens plus one. Reported: mean
tokens per round (accepted + 1) for chains and trees of N nodes, in several source settings:

- own:          one group per sequence (its prompt and its own output only)
- sequential:   the siblings of a group decode one after another (each sees the earlier siblings complete)
- interleaved:  the siblings decode in lockstep, one round each in turn (a batch), seeing each other live
- +epoch:       interleaved, epoch 2, with epoch 1's responses kept as history

and the cost of one ``draft`` call. With ``--arctic`` (arctic-inference importable), the same replay through
its ``SuffixDecodingCache`` (vLLM's ``method: suffix``), its native global cache over all responses.

    python recipes/history_drafts/measure.py --generate --data /tmp/history_rollouts.jsonl

Every flag is checked before any work: ``--data`` must be a new file with ``--generate`` (measure an existing one
without it) and a readable rollouts file without, ``--json`` a new file, and ``--arctic`` needs arctic-inference.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fastrl.atomic_files import write_atomic
from fastrl.bench.cli_args import at_least, existing_file, new_file
from fastrl.rl.tasks.task import ArithChainTask
from fastrl.speculative.history import HistoryConfig, HistoryIndex

NODES = (4, 8, 16, 32)


@dataclass
class Rollout:
    """One response of the data: its group (prompt index), epoch, prompt and response token ids."""

    group: int
    epoch: int
    prompt: list[int]
    response: list[int]


def generate(data: Path, num_prompts: int, samples: int, epochs: int, max_new_tokens: int) -> None:
    """Sample the rollouts with the bundled model (plain decoding, T=1) into ``data`` (JSONL of Rollout)."""
    problems = ArithChainTask().sample_batch(num_prompts, random.Random(0))
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        for epoch in range(epochs):
            prompts = Path(tmp, f"prompts{epoch}.jsonl")
            lines = [
                {"prompt": p.prompt, "seed": 1000 * epoch + samples * g + s}
                for g, p in enumerate(problems)
                for s in range(samples)
            ]
            prompts.write_text("".join(json.dumps(line) + "\n" for line in lines))
            out = Path(tmp, f"out{epoch}.jsonl")
            cmd = [sys.executable, "-m", "fastrl.cli", "generate", f"prompts={prompts}", f"output={out}"]
            cmd += ["strategy=disable", "temperature=1.0", f"max_new_tokens={max_new_tokens}", "progress=false"]
            if subprocess.run(cmd).returncode != 0:
                raise SystemExit(f"fastrl generate failed (its error is above); {data} was not written")
            for record in map(json.loads, out.read_text().splitlines()):
                group = record["index"] // samples
                ids = {"prompt": record["prompt_ids"], "response": record["token_ids"]}
                rows.append({"group": group, "epoch": epoch, **ids})
    write_atomic(data, "".join(json.dumps(row) + "\n" for row in rows))


def read_rollouts(data: Path) -> list[Rollout]:
    """The rollouts of ``data`` (JSONL of Rollout); ValueError naming the file and line when one is malformed, or
    when it holds none."""
    rollouts = []
    try:
        lines = data.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"{data}: cannot be read ({err})") from None
    for line_no, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict) or set(record) != {"group", "epoch", "prompt", "response"}:
                raise ValueError("expected an object with group, epoch, prompt and response")
            ints = [record["group"], record["epoch"], *record["prompt"], *record["response"]]
            if any(not isinstance(v, int) or isinstance(v, bool) or v < 0 for v in ints) or not record["prompt"]:
                raise ValueError("group, epoch and token ids must be integers >= 0, the prompt not empty")
        except (ValueError, TypeError) as err:
            raise ValueError(f"{data}:{line_no}: not a rollout ({err})") from None
        rollouts.append(Rollout(**record))
    if not rollouts:
        raise ValueError(f"{data} holds no rollouts; make them with --generate")
    return rollouts


# A drafter maps (sequence id, context tokens) to a tree (tokens, parents) whose node 0 is the root.
Drafter = Callable[[int, list[int]], tuple[list[int], list[int]]]


def accepted(tokens: list[int], parents: list[int], upcoming: list[int]) -> int:
    """Length of the longest tree path equal to the start of ``upcoming`` (children: first match wins)."""
    node, depth = 0, 0
    while depth < len(upcoming):
        nxt = next((i for i in range(1, len(tokens)) if parents[i] == node and tokens[i] == upcoming[depth]), None)
        if nxt is None:
            break
        node, depth = nxt, depth + 1
    return depth


class Replay:
    """Replays groups of rollouts through an index-like backend, counting rounds and emitted tokens."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.rounds = 0
        self.tokens = 0

    def run_group(self, rollouts: list[tuple[int, Rollout]], interleaved: bool) -> None:
        if not interleaved:
            for seq, r in rollouts:
                self.backend.start(seq, r)
                self._decode(seq, r, 0, len(r.response))
                self.backend.finish(seq)
            return
        for seq, r in rollouts:
            self.backend.start(seq, r)
        done = [0] * len(rollouts)
        while any(d < len(r.response) for d, (_, r) in zip(done, rollouts, strict=True)):
            for i, (seq, r) in enumerate(rollouts):
                if done[i] < len(r.response):
                    done[i] = self._decode(seq, r, done[i], done[i] + 1)
                    if done[i] >= len(r.response):
                        self.backend.finish(seq)

    def _decode(self, seq: int, r: Rollout, pos: int, stop: int) -> int:
        """Rounds from ``pos`` until at least ``stop`` tokens are emitted; returns the new position."""
        while pos < stop:
            if pos == 0:  # the first token is the prefill's: no draft
                emitted = 1
            else:
                tokens, parents = self.backend.draft(seq, r.prompt + r.response[:pos])
                emitted = accepted(tokens, parents, r.response[pos:]) + 1
                emitted = min(emitted, len(r.response) - pos)
                self.rounds += 1
                self.tokens += emitted
            self.backend.extend(seq, r.response[pos : pos + emitted])
            pos += emitted
        return pos

    @property
    def tokens_per_round(self) -> float:
        return self.tokens / max(self.rounds, 1)


class Backend:
    """fastrl's HistoryIndex behind the replay."""

    def __init__(self, nodes: int, chain: bool, own_only: bool = False) -> None:
        self.index = HistoryIndex(HistoryConfig())
        self.nodes, self.chain, self.own_only = nodes, chain, own_only
        self.draft_seconds: list[float] = []

    def start(self, seq: int, r: Rollout) -> None:
        self.index.start(seq, ("own", seq) if self.own_only else r.group, r.prompt)

    def extend(self, seq: int, tokens: list[int]) -> None:
        self.index.extend(seq, tokens)

    def finish(self, seq: int) -> None:
        self.index.finish(seq, keep=True)

    def draft(self, seq: int, context: list[int]) -> tuple[list[int], list[int]]:
        t0 = time.perf_counter()
        d = self.index.draft(seq, self.nodes, self.nodes - 1, chain=self.chain)
        self.draft_seconds.append(time.perf_counter() - t0)
        return list(d.tokens), list(d.parents)


class ArcticBackend(Backend):
    """arctic-inference's SuffixDecodingCache (one global cache, vLLM's defaults unless ``wide``)."""

    def __init__(self, nodes: int, chain: bool, wide: bool = False) -> None:
        from arctic_inference.suffix_decoding import SuffixDecodingCache

        self.cache = SuffixDecodingCache(max_tree_depth=24)
        self.nodes, self.chain = nodes, chain
        self.knobs = {"max_spec_factor": 8.0, "min_token_prob": 0.0} if wide else {}
        self.draft_seconds = []

    def start(self, seq: int, r: Rollout) -> None:
        self.cache.start_request(seq, r.prompt)

    def extend(self, seq: int, tokens: list[int]) -> None:
        self.cache.add_active_response(seq, tokens)

    def finish(self, seq: int) -> None:
        self.cache.stop_request(seq)

    def draft(self, seq: int, context: list[int]) -> tuple[list[int], list[int]]:
        t0 = time.perf_counter()
        d = self.cache.speculate(
            seq, context, max_spec_tokens=self.nodes - 1, use_tree_spec=not self.chain, **self.knobs
        )
        self.draft_seconds.append(time.perf_counter() - t0)
        return [context[-1], *d.token_ids], [-1, *(p + 1 for p in d.parents)]


def measure(rollouts: list[Rollout], make: Callable[[], Backend]) -> tuple[dict[str, float], float]:
    """Tokens per round in each setting, and the median draft cost (us) over all of them."""
    seqs = {id(r): i for i, r in enumerate(rollouts)}
    by_group: dict[tuple[int, int], list[tuple[int, Rollout]]] = {}
    for r in rollouts:
        by_group.setdefault((r.epoch, r.group), []).append((seqs[id(r)], r))
    first = [g for (e, _), g in sorted(by_group.items()) if e == 0]
    second = [g for (e, _), g in sorted(by_group.items()) if e == 1]
    results: dict[str, float] = {}
    costs: list[float] = []
    for name, interleaved, own in (("own", False, True), ("sequential", False, False), ("interleaved", True, False)):
        backend = make() if not own else make_own(make)
        replay = Replay(backend)
        for group in first:
            replay.run_group(group, interleaved)
        results[name] = replay.tokens_per_round
        costs += backend.draft_seconds
    if second:
        backend = make()
        warm = Replay(backend)
        for group in first:
            warm.run_group(group, True)
        replay = Replay(backend)
        for group in second:
            replay.run_group(group, True)
        results["+epoch"] = replay.tokens_per_round
        costs += backend.draft_seconds
    return results, statistics.median(costs) * 1e6


def make_own(make: Callable[[], Backend]) -> Backend:
    backend = make()
    if isinstance(backend, ArcticBackend):
        backend.cache = type(backend.cache)(max_tree_depth=24, max_cached_requests=0)  # prompt + own output only
    else:
        backend.own_only = True
    return backend


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default="/tmp/history_rollouts.jsonl", help="the rollouts (JSONL)")
    parser.add_argument("--generate", action="store_true", help="sample the rollouts first, into a new --data")
    parser.add_argument("--prompts", type=at_least(1), default=24)
    parser.add_argument("--samples", type=at_least(1), default=4)
    parser.add_argument("--epochs", type=at_least(1), default=2)
    parser.add_argument("--max-new-tokens", type=at_least(1), default=512)
    parser.add_argument("--arctic", action="store_true", help="also replay through arctic-inference")
    parser.add_argument("--json", type=new_file, default=None, help="write the table as JSON here (a new file)")
    args = parser.parse_args(argv)
    if args.arctic and importlib.util.find_spec("arctic_inference") is None:
        parser.error("--arctic needs arctic-inference, which this Python cannot import (pip install arctic-inference)")
    if args.generate:
        if Path(args.data).exists():
            parser.error(f"--data {args.data} exists; choose a new file, or drop --generate to measure it")
        try:
            data = new_file(args.data)
        except argparse.ArgumentTypeError as err:
            parser.error(f"--data: {err}")
        if args.json is not None and args.json.absolute() == data.absolute():
            parser.error(f"--json and --data name the same file {data}")
    else:
        try:
            data = existing_file(args.data)
            rollouts = read_rollouts(data)
        except (argparse.ArgumentTypeError, ValueError) as err:
            parser.error(f"--data: {err}")
    if args.generate:
        generate(data, args.prompts, args.samples, args.epochs, args.max_new_tokens)
        rollouts = read_rollouts(data)
    lengths = [len(r.response) for r in rollouts]
    print(f"{len(rollouts)} responses, mean length {statistics.mean(lengths):.1f} tokens")
    backends: list[tuple[str, Callable[[int, bool], Backend]]] = [("fastrl", Backend)]
    if args.arctic:
        backends += [("arctic", ArcticBackend), ("arctic-wide", lambda n, c: ArcticBackend(n, c, wide=True))]
    table = []
    print(f"{'backend':12} {'draft':6} {'N':>3} {'own':>6} {'seq':>6} {'inter':>6} {'+epoch':>7} {'us/draft':>9}")
    for name, cls in backends:
        for chain in (True, False):
            for nodes in NODES:
                res, cost = measure(rollouts, lambda cls=cls, nodes=nodes, chain=chain: cls(nodes, chain))
                kind = "chain" if chain else "tree"
                table.append({"backend": name, "draft": kind, "nodes": nodes, **res, "draft_us": cost})
                print(
                    f"{name:12} {kind:6} {nodes:>3} {res['own']:6.2f} {res['sequential']:6.2f} "
                    f"{res['interleaved']:6.2f} {res.get('+epoch', float('nan')):7.2f} {cost:9.1f}"
                )
    if args.json:
        write_atomic(args.json, json.dumps(table, indent=1))


if __name__ == "__main__":
    main()
