"""Which tokens a top-k / top-p filter keeps, up to rounding: the support's edge as a range, not a point.

Two forwards of different shapes (a plain row, a verify row; batch 1, batch 64) round the same logits apart by up to
a dtype's ``near_tie_bound``. A token whose logit lies that close to the filter's cutoff (top-k: the k-th logit;
top-p: the token where the nucleus mass crosses p) can be kept by one forward and removed by the other: a sampled
token, or the normaliser of an equal token's log-prob, then differs for rounding alone. ``support_range`` finds, on one
forward's temperature-scaled logits, the tokens the filter keeps whatever the rounding (``certain``) and those it
keeps under some rounding (``possible``), each moving every logit by at most ``slack`` (half the bound: a gap between
two logits moves by at most the bound).

For a token t the rounding most in its favour lowers every logit more than a rounding above t by ``slack``, ties
those within reach above it with t (a tie is kept with t and is not before it in the nucleus), and raises t and every
logit below it by ``slack`` (the normaliser grows), with the widest top-k set rounding can give (every token within
rounding of the k-th logit tied with it: a larger top-k set lowers the nucleus mass before t, the edge of one filter
moving the other's); t itself passes top-k unless k tokens stay above it under every rounding. The rounding most
against t raises every logit above it and those below it within reach (they pass t), and lowers t and the rest, with
exactly k tokens. Either way membership is monotone in the logit's rank, so each set is a prefix of the tokens sorted
by logit, found by bisection with the sampler's own ``process_logits``; tests/exactness/test_support.py holds both
prefixes to every rounding of a discrete adversarial set on small vocabularies. ``certain`` is exact there;
``possible`` is too, but where both filters' edges are within rounding at once (the widest top-k set's normaliser is
taken whatever the rounding that tied its edge did to t), about one case in a hundred, where it is a token wider.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fastrl.sampling.processing import process_logits


@dataclass(frozen=True)
class SupportRange:
    """The filter's support on one forward, up to rounding.

    order: [V] token ids by scaled logit, highest first; sorted: [V] their scaled logits; certain / possible: how many
    of the first tokens of ``order`` the filter keeps under every / some rounding (``0 <= certain``, ``1 <= possible``,
    ``certain <= possible <= V``; none is certain where rounding can reorder the tokens a narrow filter keeps); slack:
    the rounding of one logit.
    """

    order: torch.Tensor
    sorted: torch.Tensor
    certain: int
    possible: int
    slack: float

    def rank(self, token: int) -> int:
        """Where ``token`` stands in ``order`` (0: the highest logit)."""
        return int((self.order == token).nonzero()[0, 0])

    def is_possible(self, token: int) -> bool:
        """Whether some rounding keeps ``token``."""
        return self.rank(token) < self.possible

    def rivals(self, token: int) -> torch.Tensor:
        """Tokens kept whenever ``token`` is: the certain ones, and those more than a rounding above it (the filters
        cut by value, so a token that stays above ``token`` is kept with it). [R] token ids"""
        above = int((self.sorted > self.sorted[self.rank(token)] + 2 * self.slack).sum())
        return self.order[: max(self.certain, above)]

    def logprob_range(self, token: int) -> tuple[float, float]:
        """The lowest and highest log-prob ``token`` has under the supports rounding can give it (the largest
        possible one, and the smallest one holding both the certain tokens and ``token``); ``token`` must be
        possible."""
        rank = self.rank(token)
        value = float(self.sorted[rank])
        smallest = max(self.certain, rank + 1)
        low = value - float(torch.logsumexp(self.sorted[: self.possible], dim=0))
        high = value - float(torch.logsumexp(self.sorted[:smallest], dim=0))
        return low, high


def support_range(scaled: torch.Tensor, top_k: int, top_p: float, slack: float) -> SupportRange:
    """The top-k / top-p support of temperature-scaled logits, up to a rounding of ``slack`` per logit (see the module
    docstring); ``top_k`` 0 and ``top_p`` 1 are off.  # [V] -> SupportRange"""
    values = scaled.double()
    vocab = values.shape[0]
    order = torch.argsort(values, descending=True, stable=True)
    ranked = values[order]
    ranks = torch.arange(vocab)
    # top-k keeps every token tied with the k-th largest: rounding can tie all within 2 * slack of it at once, and a
    # larger top-k set also lowers the nucleus mass before every token (the edge of one filter moves the other's)
    widest = top_k
    if 0 < top_k < vocab:
        widest = int((ranked >= ranked[top_k - 1] - 2 * slack).sum())
    p = torch.tensor([top_p], dtype=torch.float32)  # as SamplingBatch holds it
    one = torch.ones(1, dtype=torch.float64)

    def kept(i: int, favoured: bool) -> bool:
        value = ranked[i]
        if favoured:
            if 0 < top_k < vocab and int((ranked > value + 2 * slack).sum()) >= top_k:
                return False  # k tokens stay above it under every rounding
            # far above i: down; within reach above it: tied with it (not before it in the nucleus, still in its
            # normaliser); i and below: up; the widest top-k set (the largest normaliser)
            near = (ranks < i) & (ranked <= value + 2 * slack)
            moved = torch.where(ranks < i, ranked - slack, ranked + slack)
            moved = torch.where(near, value + slack, moved)
            k = widest
        else:  # above i and within reach below it: up; i and the rest: down; exactly k
            climbs = (ranks < i) | ((ranks > i) & (ranked >= value - 2 * slack))
            moved, k = torch.where(climbs, ranked + slack, ranked - slack), top_k
        return bool(process_logits(moved[None], one, torch.tensor([k]), p)[0, i] > float("-inf"))

    def prefix(favoured: bool) -> int:
        low, high = 0, ranked.shape[0]  # (no token is certain where rounding can swap the top ones under top_k=1)
        while low < high:  # first rank not kept, in [0, V]
            mid = (low + high) // 2
            if kept(mid, favoured):
                low = mid + 1
            else:
                high = mid
        return low

    return SupportRange(order=order, sorted=ranked, certain=prefix(False), possible=prefix(True), slack=slack)
