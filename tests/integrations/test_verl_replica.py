"""``FastrlReplica``'s checks in the driver (no Ray needed): verl's own rollout keys are named as verl's, before any
server starts."""

from __future__ import annotations

import pytest

pytest.importorskip("verl")

from fastrl.integrations.verl.local import FASTRL  # noqa: E402
from tests.integrations.verl_setup import verl_config  # noqa: E402


def _replica(extra: list[str], **kwargs: object):
    from fastrl.integrations.verl.replica import FastrlReplica

    config = verl_config(extra)
    rollout, model = config.actor_rollout_ref.rollout, config.actor_rollout_ref.model
    return FastrlReplica(replica_rank=0, config=rollout, model_config=model, gpus_per_node=2, **kwargs)


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        # blamed on custom.fastrl.max_model_len, an option that does not exist
        (
            ["actor_rollout_ref.rollout.max_model_len=1"],
            r"^actor_rollout_ref\.rollout\.max_model_len \(or "
            r"prompt_length \+ response_length\) must be >= 2, got 1$",
        ),
        # accepted in the driver (it checked seed 0), then "custom.fastrl.seed" inside the server actor
        (["actor_rollout_ref.rollout.seed=-1"], r"^actor_rollout_ref\.rollout\.seed must be in \[0, 2\*\*63\), got -1"),
        # never checked in the driver (it checked the CPU's float32), then "custom.fastrl.dtype" in the server
        (
            [f"{FASTRL}device=auto", "actor_rollout_ref.rollout.dtype=bf16"],
            r"^actor_rollout_ref\.rollout\.dtype must "
            r"be one of \['bfloat16', 'float16', 'float32', 'float64'\], got 'bf16'$",
        ),
    ],
)
def test_a_bad_verl_rollout_value_is_refused_in_the_driver_naming_verls_key(extra, said):
    with pytest.raises(ValueError, match=said):
        _replica(extra)


def test_fastrl_options_that_take_over_verls_values_are_named_when_bad_and_spare_verls():
    """``custom.fastrl.seed`` / ``dtype`` replace verl's rollout values: a bad verl value is then unused."""
    replica = _replica(["actor_rollout_ref.rollout.seed=-1", f"{FASTRL}seed=3"])
    assert replica.options.seed == 3
    _replica([f"{FASTRL}device=auto", f"{FASTRL}dtype=float32", "actor_rollout_ref.rollout.dtype=bf16"])
    _replica(["actor_rollout_ref.rollout.dtype=bf16"])  # on the CPU verl's dtype is unused: float32
    with pytest.raises(ValueError, match=r"^actor_rollout_ref\.rollout\.custom\.fastrl\.max_batch_size must be >= 1"):
        _replica([f"{FASTRL}max_batch_size=0"])


def test_a_distillation_teacher_is_refused_naming_verls_key():
    """verl's teacher loop sends every request prompt_logprobs and detokenize and reads extra_fields["prompt_ids"] /
    ["prompt_logprobs"]: a fastrl teacher started (its servers named for the teacher, docs/verl.md promised it) and
    then failed every request ("sampling_params.detokenize: not supported")."""
    from verl.experimental.teacher_loop.teacher_manager import _get_teacher_sampling_params  # noqa: F401 (exists)

    with pytest.raises(ValueError, match=r"^distillation\.teacher_models\.<teacher>\.inference\.name=fastrl "
                       r"\(teacher 'openai_gsm8k'\): .*set it to vllm or sglang"):  # fmt: skip
        _replica([], is_teacher_model=True, name_suffix="openai_gsm8k")
    assert _replica([], is_reward_model=True).role == "reward_"  # a generative reward model is served
