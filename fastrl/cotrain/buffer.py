"""A bounded buffer of drafter training sequences that favours the most recent policy versions."""

from __future__ import annotations

import random
from collections import deque

import torch
from torch import Tensor

from fastrl.cotrain.feature_sequence import FeatureSequence


class FeatureBuffer:
    """FeatureSequences kept by policy version, bounded by their total number of tokens.

    Retention: only the newest ``retention_versions`` policy versions are kept (0 = all); when the buffer is over
    ``capacity_tokens`` the oldest version is evicted first and, within a version, the oldest sequence first.
    ``sample`` draws without replacement with weight ``recency_decay ** (newest - version)`` per sequence, so the
    drafter mostly follows the current policy while older data still regularises it.

    ``feature_size`` (None: any) is the width F of every sequence's features, the drafter's input: H, or
    (len(extra_layers) + 1) * H for a fused drafter, whose entries then take F / H times the memory
    (``num_bytes``); a sequence of another width is a ValueError.
    """

    def __init__(
        self,
        capacity_tokens: int,
        retention_versions: int = 0,
        recency_decay: float = 1.0,
        feature_size: int | None = None,
    ) -> None:
        if capacity_tokens < 2:
            raise ValueError(f"FeatureBuffer.capacity_tokens must be >= 2, got {capacity_tokens}")
        if retention_versions < 0:
            raise ValueError(f"FeatureBuffer.retention_versions must be >= 0, got {retention_versions}")
        if not 0 < recency_decay <= 1:
            raise ValueError(f"FeatureBuffer.recency_decay must be in (0, 1], got {recency_decay}")
        self.capacity_tokens = capacity_tokens
        self.retention_versions = retention_versions
        self.recency_decay = recency_decay
        if feature_size is not None and feature_size < 1:
            raise ValueError(f"FeatureBuffer.feature_size must be >= 1, got {feature_size}")
        self.feature_size = feature_size
        self._by_version: dict[int, deque[FeatureSequence]] = {}
        self._tokens = 0
        self._sequences = 0

    @property
    def num_tokens(self) -> int:
        """Entries held, over all sequences."""
        return self._tokens

    @property
    def num_bytes(self) -> int:
        """Memory held by the sequences' tokens and features."""
        return sum(
            s.tokens.numel() * s.tokens.element_size() + s.features.numel() * s.features.element_size()
            for seqs in self._by_version.values()
            for s in seqs
        )

    @property
    def num_sequences(self) -> int:
        return self._sequences

    @property
    def versions(self) -> list[int]:
        """Policy versions present, oldest first."""
        return sorted(self._by_version)

    def __len__(self) -> int:
        return self._sequences

    def add(self, seq: FeatureSequence) -> None:
        """Keep ``seq`` (cut to the capacity); sequences without a target (< 2 tokens) or from a version older than
        the retention window are dropped. Evicts as needed. ValueError when its feature width is not
        ``feature_size``, or a feature is not finite (kept, one would fail every training step that samples it:
        callers leave such sequences out, as co-training does, and say so)."""
        if self.feature_size is not None and seq.features.shape[-1] != self.feature_size:
            raise ValueError(
                f"FeatureBuffer: a sequence's features are [.., {seq.features.shape[-1]}], this buffer holds the "
                f"drafter's input [.., {self.feature_size}] (feature_size)"
            )
        if seq.tokens.shape[0] < 2:
            return
        if not seq.finite:
            raise ValueError("FeatureBuffer: a sequence's features hold a NaN or an infinity")
        if seq.tokens.shape[0] > self.capacity_tokens:
            n = self.capacity_tokens
            seq = FeatureSequence(seq.tokens[:n], seq.features[:n], seq.start_position, seq.policy_version)
        newest = max(self._by_version, default=seq.policy_version)
        if self.retention_versions and seq.policy_version <= max(newest, seq.policy_version) - self.retention_versions:
            return
        self._by_version.setdefault(seq.policy_version, deque()).append(seq)
        self._tokens += seq.tokens.shape[0]
        self._sequences += 1
        self._retain()

    def extend(self, seqs: list[FeatureSequence]) -> None:
        for seq in seqs:
            self.add(seq)

    def clear(self) -> None:
        self._by_version.clear()
        self._tokens = 0
        self._sequences = 0

    def sequences(self) -> list[FeatureSequence]:
        """The buffer's sequences, oldest version first and in their order within it (the sequences themselves,
        which nothing changes in place: a list of them is a snapshot)."""
        return [s for v in self.versions for s in self._by_version[v]]

    def state(self) -> tuple[dict[str, Tensor], dict]:
        """``sequences_state`` of the buffer's sequences."""
        return sequences_state(self.sequences())

    def load_state(self, tensors: dict[str, Tensor], meta: dict) -> None:
        """Replace the contents with what ``state()`` returned (ValueError when the lengths do not add up)."""
        seqs = sequences_from_state(tensors, meta, "FeatureBuffer.load_state")
        self.clear()
        for seq in seqs:
            self._by_version.setdefault(int(seq.policy_version), deque()).append(seq)
            self._tokens += int(seq.tokens.shape[0])
            self._sequences += 1

    def sample(self, batch_tokens: int, rng: random.Random) -> list[FeatureSequence]:
        """A recency-weighted draw without replacement whose padded batch (rows x the longest, what the trainer
        computes over: `FeatureBatch.collate`) holds at most ``batch_tokens`` entries, as `make_batches` bounds one
        (at least one sequence whenever the buffer is not empty); [] when it is empty.

        The batch's first sequence is drawn by recency weight x length, the rest among sequences of its length class
        (within 2x of each other) by recency weight, then whatever still fits: each class gets its share of the
        buffer's tokens, the long responses of the tail included (a draw over all lengths that skipped what would
        widen the batch past the budget left long sequences out after a few short ones), and the class's sequences
        pad under 2x (those added after it may pad more, within the budget)."""
        if not self._sequences:
            return []
        newest = max(self._by_version)
        keyed = []
        for version, seqs in self._by_version.items():
            weight = self.recency_decay ** (newest - version)  # 0.0 once a version is far behind (underflow)
            for seq in seqs:
                # Efraimidis-Spirakis: the largest u ** (1 / w) keys are a weighted sample without replacement; a
                # weight of 0 keys 0.0, what u ** (1 / w) tends to (its draw taken all the same)
                u, n = rng.random(), seq.tokens.shape[0]
                by_tokens = u ** (1.0 / (weight * n)) if weight > 0 else 0.0
                keyed.append((u ** (1.0 / weight) if weight > 0 else 0.0, by_tokens, seq))
        first = max(keyed, key=lambda item: item[1])[2]
        length_class = first.tokens.shape[0].bit_length()
        keyed.sort(key=lambda item: item[0], reverse=True)
        chosen, taken = [first], {id(first)}
        width = chosen[0].tokens.shape[0]
        for same_class in (True, False):  # its class first; then whatever still fits (all of it, given room)
            for _, _, seq in keyed:
                n = seq.tokens.shape[0]
                if id(seq) in taken or (n.bit_length() == length_class) != same_class:
                    continue
                if (len(chosen) + 1) * max(width, n) > batch_tokens:
                    continue
                chosen.append(seq)
                taken.add(id(seq))
                width = max(width, n)
                if len(chosen) * width >= batch_tokens:
                    return chosen
        return chosen

    def _retain(self) -> None:
        newest = max(self._by_version)
        if self.retention_versions:
            for version in [v for v in self._by_version if v <= newest - self.retention_versions]:
                self._drop_version(version)
        while self._tokens > self.capacity_tokens and self._sequences > 1:
            oldest = min(self._by_version)
            seq = self._by_version[oldest].popleft()
            self._tokens -= seq.tokens.shape[0]
            self._sequences -= 1
            if not self._by_version[oldest]:
                del self._by_version[oldest]

    def _drop_version(self, version: int) -> None:
        seqs = self._by_version.pop(version)
        self._tokens -= sum(s.tokens.shape[0] for s in seqs)
        self._sequences -= len(seqs)


