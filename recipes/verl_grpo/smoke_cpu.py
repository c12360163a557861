"""CPU smoke run of the recipe: verl's agent-loop rollout (AgentLoopManager -> AgentLoopWorker -> LLMServerClient ->
fastrl servers) on the bundled model, with the recipe's overlay. verl's trainer step needs GPUs; this is the part
of a GRPO step that runs anywhere.

    python recipes/verl_grpo/smoke_cpu.py [key=value ...]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from fastrl.assets_path import bundled_drafter_dir, bundled_model_dir
from fastrl.integrations.verl.local import FASTRL, LocalRollout, chat_batch, compose_verl_config, cpu_overrides

PROMPTS = ["sum a=20 b=51 =", "sum a=10 b=69 c=13 d=47 =", "sum a=65 b=28 =", "sum a=3 b=94 c=12 ="]
GROUP = 4


def main(extra: list[str]) -> None:
    from verl.trainer.ppo.ray_trainer import compute_spec_decode_metrics

    overrides = cpu_overrides(bundled_model_dir(), bundled_drafter_dir(), replicas=2, response_length=48)
    overrides += [f"actor_rollout_ref.rollout.n={GROUP}", f"{FASTRL}max_batch_size=16", *extra]
    config = compose_verl_config(overrides, Path(__file__).parent / "config", name="fastrl_grpo")
    local = LocalRollout.start(config)
    try:
        for step in range(2):
            start = time.perf_counter()
            out = local.agent_loops.generate_sequences(chat_batch(PROMPTS, GROUP))
            seconds = time.perf_counter() - start
            spec = compute_spec_decode_metrics(*(out.non_tensor_batch[k] for k in (
                "spec_num_draft_tokens", "spec_num_accepted_tokens", "spec_num_verify_steps")))  # fmt: skip
            lengths = out.batch["response_mask"].sum(dim=1)
            accept_length, accept_rate = spec["rollout/spec_accept_length"], spec["rollout/spec_accept_rate"]
            print(
                f"rollout {step}: {len(out)} responses in {seconds:.1f}s, mean length {lengths.float().mean():.1f}, "
                f"accept length {accept_length:.2f}, accept rate {accept_rate:.2f}"
            )
            local.sleep_and_wake()  # the trainer's sleep_replicas: co-trained drafters are merged here
            for r in local.reports():
                rounds = r.strategy_rounds
                print(f"  {r.name}: drafter v{r.drafter_version}, co-train steps {r.cotrain_steps}, rounds {rounds}")
    finally:
        local.shutdown()


if __name__ == "__main__":
    if {"-h", "--help"} & set(sys.argv[1:]):
        print(__doc__)
        sys.exit(0)
    main(sys.argv[1:])
