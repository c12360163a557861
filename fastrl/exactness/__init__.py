"""Judging a speculative run against a plain one: the first mismatch, its probabilities, near-tie or bug."""
