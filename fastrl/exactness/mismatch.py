"""First-mismatch diagnostics: where a speculative rollout left plain decoding, and whether a float tie explains it.

Both rollouts sample token j of a response at absolute position len(prompt) + j from the policy's logits with the
request's seed (the sampling contract). At the first differing position the policy is run once more, as a fresh
full forward over prompt + the common prefix, and the two tokens are judged on that distribution:

- a **near-tie**: both tokens' perturbed logits (processed logits + the sampler's Gumbel noise, or raw logits for
  greedy rows) lie within ``bound`` of the best one: each could have been its forward's argmax after rounding, so
  the rollouts rounded a tie apart (usually the two best swapped; in half precision a third candidate close to them
  can win in one forward, as bfloat16 SmolLM2 showed: 30.33, 30.07, 29.98 at the top, the third chosen by plain);
- a **bug** otherwise (e.g. a token no rounding keeps in the filtered support, or a clear winner that lost).

Under top-k / top-p a token within rounding of the filter's edge may be kept by one forward and removed by the
other (``support.py``): such a token counts as possibly kept, and the best it must come within ``bound`` of is the
best among the tokens kept whenever it is (the certain ones, and those more than a rounding above it). Equal tokens
whose log-probs differ beyond the tolerance are explained the same way (``support_explains_logprobs``): the
support's edge moved the normaliser.

A difference in length with an equal common prefix (one rollout stopped, the other went on) is a bug too.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch

from fastrl.exactness.support import SupportRange, support_range
from fastrl.models.decoder import CausalLM
from fastrl.sampling.params import SamplingParams
from fastrl.sampling.processing import process_logits
from fastrl.sampling.sampler import SamplingBatch, centred, perturbed_logits, sampling_noise

# Gap below which two perturbed logits count as tied, per compute dtype: a few units of the rounding that two
# differently shaped forwards (one row vs a verify row, batch 1 vs 64) accumulate over a model's layers.
NEAR_TIE_BOUNDS = {torch.float64: 1e-9, torch.float32: 1e-3, torch.bfloat16: 0.5, torch.float16: 0.05}
# Largest |log-prob difference| of equal tokens that is rounding, per compute dtype (at T = 1): a verify row's forward
# and a plain row's differ in shape, and so do batches of other sizes, so half precision moves a log-prob by up to
# ~0.12 (bfloat16) and ~0.01 (float16) on the bundled model's tokens, float32 by up to ~2e-4 (T = 0.7, batch 16
# against 5); a wrong temperature, stale weights or a shifted position move it by far more.
LOGPROB_TOLERANCES = {torch.float64: 1e-9, torch.float32: 1e-3, torch.bfloat16: 0.25, torch.float16: 0.05}

MISSING = -1  # token id reported where one rollout has no token (it had finished)


@dataclass(frozen=True)
class Mismatch:
    """The first position where two rollouts of one request differ, judged on a fresh forward of the policy.

    position: index in the response; plain_token/spec_token: the tokens there (MISSING past a rollout's end);
    plain_prob/spec_prob: their probabilities under the processed distribution; gap: how far the lower of the two
    tokens' perturbed logits lies below the best (for a swap of the two best, best minus second-best; inf for a token
    outside the support or MISSING); near_tie: the difference is explained by a float tie (see the module docstring).
    """

    position: int
    plain_token: int
    spec_token: int
    plain_prob: float
    spec_prob: float
    gap: float
    near_tie: bool

    @property
    def kind(self) -> str:
        return "near-tie" if self.near_tie else "bug"

    def to_dict(self) -> dict:
        """Plain JSON data: a probability or gap that is not finite (a MISSING token, one outside the support) is
        None."""
        plain = {k: finite_or_none(v) if isinstance(v, float) else v for k, v in asdict(self).items()}
        return {**plain, "kind": self.kind}


def finite_or_none(value: float) -> float | None:
    """``value`` as strict JSON holds it: a finite float as itself, inf and nan as None."""
    return value if math.isfinite(value) else None


def first_difference(plain: list[int], spec: list[int]) -> int | None:
    """Index of the first differing token, len of the shorter one when one is a proper prefix, None if equal."""
    for j, (a, b) in enumerate(zip(plain, spec, strict=False)):
        if a != b:
            return j
    return None if len(plain) == len(spec) else min(len(plain), len(spec))


@torch.inference_mode()
def analyse_mismatch(
    policy: CausalLM,
    prompt_ids: list[int],
    plain: list[int],
    spec: list[int],
    params: SamplingParams,
    seed: int,
    bound: float,
) -> Mismatch | None:
    """Judge the first difference between the plain and speculative tokens of one request; None if equal."""
    j = first_difference(plain, spec)
    if j is None:
        return None
    device = next(policy.parameters()).device
    logits = _fresh_logits(policy, prompt_ids + plain[:j])
    batch = SamplingBatch.from_params([params], [seed], device)
    position = torch.tensor([len(prompt_ids) + j], device=device)
    processed = process_logits(logits, batch.temperature, batch.top_k, batch.top_p)
    probs = torch.softmax(processed, dim=-1)[0]
    a = plain[j] if j < len(plain) else MISSING
    b = spec[j] if j < len(spec) else MISSING
    if params.temperature > 0 and batch.any_filter:
        gap = _filtered_gap(logits, batch, position, params, bound, (a, b))
    else:
        perturbed = perturbed_logits(logits, batch, position)[0].double()
        best = float(perturbed.max())
        gap = max(best - float(perturbed[t]) if t != MISSING else math.inf for t in (a, b))
    near_tie = gap < bound
    return Mismatch(
        position=j,
        plain_token=a,
        spec_token=b,
        plain_prob=float(probs[a]) if a != MISSING else float("nan"),
        spec_prob=float(probs[b]) if b != MISSING else float("nan"),
        gap=gap,
        near_tie=near_tie,
    )


def _fresh_logits(policy: CausalLM, context: list[int]) -> torch.Tensor:
    """The policy's next-token logits after ``context``, from one full forward (no cache).  # [T] ids -> [1,V]"""
    device = next(policy.parameters()).device
    ids = torch.tensor(context, dtype=torch.long, device=device)
    return policy(ids.unsqueeze(0), torch.arange(ids.shape[0], device=device).unsqueeze(0)).logits[:, -1]


