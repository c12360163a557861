"""fastrl: exact, adaptive EAGLE speculative decoding for RL rollouts."""

__version__ = "0.1.0"
