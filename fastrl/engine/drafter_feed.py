"""What each slot's drafter has not read yet, kept on the device and indexed by slot (see
fastrl.speculative.drafting for what an entry is: token x_p read with feature f_{p-1}).

A prefill (or the recompute of a preempted request) feeds the drafter its prompt at once, all but the last entry,
which stays pending as the next round's root (at a prefill with shared prompts, only over the rows that ran the
policy: their siblings hold the same drafter entries through the shared pages). Every decode round appends the
entries it emitted with a few batched writes, whatever the batch size; a speculative round takes every row's
pending entries in one gather and the drafter reads them (`catch_up`). The host keeps each slot's pending count as
a plain int (it knows what every round emitted), so sizing a round's input or placing a write needs no read of a
device value.

A slot holds at most ``max_width`` entries (``backlog_limit``): where plain rounds run for long (a selector that
keeps plain decoding at large batch) the entries would otherwise grow to the longest response, each with its
features: [slots, W, F] in the rollout dtype, ~300 MB per worker for the bundled model's default `fastrl train`
(float64, fused features, W doubling to 1,024), and for a 7B policy with fused features at 256 slots 5.5 GB per
thousand entries. A round that could pass the limit first has the drafter read those slots' entries but the last
(the runner's ``_bound_backlog``): the reading a later drafter round would do anyway, for the rows long enough to
reach it, which are the rows the long tail's speculation decodes.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fastrl.engine.prefill_groups import length_groups, padded_width
from fastrl.speculative.drafting import DrafterInput, catch_up
from fastrl.speculative.round import SpecModels

BACKLOG_BYTES = 256 * 2**20
"""What every slot's unread drafter entries take at most, unless ``EngineConfig.drafter_backlog`` says otherwise:
about 900 entries a slot for the bundled model's `fastrl train` workers (64 slots, float64, fused features), 48 for a
7B policy's fused features in bfloat16 at 256 slots (then ``MIN_BACKLOG``)."""
MIN_BACKLOG = 64
"""Fewest entries a slot holds by default: the drafter then reads a long plain stretch in chunks of 64 or more."""