def _filtered_gap(
    logits: torch.Tensor, batch: SamplingBatch, position: torch.Tensor, params: SamplingParams, bound: float, tokens
) -> float:
    """The gap of a sampled row under top-k / top-p, with the support's edge taken up to rounding (``support.py``): a
    token no rounding keeps is infinitely far; a kept or possibly kept one lies this far below the best perturbed logit
    among the tokens kept whenever it is (the certain ones, and those more than a rounding above it): a possibly kept
    token with large noise wins where it is kept, but never over a token every such rounding keeps beside it.
    # logits [1,V] -> float"""
    scaled = process_logits(logits, batch.temperature, batch.top_k, batch.top_p, apply_filters=False)  # [1,V]
    # The sampler's arithmetic: the noise goes on the centred row (its maximum is the filtered row's, whose top the
    # filters always keep), so a low temperature's large values do not round the noise away.
    noisy = (centred(scaled) + sampling_noise(batch, position, scaled.shape[-1]))[0].double()  # [V]
    edge = support_range(scaled[0], params.top_k, params.top_p, bound / 2)
    gaps = [_gap_among_rivals(noisy, edge, t) if t != MISSING and edge.is_possible(t) else math.inf for t in tokens]
    return max(gaps)


def _gap_among_rivals(noisy: torch.Tensor, edge: SupportRange, token: int) -> float:
    """How far ``token``'s perturbed logit lies below the best of the tokens kept whenever it is (0 when above them
    all, or when none is).  # noisy [V] -> float"""
    rivals = edge.rivals(token)
    best = float(noisy[rivals].max()) if len(rivals) else -math.inf
    return max(0.0, best - float(noisy[token]))


@torch.inference_mode()
def support_explains_logprobs(
    policy: CausalLM,
    prompt_ids: list[int],
    tokens: list[int],
    params: SamplingParams,
    bound: float,
    excess: list[tuple[int, float]],
    tolerance: float,
) -> bool:
    """Whether the support's edge explains equal tokens' log-prob differences beyond ``tolerance``: ``excess`` holds
    (response position, |difference|); at each a fresh forward must find the filter's support uncertain within
    rounding (``support.py``) by enough to move that token's log-prob by the difference less ``tolerance``. Rows
    without top-k / top-p, and greedy rows (their log-probs are unfiltered), have nothing to explain: False."""
    batch = SamplingBatch.from_params([params], [0], next(policy.parameters()).device)
    if params.temperature <= 0 or not batch.any_filter:  # as analyse_mismatch decides
        return False
    for j, difference in excess:  # in order: a real fault shows at its first position, one forward
        logits = _fresh_logits(policy, prompt_ids + tokens[:j])
        scaled = process_logits(logits, batch.temperature, batch.top_k, batch.top_p, apply_filters=False)[0]
        edge = support_range(scaled, params.top_k, params.top_p, bound / 2)
        if not edge.is_possible(tokens[j]):
            return False
        low, high = edge.logprob_range(tokens[j])
        if difference > tolerance + (high - low):
            return False
    return True


def logprob_tolerance(dtype: torch.dtype, temperature: float = 1.0) -> float:
    """How far apart the log-probs of equal tokens may be in a compute dtype before they count as a bug; sampled rows
    divide logits by T, which scales their rounding by 1/T (as ``near_tie_bound``)."""
    return LOGPROB_TOLERANCES[dtype] * _rounding_scale(temperature)


def near_tie_bound(dtype: torch.dtype, temperature: float) -> float:
    """The tie bound for a compute dtype; sampled rows divide logits by T, which scales their rounding by 1/T."""
    return NEAR_TIE_BOUNDS[dtype] * _rounding_scale(temperature)


def _rounding_scale(temperature: float) -> float:
    """1/T below T = 1 (a greedy row, T = 0, compares raw logits: 1)."""
    return max(1.0, 1.0 / temperature) if temperature > 0 else 1.0
