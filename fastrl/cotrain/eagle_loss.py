"""The EAGLE training loss with a training-time test (EAGLE-3): the drafter is unrolled on its own outputs as
drafting runs it, and every unrolled step is scored against the policy.

Step 0 is EAGLE-1's loss: entry j reads the policy's feature f_{p-1} and token x_p (p = position of entry j) and
predicts g_p ≈ f_p. Step k (k >= 1) is the k-th draft of a chain rooted at entry j: it reads token x_{p+k} and the
drafter's own step-(k-1) output at the same root, sits at position p+k, and attends to the real entries up to j
plus the chain's own entries of steps 1..k, exactly what a draft step attends to in the drafter's cache. Its target
is f_{p+k}. Each step is one batched forward over every root of the batch (the keys of earlier steps kept in
`UnrolledKV`), and gradients flow through the drafter's own features from step to step.

With a draft vocabulary set on the drafter, the token term is taken over that vocabulary only, as the drafter
drafts: both distributions are the policy's LM head restricted to those K rows (the target is the policy's
distribution conditioned on the draft vocabulary). The head then costs K/V of the full one in training too. Top-1
agreement is not restricted: the drafter's token (its argmax over the K rows) against the policy's top-1 over the
whole vocabulary, so a position whose policy token lies outside the draft vocabulary is a miss, as in drafting; that
costs a full-vocabulary head product (no gradient) per measured target, once per batch, not once per unrolled step
(a training step measures at most ``top1_targets`` targets).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from fastrl.cotrain.feature_sequence import FeatureBatch
from fastrl.cotrain.unrolled_kv import UnrolledKV
from fastrl.json_values import is_int
from fastrl.models.decoder import CausalLM
from fastrl.speculative.drafter import EagleDrafter


@dataclass
class EagleLossConfig:
    """Weights of the loss terms and the depth of the training-time test.

    total = sum_k w_k * (feature_weight * smooth-L1(g, f) + ce_weight * CE(policy, drafter)) / sum_k w_k over the
    unrolled steps k = 0..ttt_steps-1, with w_k = step_weights[k] when given, else step_decay ** k.
    """

    ttt_steps: int = 1
    step_weights: list[float] = field(default_factory=list)
    step_decay: float = 0.8
    feature_weight: float = 1.0
    ce_weight: float = 0.1
    key_prefix = "drafter_trainer"  # how this config's (and the drafter trainer's) errors name their keys

    def __post_init__(self) -> None:
        check_types(self)
        if self.ttt_steps < 1:
            raise ValueError(f"drafter_trainer.ttt_steps must be >= 1 (1 = no unrolling), got {self.ttt_steps}")
        if self.step_weights and len(self.step_weights) != self.ttt_steps:
            raise ValueError(
                f"drafter_trainer.step_weights needs one weight per unrolled step ({self.ttt_steps}), "
                f"got {list(self.step_weights)}"
            )
        weights = list(self.step_weights)
        if weights and not (all(0 <= w < math.inf for w in weights) and 0 < sum(weights) < math.inf):
            raise ValueError(
                f"drafter_trainer.step_weights must be finite and >= 0 with a positive finite sum, got {weights}"
            )
        if not (math.isfinite(self.step_decay) and self.step_decay > 0):
            raise ValueError(f"drafter_trainer.step_decay must be a finite number > 0, got {self.step_decay}")
        decayed = self._raw_weights()  # step_decay ** k when no step_weights are given
        if not weights and not (0.0 < min(decayed) and sum(decayed) < math.inf):
            raise ValueError(
                f"drafter_trainer.step_decay ** k for k < ttt_steps (the step weights) must be positive with a finite "
                f"sum, got {self.step_decay} ** {self.ttt_steps - 1}"
            )
        terms = (self.feature_weight, self.ce_weight)
        if not all(math.isfinite(t) and t >= 0 for t in terms) or sum(terms) <= 0:
            raise ValueError(
                f"drafter_trainer.feature_weight and ce_weight must be finite and >= 0, not both 0; "
                f"got {self.feature_weight}, {self.ce_weight}"
            )

    def _raw_weights(self) -> list[float]:
        """Per-step weights before normalising: step_weights, or step_decay ** k (inf where that overflows)."""
        return list(self.step_weights) or [_power(self.step_decay, k) for k in range(self.ttt_steps)]

    def weights(self) -> list[float]:
        """Per-step weights, normalised to sum to 1."""
        raw = self._raw_weights()
        total = sum(raw)
        return [w / total for w in raw]


def _power(base: float, exponent: int) -> float:
    """``base ** exponent``, inf where a float overflows."""
    try:
        return float(base) ** exponent
    except OverflowError:
        return math.inf


@dataclass
class EagleLoss:
    """Loss terms (scalars, step-weighted), top-1 agreement with the policy at step 0 (EAGLE-1's measure) and at
    every unrolled step, over the batch's targets: the fraction of targets where the token the drafter drafts (its
    argmax over the draft vocabulary) is the policy's top-1 token over its whole vocabulary."""

    total: Tensor
    feature: Tensor
    token: Tensor
    top1: Tensor
    count: int
    step_top1: list[float]


