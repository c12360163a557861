"""Which KV pages each slot holds: allocation as tokens arrive, release at finish, shared prompt pages by reference.

Pure host bookkeeping (no tensors): the scheduler asks it for pages, the runner applies what changed
(`drain`) to the device page table before its next forward.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field


@dataclass
class PageUpdates:
    """What changed since the last drain.

    table: (slot, column) -> pool page, or None for "back to the slot's scratch" (the last change wins);
    fresh: pages handed out (already zero: never written, or zeroed when freed); freed: pages nobody holds any
    more, to be zeroed (a home view attends over them, masked, and masked keys must be finite; nothing writes a
    page nobody holds, so a freed page stays zero until it is handed out again); copies: (src, dst) page copies to
    run after the prefill that fills src (a shared prompt's partial last page, which each sibling continues on its own).
    """

    table: dict[tuple[int, int], int | None] = field(default_factory=dict)
    fresh: list[int] = field(default_factory=list)
    freed: list[int] = field(default_factory=list)
    copies: list[tuple[int, int]] = field(default_factory=list)


class PagePool:
    """Pages `[0, num_pages)` of `page_size` entries; slot s holds `pages_of(s)` in column order.

    Free pages are handed out lowest id first, so memory that was never used stays untouched. A page shared by
    several slots (a GRPO group's prompt) is freed when its last holder releases it.

    With `home_stride` R (a pool of R pages per slot, as the default pool is), column c of slot s takes page
    `s * R + c` when it is free: a slot whose pages are all its own (`at_home`) holds entries at fixed places,
    which attention can read as a view instead of a gather.
    """

    def __init__(self, num_pages: int, page_size: int, home_stride: int | None = None) -> None:
        if num_pages < 1 or page_size < 1:
            raise ValueError(f"PagePool: num_pages ({num_pages}) and page_size ({page_size}) must be >= 1")
        self.num_pages = num_pages
        self.page_size = page_size
        self.home_stride = home_stride
        self._free = list(range(num_pages))  # a heap; entries no longer in _free_set are skipped (taken at home)
        self._free_set = set(self._free)
        self._refs = [0] * num_pages
        self._held: dict[int, list[int]] = {}
        self._away: set[int] = set()  # slots holding a page other than their home page of that column
        self._updates = PageUpdates()

    @property
    def free_pages(self) -> int:
        return len(self._free_set)

    @property
    def used_pages(self) -> int:
        return self.num_pages - len(self._free_set)

    def at_home(self, slot: int) -> bool:
        """True when every page `slot` holds is its home page of that column (always False without a stride)."""
        return self.home_stride is not None and slot not in self._away

    def all_at_home(self, slots: list[int]) -> bool:
        """`at_home` for every slot of `slots` (set operations, not a loop over the slots)."""
        return self.home_stride is not None and self._away.isdisjoint(slots)

    def pages_for(self, entries: int) -> int:
        """Pages that hold `entries` cache entries."""
        return math.ceil(entries / self.page_size)

    def pages_of(self, slot: int) -> list[int]:
        return self._held.get(slot, [])

    def has_room(self, slot: int, entries: int) -> bool:
        """True when `slot` already holds pages covering entries [0, entries) (`ensure` would take nothing)."""
        held = self._held.get(slot)
        return held is not None and len(held) * self.page_size >= entries

    def ensure(self, slot: int, entries: int) -> bool:
        """Give `slot` pages covering entries [0, entries); False (and nothing taken) when too few are free."""
        held = self._held.get(slot)
        if held is not None and len(held) * self.page_size >= entries:
            return True  # the common case in a round: the last page still has room
        held = self._held.setdefault(slot, [])
        missing = self.pages_for(entries) - len(held)
        if missing > self.free_pages:
            return False
        for _ in range(max(0, missing)):
            self._take(slot, self._next_page(slot, len(held)))
        return True

    def share(self, src: int, dst: int, entries: int) -> bool:
        """Give `dst` the full pages of `src`'s first `entries` entries by reference, and a fresh page for the
        partial last one (copied from src's after its prefill); False (nothing taken) when no page is free."""
        full, partial = divmod(entries, self.page_size)
        source = self._held.get(src, [])
        if len(source) < full + (1 if partial else 0):
            raise ValueError(f"PagePool.share: slot {src} holds {len(source)} pages, fewer than {entries} entries")
        if self._held.get(dst):
            raise ValueError(f"PagePool.share: slot {dst} already holds pages")
        if partial and not self._free_set:
            return False
        self._held[dst] = []
        for page in source[:full]:
            self._take(dst, page)
        if partial:
            page = self._next_page(dst, full)
            self._take(dst, page)
            self._updates.copies.append((source[full], page))
        return True

    def release(self, slot: int) -> None:
        """Drop `slot`'s hold on its pages; pages nobody else holds return to the free list."""
        for column, page in enumerate(self._held.pop(slot, [])):
            self._refs[page] -= 1
            if self._refs[page] == 0:
                heapq.heappush(self._free, page)
                self._free_set.add(page)
                self._updates.freed.append(page)
            self._updates.table[(slot, column)] = None
        if len(self._free) > 2 * self.num_pages:  # drop the entries of pages taken at home (a sorted list is a heap)
            self._free = sorted(self._free_set)
        self._away.discard(slot)

    def drain(self) -> PageUpdates:
        """The changes since the last drain (the runner applies them to the device table)."""
        updates, self._updates = self._updates, PageUpdates()
        return updates

    def _next_page(self, slot: int, column: int) -> int:
        """The page column `column` of `slot` takes: its home page when free, else the lowest free one."""
        if self.home_stride is not None and column < self.home_stride:
            home = slot * self.home_stride + column
            if home in self._free_set:
                self._free_set.discard(home)
                return home
        while True:
            page = heapq.heappop(self._free)
            if page in self._free_set:
                self._free_set.discard(page)
                return page

    def _take(self, slot: int, page: int) -> None:
        if self._refs[page] == 0:
            self._updates.fresh.append(page)
        self._refs[page] += 1
        held = self._held[slot]
        if self.home_stride is None or page != slot * self.home_stride + len(held):
            self._away.add(slot)
        self._updates.table[(slot, len(held))] = page
        held.append(page)