class DrafterFeed:
    """Device tensors indexed by slot: tokens [S,W] long, features [S,W,F] (each slot's valid entries
    left-aligned); W grows when a round would write past it. F is the drafter's `feature_size`: H, or
    (len(extra_layers) + 1) * H for a fused drafter, whose entries then hold the policy's fused features. How many
    entries each slot holds lives on the host only: it is known from what every round emitted, so a write's flat
    position is one host-made index and a round needs no device count."""

    def __init__(
        self,
        num_slots: int,
        feature_size: int,
        dtype: torch.dtype,
        device: torch.device,
        width: int,
        max_width: int | None = None,
    ) -> None:
        if max_width is not None and max_width < 2:
            raise ValueError(f"DrafterFeed: max_width must be >= 2 (a root and one entry), got {max_width}")
        self.max_width = max_width
        """Most entries one slot holds (None: no limit); ``full`` names the slots an append could pass it in."""
        width = width if max_width is None else min(width, max_width)
        self.device = device
        self.tokens = torch.zeros(num_slots, width, dtype=torch.long, device=device)
        self.features = torch.zeros(num_slots, width, feature_size, dtype=dtype, device=device)
        self._pending = [0] * num_slots  # valid entries of each slot
        self._behind = [False] * num_slots  # a round without the drafter appended since the slot's last take
        self._steps: dict[int, Tensor] = {}  # arange(k) per write width k
        self._taken: list[tuple[int, int, bool]] = []  # (slot, pending, behind) before the last take
        self._flatten()

    def clear(self, slot_ids: list[int]) -> None:
        """Nothing pending for these slots (newly admitted requests)."""
        for slot in slot_ids:
            self._pending[slot] = 0
            self._behind[slot] = False

    def append(
        self,
        slot_ids: list[int],
        tokens: Tensor,
        features: Tensor,
        counts: list[int],
        drafted: bool = True,
    ) -> None:
        """Queue `counts[b]` entries of row b after what its slot holds (entries past a row's count are written
        too, as padding the next append overwrites); `drafted` False: a round that did not run the drafter emitted
        them (see ``behind``). One that raises (e.g. an allocation failing) has written nothing over what the slots
        hold nor changed a count (it may have grown the width), so the last ``take`` can still be undone; once it
        completes, that take is final (``restore_take`` does nothing).  # tokens [B,K], features [B,K,F]"""
        if features.shape[-1] != self.features.shape[-1]:
            width = self.features.shape[-1]
            raise ValueError(f"DrafterFeed: features are [.., {features.shape[-1]}], the drafter reads [.., {width}]")
        if len(counts) != len(slot_ids):
            raise ValueError(f"DrafterFeed: {len(counts)} counts for {len(slot_ids)} slots")
        k = tokens.shape[1]
        self._fit(self.widest(slot_ids) + k)
        w = self.tokens.shape[1]
        flat = self._on_device([s * w + self._pending[s] for s in slot_ids])  # [B] flat positions of column 0
        if k > 1:
            flat = (flat.unsqueeze(1) + self._step(k)).reshape(-1)  # [B*K]
        # every allocation before the first write: a failure then leaves the slots' entries as they were
        new_tokens = tokens.reshape(-1)
        new_features = features.to(self.features.dtype).reshape(-1, features.shape[-1])
        self._flat_tokens.index_copy_(0, flat, new_tokens)
        self._flat_features.index_copy_(0, flat, new_features)
        for slot, count in zip(slot_ids, counts, strict=True):
            self._pending[slot] += count
            self._behind[slot] = self._behind[slot] or not drafted
        self._taken = []  # written over the entries a take left in place: they cannot be pending again

    def full(self, slot_ids: list[int], entries: int) -> list[int]:
        """The slots among ``slot_ids`` where appending ``entries`` more could pass ``max_width`` (none without a
        limit): their drafter must read what they hold first."""
        if self.max_width is None:
            return []
        return [s for s in slot_ids if self._pending[s] + entries > self.max_width]

    def widest(self, slot_ids: list[int]) -> int:
        """The most entries pending for one of these slots."""
        return max(self._pending[s] for s in slot_ids)

    def behind(self, slot_ids: list[int]) -> bool:
        """True when a round without the drafter (plain, history only) emitted tokens for one of these slots since
        its drafter last read: the next speculative round's catch-up then reads them all."""
        return any(self._behind[s] for s in slot_ids)

    def backlog(self, slot_ids: list[int]) -> int:
        """Entries a drafter round over these slots would read first as a catch-up (``behind``): every slot's pending
        entries but its root when one of them is behind, else 0."""
        if not self.behind(slot_ids):
            return 0
        return sum(self._pending[s] for s in slot_ids) - len(slot_ids)

    def take(self, slots: Tensor, slot_ids: list[int]) -> DrafterInput:
        """Every row's pending entries (one gather per field), then none pending.  # -> [B,K], [B,K,F], [B]"""
        self._taken = []
        pending = [self._pending[s] for s in slot_ids]
        width = max(pending)
        if min(pending) < 1:
            raise RuntimeError("a request reached a speculative round with nothing for its drafter to read")
        # index_select of the first `width` columns: ~1.6-2x faster than advanced indexing on a CPU at 64-256 rows
        tokens, features = (
            self.tokens[:, :width].index_select(0, slots),
            self.features[:, :width].index_select(0, slots),
        )
        taken = DrafterInput(tokens, features, self._on_device(pending))
        self._taken = [(s, n, self._behind[s]) for s, n in zip(slot_ids, pending, strict=True)]
        self.clear(slot_ids)
        return taken

    def restore_take(self) -> None:
        """Undo the last ``take``: its round failed before it emitted anything, so the entries (still in place: a
        take copies them) are pending again for the next round to read."""
        for slot, pending, behind in self._taken:
            self._pending[slot], self._behind[slot] = pending, behind
        self._taken = []

    def _on_device(self, values: list[int]) -> Tensor:
        """A long tensor of host ints on the feed's device.  # -> [len(values)]"""
        host = torch.tensor(values, dtype=torch.long)
        return host if self.device.type == "cpu" else host.to(self.device, non_blocking=True)

    def _step(self, k: int) -> Tensor:
        """arange(k) on the device, made once per width."""
        if k not in self._steps:
            self._steps[k] = torch.arange(k, device=self.device)
        return self._steps[k]

    def _fit(self, width: int) -> None:
        """Grow the width to at least `width` entries (doubling, at most ``max_width``), keeping what is held."""
        old = self.tokens.shape[1]
        if width <= old:
            return
        if self.max_width is not None and width > self.max_width:
            raise RuntimeError(f"DrafterFeed: {width} entries asked of a slot, at most {self.max_width} held")
        new = max(width, 2 * old) if self.max_width is None else min(max(width, 2 * old), self.max_width)
        tokens = torch.zeros(self.tokens.shape[0], new, dtype=torch.long, device=self.device)
        features = self.features.new_zeros(self.features.shape[0], new, self.features.shape[2])
        tokens[:, :old], features[:, :old] = self.tokens, self.features
        self.tokens, self.features = tokens, features
        self._flatten()

    def _flatten(self) -> None:
        """Flat views of the two tensors, which writes index by slot * W + column."""
        self._flat_tokens = self.tokens.view(-1)  # [S*W]
        self._flat_features = self.features.view(-1, self.features.shape[2])  # [S*W,F]