def eagle_loss(
    drafter: EagleDrafter,
    policy: CausalLM,
    batch: FeatureBatch,
    config: EagleLossConfig | None = None,
    feature_noise: float = 0.0,
    top1_targets: int | None = None,
) -> EagleLoss:
    """The step-weighted EAGLE loss of `config` over entries with a target; `head` is ``loss_head``: the policy's
    LM head, restricted to the drafter's draft vocabulary when one is set.

    `feature_noise` adds U(-a, a) to the policy features step 0 reads (EAGLE's robustness to its own predicted
    features; the unrolled steps read the predictions themselves). `top1_targets`: with a draft vocabulary, top-1
    is measured on at most that many targets, evenly spread over the batch (the policy's full-vocabulary top-1
    costs a head product per target: a training step's progress figure need not pay it on every one); None: on
    all.  # batch [B,S] entries -> scalars
    """
    config = config or EagleLossConfig()
    features = batch.features
    if feature_noise > 0:
        features = features + (torch.rand_like(features) * 2 - 1) * feature_noise
    head = loss_head(drafter, policy)
    measured = top1_positions(batch.mask, top1_targets) if drafter.draft_vocab is not None else batch.mask
    full_top1 = policy_top1(policy, batch, measured) if drafter.draft_vocab is not None else None  # else the head's
    weights = config.weights()
    total = feature = token = batch.features.new_zeros(())
    step_top1: list[float] = []
    top1 = batch.features.new_zeros(())
    for k, pred in enumerate(unrolled_predictions(drafter, policy, batch.tokens, features, batch.positions, weights)):
        m = shifted(batch.mask, k, False)
        if not bool(m.any()):
            step_top1.append(float("nan"))
            continue
        pred_m, target_m = pred[m], shifted(batch.targets, k, 0.0)[m]
        step_feature = F.smooth_l1_loss(pred_m, target_m)
        with torch.no_grad():
            target_logp = torch.log_softmax(F.linear(target_m, head), dim=-1)
        pred_logp = torch.log_softmax(F.linear(pred_m, head), dim=-1)
        step_token = -(target_logp.exp() * pred_logp).sum(-1).mean()
        policy_token = target_logp.argmax(-1) if full_top1 is None else shifted(full_top1, k, 0)[m]
        counted = shifted(measured, k, False)[m]  # the targets whose top-1 is measured
        hits = (drafted_tokens(drafter, pred_logp) == policy_token)[counted]
        agree = hits.float().mean().detach() if hits.numel() else pred_m.new_tensor(float("nan"))
        if k == 0:
            top1 = agree
        step_top1.append(float(agree))
        total = total + weights[k] * (config.feature_weight * step_feature + config.ce_weight * step_token)
        feature = feature + weights[k] * step_feature.detach()
        token = token + weights[k] * step_token.detach()
    return EagleLoss(total, feature, token, top1, int(batch.mask.sum()), step_top1)


def unrolled_predictions(
    drafter: EagleDrafter, policy: CausalLM, tokens: Tensor, features: Tensor, positions: Tensor, weights: list[float]
) -> list[Tensor]:
    """The drafter's outputs at every unrolled step (len(weights) of them), root j of step k at index j.

    # tokens [B,S], features [B,S,F], positions [B,S] -> ttt_steps x [B,S,H]   (F = drafter.feature_size)
    """
    check_feature_width(drafter, features)
    if len(weights) == 1:
        return [drafter(policy, tokens, features, positions)]  # causal, no cache
    b, s = tokens.shape
    cache = UnrolledKV()
    slots = torch.arange(b, device=tokens.device)
    preds: list[Tensor] = []
    for k in range(len(weights)):
        mask = ttt_mask(s, k, tokens.device).expand(b, s, (k + 1) * s)
        index = positions + k  # cache index is unused by UnrolledKV; the write order is the layout
        step_features = features if k == 0 else preds[-1]
        preds.append(drafter(policy, shifted(tokens, k, 0), step_features, positions + k, cache, slots, index, mask))
    return preds


