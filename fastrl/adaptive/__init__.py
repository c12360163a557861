"""Strategy selectors: the predictive bandit (goodput from shared acceptance and calibrated round times), the EMA
tier controller, a fixed strategy, and the workload simulator that compares them against a per-bucket oracle."""

from fastrl.adaptive.bandit import BanditSelector
from fastrl.adaptive.bandit_config import BanditConfig
from fastrl.adaptive.bandit_telemetry import ArmTelemetry, BanditTelemetry, BucketTelemetry, ChoiceRecord
from fastrl.adaptive.buckets import BatchBuckets
from fastrl.adaptive.cost_model import CostModel, CostParams
from fastrl.adaptive.ema import EmaSelector, chain_strategy
from fastrl.adaptive.ema_config import EmaConfig
from fastrl.adaptive.factory import build_selector
from fastrl.adaptive.fixed import FixedSelector

__all__ = [
    "ArmTelemetry",
    "BanditConfig",
    "BanditSelector",
    "BanditTelemetry",
    "BatchBuckets",
    "BucketTelemetry",
    "ChoiceRecord",
    "CostModel",
    "CostParams",
    "EmaConfig",
    "EmaSelector",
    "FixedSelector",
    "build_selector",
    "chain_strategy",
]
