"""A pool of fixed slot indices ``[0, capacity)`` handed out lowest first.

The batched stages (codec-LM TTS and Kyutai ASR via ``speech/streaming/slot_engine.py``, the torch Silero VAD, the
policy's ``ChunkSlots``) step slots ``[0, B)``, ``B`` the bucket above the highest slot in use: handing
out the lowest free slot keeps the active ones packed, so the bucket stays small. Pure Python (no torch).
"""

from __future__ import annotations

import heapq


class SlotPool:
    """Free slots as a min-heap (lowest out first) plus a set (O(1) membership for the double-free check)."""

    def __init__(self, capacity: int, name: str = "") -> None:
        """``name`` prefixes error messages (e.g. ``"policy"``: "policy slot 3 freed twice")."""
        self.capacity = capacity
        self.name = name
        self._heap: list[int] = []
        self._free: set[int] = set()
        self.reset()

    def reset(self) -> None:
        """Every slot free."""
        self._heap = list(range(self.capacity))  # a sorted list is a heap
        self._free = set(self._heap)

    def __len__(self) -> int:
        """The number of free slots."""
        return len(self._free)

    def is_free(self, slot: int) -> bool:
        return slot in self._free

    def lowest(self) -> int | None:
        """The slot ``take`` would hand out, without taking it; None when none is free."""
        return self._heap[0] if self._heap else None

    def free_slots(self) -> list[int]:
        """The free slots, ascending."""
        return sorted(self._free)

    def take(self) -> int | None:
        """The lowest free slot, now taken; None when none is free (the caller says what full means)."""
        if not self._heap:
            return None
        slot = heapq.heappop(self._heap)
        self._free.remove(slot)
        return slot

    def take_slot(self, slot: int) -> None:
        """Take this particular free slot (e.g. when two slots' states are exchanged)."""
        if slot not in self._free:
            raise ValueError(f"{self._label(slot)} is not free")
        self._free.remove(slot)
        self._heap.remove(slot)  # O(capacity): exchanges are rare next to take/give
        heapq.heapify(self._heap)

    def give(self, slot: int) -> None:
        """Give a taken slot back; a slot given back twice (or out of range) is a caller's bug: raise."""
        if not 0 <= slot < self.capacity:
            raise ValueError(f"{self._label(slot)} is out of range [0, {self.capacity})")
        if slot in self._free:
            raise ValueError(f"{self._label(slot)} freed twice")
        self._free.add(slot)
        heapq.heappush(self._heap, slot)

    def _label(self, slot: int) -> str:
        return f"{self.name} slot {slot}" if self.name else f"slot {slot}"