def check_feature_width(drafter: EagleDrafter, features: Tensor) -> None:
    """ValueError unless the policy features are as wide as the drafter reads: a fused drafter would otherwise take
    last-layer-only [.., H] features for its own outputs and skip its fuse.  # features [..,F]"""
    if features.shape[-1] != drafter.feature_size:
        raise ValueError(
            f"policy features are [.., {features.shape[-1]}], the drafter reads [.., {drafter.feature_size}] "
            f"(extra_layers {list(drafter.extra_layers)}: policy_features needs the same extra_layers)"
        )


def ttt_mask(s: int, k: int, device: torch.device) -> Tensor:
    """Who step k's root j attends to among the (k+1)·S entries of steps 0..k: the real (step-0) entries up to j,
    and its own chain's entries of steps 1..k (the diagonal of each).  # -> [S,(k+1)S] bool"""
    causal = torch.ones(s, s, dtype=torch.bool, device=device).tril()
    diagonal = torch.eye(s, dtype=torch.bool, device=device)
    return torch.cat([causal] + [diagonal] * k, dim=-1)


def shifted(x: Tensor, k: int, fill: float | bool) -> Tensor:
    """x moved k entries left along the sequence axis, `fill` in the k freed entries.  # [B,S,...] -> [B,S,...]"""
    if k == 0:
        return x
    pad = torch.full_like(x[:, :k], fill)
    return torch.cat([x[:, k:], pad], dim=1)


def loss_head(drafter: EagleDrafter, policy: CausalLM) -> Tensor:
    """The LM-head rows the token term uses (detached: the policy is not trained here), in the drafter's dtype.
    # -> [K,H] (K = V if unset)

    A fresh copy, not the drafter's cached ``draft_head``: that one may have been built under inference mode by a
    decode round, and autograd cannot save an inference tensor for backward.
    """
    weight = policy.lm_head.weight.detach()
    if drafter.draft_vocab is not None:
        weight = weight.index_select(0, drafter.draft_vocab.to(weight.device))
    return weight.to(drafter.fc.weight.dtype)  # the rows first: only they are cast


def drafted_tokens(drafter: EagleDrafter, logits: Tensor) -> Tensor:
    """The token ids the drafter drafts greedily from its logits over the draft vocabulary.  # [N,K] -> [N] long"""
    index = logits.argmax(-1)
    return index if drafter.draft_vocab is None else drafter.draft_vocab.to(index.device)[index]


def top1_positions(mask: Tensor, limit: int | None) -> Tensor:
    """At most `limit` of the targets in `mask`, evenly spaced in row-major order (all when None or when there are
    no more).  # mask [B,S] bool -> [B,S] bool"""
    count = int(mask.sum())
    if limit is None or count <= limit:
        return mask
    flat = mask.flatten().nonzero().squeeze(1)  # the targets' flat indices
    chosen = flat[torch.linspace(0, count - 1, limit, device=mask.device).round().long()]
    out = torch.zeros(mask.numel(), dtype=torch.bool, device=mask.device)
    out[chosen] = True
    return out.view_as(mask)


@torch.no_grad()
def policy_top1(policy: CausalLM, batch: FeatureBatch, where: Tensor, rows: int = 1024) -> Tensor:
    """The policy's top-1 token over its whole vocabulary at the targets of `batch` that `where` marks (0
    elsewhere), through its LM head `rows` targets at a time so that the [N,V] logits are never all held.
    # where [B,S] bool -> [B,S] long"""
    weight = policy.lm_head.weight.detach().to(batch.targets.dtype)
    chunks = batch.targets[where].split(rows)  # one empty chunk when there is no target
    out = torch.zeros(batch.mask.shape, dtype=torch.long, device=batch.mask.device)
    out[where] = torch.cat([F.linear(c, weight).argmax(-1) for c in chunks]).to(out.device)
    return out


def check_types(config: object) -> None:
    """ValueError naming the key (``drafter_trainer.KEY``) for a field of a loss or trainer config whose value is not
    of its annotated kind: an int field takes an integer, a float field a number, a list of floats numbers (a config
    built from a dict, as verl's options are, may hold "fast" or "2"). Booleans are neither."""
    for f in dataclasses.fields(config):
        value, kind = getattr(config, f.name), str(f.type)
        if kind == "int":
            ok = is_int(value)
        elif kind == "float":
            ok = isinstance(value, int | float) and not isinstance(value, bool)
        elif kind == "list[float]":
            ok = isinstance(value, list | tuple) and all(
                isinstance(v, int | float) and not isinstance(v, bool) for v in value
            )
        else:
            continue
        if not ok:
            raise ValueError(f"drafter_trainer.{f.name} must be {_KINDS[kind]}, got {value!r}")


_KINDS = {"int": "an integer", "float": "a number", "list[float]": "a list of numbers"}
