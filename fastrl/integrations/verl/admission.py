"""Admission of a verl server: whether a ``generate`` call may start a request now."""

from __future__ import annotations

import asyncio

ABORT_HOLD = "abort"  # the hold abort_all_requests puts on admission (resume_generation lifts it)


class AdmissionGate:
    """Open while nothing holds it. ``abort_all_requests`` holds it (``close_for_abort``) until
    ``resume_generation`` (``reopen``), each weight commit while it installs weights (``hold``), so a commit that
    ends never reopens what an abort closed. Callers waiting at the gate are turned away as soon as an abort that
    rejects holds it (their server left the rotation: the client re-routes them); otherwise they wait until nothing
    does."""

    def __init__(self) -> None:
        self._holds: set[str] = set()  # ABORT_HOLD, one name per commit in progress
        self._changed = asyncio.Condition()  # notified whenever the holds or the rejection change
        self._reject = False

    async def enter(self) -> bool:
        """Wait while anything holds admission: True once admitted, False (at once) while an abort that rejects holds
        it."""
        async with self._changed:
            while self._holds:
                if self._reject and ABORT_HOLD in self._holds:
                    return False
                await self._changed.wait()
            return True

    async def close_for_abort(self, reject: bool) -> None:
        """Hold admission for an abort; with ``reject``, callers at the gate are turned away instead of waiting."""
        self._reject = reject
        await self.hold(ABORT_HOLD, True)

    async def reopen(self) -> None:
        """Lift the abort's hold (admission opens unless a weight commit holds it)."""
        self._reject = False
        await self.hold(ABORT_HOLD, False)

    async def hold(self, name: str, held: bool) -> None:
        """Put on (``held``) or lift the hold called ``name``."""
        async with self._changed:
            if held:
                self._holds.add(name)
            else:
                self._holds.discard(name)
            self._changed.notify_all()