def feed_prompts(
    models: SpecModels,
    feed: DrafterFeed,
    slots: Tensor,
    slot_ids: list[int],
    tokens: list[list[int]],
    features: Tensor,
    computed: list[int] | None = None,
) -> None:
    """Feed the drafter every entry of fresh sequences but the last, which stays pending as the root of the next
    round: entry p (1 <= p < T) reads token p with feature p-1; `tokens[b]` are row b's T tokens (prompt, or the
    prompt and output of a recomputed request) followed by its next token, `features` the prefill's features.

    `computed` (ascending rows; None: every row) names the rows whose entries 1..T-1 the drafter computes: the other
    rows are GRPO siblings of one of them, holding its prompt's full pages by reference, and get their partial last
    page as a copy of its drafter page, which the caller makes after this catch-up. Every row gets its own pending
    root (its own next token).

    # slots [B], features [B,S,F] (S >= T_b) -> drafter cache entries 1..T_b-1 of the computed rows written, one
    # entry pending per row
    """
    feed.clear(slot_ids)
    sizes = [len(t) - 1 for t in tokens]  # T_b: entries 1..T_b-1 now, entry T_b pending
    b = len(tokens)
    rows = torch.arange(b, device=feed.device)
    last = torch.tensor(sizes, dtype=torch.long, device=feed.device) - 1
    root_tokens = torch.tensor([t[-1] for t in tokens], dtype=torch.long, device=feed.device).unsqueeze(1)
    run = list(range(b)) if computed is None else computed
    counts = last.clamp(min=0)
    for members in length_groups([sizes[row] for row in run]):  # rows of similar lengths together (less padding)
        group = [run[i] for i in members]
        width = max(sizes[row] for row in group)
        if width <= 1:
            continue
        columns = padded_width(width - 1, features.shape[1])  # the prefill's features cover them
        padded = torch.tensor([tokens[row][1:-1] + [0] * (columns + 1 - sizes[row]) for row in group])  # [R,cols]
        take = torch.tensor(group, dtype=torch.long, device=feed.device)
        prefix = DrafterInput(
            padded.to(feed.device), features[:, :columns].index_select(0, take), counts.index_select(0, take)
        )
        dslots = models.dcache.rows(slots.index_select(0, take))
        # padding goes to entry width + 1; in PyTorch's ops whatever the row count, so that GRPO siblings fed once
        # (prefix sharing) hold bitwise the entries each would have been fed alone
        catch_up(models.drafter, models.policy, models.dcache, dslots, prefix.counts, width, prefix, step_kernel=False)
    feed.append(slot_ids, root_tokens, features[rows, last].unsqueeze(1), [1] * b)


def backlog_limit(
    configured: int | None, num_slots: int, feature_size: int, dtype: torch.dtype, context: int, lookahead: int
) -> int:
    """Most entries a slot's feed holds: ``configured`` (``EngineConfig.drafter_backlog``), else what keeps every
    slot's tokens and features within ``BACKLOG_BYTES`` (at least ``MIN_BACKLOG`` entries, at most the context);
    never fewer than a round's entries after the one kept as the root."""
    if configured is None:
        entry = feature_size * torch.empty((), dtype=dtype).element_size() + 8  # its features and its token id
        configured = min(max(BACKLOG_BYTES // (num_slots * entry), MIN_BACKLOG), context)
    return max(configured, lookahead + 1)