def sequences_state(seqs: list[FeatureSequence]) -> tuple[dict[str, Tensor], dict]:
    """Sequences as checkpoint tensors: ``tokens`` [N] and ``features`` [N,F] concatenated in order, and a
    JSON-serialisable dict with each sequence's (length, start_position, policy_version)."""
    meta = {"sequences": [[int(s.tokens.shape[0]), s.start_position, s.policy_version] for s in seqs]}
    if not seqs:
        return {}, meta
    tensors = {
        "tokens": torch.cat([s.tokens for s in seqs]).contiguous(),
        "features": torch.cat([s.features for s in seqs]).contiguous(),
    }
    return tensors, meta


def sequences_from_state(tensors: dict[str, Tensor], meta: dict, where: str) -> list[FeatureSequence]:
    """What ``sequences_state`` wrote (ValueError naming ``where`` when the lengths do not add up)."""
    rows = meta.get("sequences") if isinstance(meta, dict) else None
    if not isinstance(rows, list):
        raise ValueError(f"{where}: 'sequences' is missing")
    total = sum(int(r[0]) for r in rows)
    have = int(tensors["tokens"].shape[0]) if rows else 0
    if total != have or (rows and tensors["features"].shape[0] != have):
        raise ValueError(f"{where}: sequences hold {total} tokens, the tensors {have}")
    seqs, offset = [], 0
    for length, start, version in rows:
        end = offset + int(length)
        seqs.append(FeatureSequence(tensors["tokens"][offset:end], tensors["features"][offset:end], start, version))
        offset = end
    return seqs
