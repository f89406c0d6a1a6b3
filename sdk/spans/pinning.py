"""Persona pinning: keep the persona's text prompt inside the attention window for calls of any length.

The temporal transformer attends to the last `context` positions (3000 frames, 240 s for the 7B). Upstream
PersonaPlex writes the persona once, at the start, so after four minutes the model no longer sees it. Here the
persona text block is re-injected as a span (one prefill pass, like any Context Span) while the previous copy
is still fully in view: a copy written at position `s` with `n` frames stays visible until the slot reaches
position `s + context`; a new one is due once the position passes `s + context - n - lead`, which leaves `lead`
frames of slack for a reference span landing in the same tick. So at every step at least one complete copy of
the persona text is inside the window.

Example:
    >>> pin = PersonaPin(context=100, block_frames=20, lead=10)
    >>> pin.written(start=0)
    >>> [pin.due(position) for position in (69, 70)]
    [False, True]
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class PersonaPin:
    """When a slot's persona text block must be written again. Positions are the LM's per-slot offsets."""

    context: int
    block_frames: int
    lead: int = 8
    copies: list[int] = field(default_factory=list)  # start positions of every copy written

    def __post_init__(self) -> None:
        if self.block_frames + self.lead >= self.context:
            raise ValueError(
                f"persona text of {self.block_frames} frames cannot stay pinned in a {self.context}-frame window "
                f"(needs block + {self.lead} lead < context); shorten the persona prompt"
            )

    def written(self, start: int) -> None:
        """Record a copy whose first frame is at `start`."""
        self.copies.append(start)

    def due(self, position: int, upcoming: int = 0) -> bool:
        """True when the copy in view would leave the window before another one could land.

        `upcoming` is the length of a span about to land first: a long reference must not push the position past
        the point where the persona is lost, so the persona lands before it.
        """
        if not self.copies:
            return False
        return position + upcoming >= self.copies[-1] + self.context - self.block_frames - self.lead

    def in_view(self, position: int) -> bool:
        """True when a complete copy is visible to the query at `position` (every frame within `context`)."""
        return any(
            start <= position - self.block_frames and position - start < self.context for start in self.copies
        )
