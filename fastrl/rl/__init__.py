"""GRPO training of the policy, with rollouts from a RolloutBackend."""
