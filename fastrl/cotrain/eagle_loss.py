"""The EAGLE training loss: regress the next policy feature, and match the policy's next-token distribution.

With a draft vocabulary set on the drafter, the token term is taken over that vocabulary only, as the drafter
drafts: both distributions are the policy's LM head restricted to those K rows (the target is the policy's
distribution conditioned on the draft vocabulary). The head then costs K/V of the full one in training too.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from fastrl.cotrain.feature_sequence import FeatureBatch
from fastrl.models.decoder import CausalLM
from fastrl.speculative.drafter import EagleDrafter

CE_WEIGHT = 0.1


@dataclass
class EagleLoss:
    """Loss terms (scalars) and top-1 agreement with the policy over the batch's targets."""

    total: Tensor
    feature: Tensor
    token: Tensor
    top1: Tensor
    count: int


def eagle_loss(
    drafter: EagleDrafter,
    policy: CausalLM,
    batch: FeatureBatch,
    feature_noise: float = 0.0,
    ce_weight: float = CE_WEIGHT,
) -> EagleLoss:
    """smooth-L1(g_p, f_p) + ce_weight * CE(softmax(head(f_p)), head(g_p)) over entries with a target; `head` is
    ``loss_head``: the policy's LM head, restricted to the drafter's draft vocabulary when one is set.

    `feature_noise` adds U(-a, a) to the input features (EAGLE's robustness to its own predicted features).
    # batch [B,S] entries -> scalars
    """
    features = batch.features
    if feature_noise > 0:
        features = features + (torch.rand_like(features) * 2 - 1) * feature_noise
    pred = drafter(policy, batch.tokens, features, batch.positions)  # [B,S,H], causal, no cache
    m = batch.mask
    pred_m, target_m = pred[m], batch.targets[m]
    feature = F.smooth_l1_loss(pred_m, target_m)
    head = loss_head(drafter, policy)
    with torch.no_grad():
        target_logp = torch.log_softmax(F.linear(target_m, head), dim=-1)
    pred_logp = torch.log_softmax(F.linear(pred_m, head), dim=-1)
    token = -(target_logp.exp() * pred_logp).sum(-1).mean()
    top1 = (pred_logp.argmax(-1) == target_logp.argmax(-1)).float().mean()
    return EagleLoss(feature + ce_weight * token, feature.detach(), token.detach(), top1.detach(), int(m.sum()))


def loss_head(drafter: EagleDrafter, policy: CausalLM) -> Tensor:
    """The LM-head rows the token term uses (detached: the policy is not trained here).  # -> [K,H] (K = V if unset)

    A fresh copy, not the drafter's cached ``draft_head``: that one may have been built under inference mode by a
    decode round, and autograd cannot save an inference tensor for backward.
    """
    weight = policy.lm_head.weight.detach()
    if drafter.draft_vocab is None:
        return weight
    return weight.index_select(0, drafter.draft_vocab.to(weight.device))
