"""What a history index keeps across RL steps (``HistoryState``): its groups' prompts and kept responses, and the
order their texts arrived in, validated on construction."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HistoryState:
    """What an index keeps across RL steps, to carry it through a checkpoint: per prompt group (least recently used
    first) its prompt and its kept responses (oldest first). Live sequences are not part of it."""

    groups: list[tuple[list[int], list[list[int]]]]
    orders: list[list[tuple[int, int, int]]] | None = None
    """Per group, the order its texts arrived in: (text, first, end) ranges of positions, text 0 the prompt and i the
    i-th response (positions within it; -1 is the prompt's last token, where a response's text starts), so that a
    restored index indexes them as the original did and drafts as it would have. None (a state saved before it was
    kept): each text after the other."""

    def __post_init__(self) -> None:
        first: dict[tuple[int, ...], int] = {}
        for g, (prompt, _) in enumerate(self.groups):  # an index holds a prompt once: its texts are one group
            if (earlier := first.setdefault(tuple(prompt), g)) != g:
                raise ValueError(f"history state: group {g} holds the prompt of group {earlier} again")
        if self.orders is None:
            return
        if len(self.orders) != len(self.groups):
            raise ValueError(f"history state: {len(self.orders)} orders for {len(self.groups)} groups")
        for g, ((prompt, responses), order) in enumerate(zip(self.groups, self.orders, strict=True)):
            reached = [0] + [-1] * len(responses)  # where each text's next range must start
            ends = [len(prompt)] + [len(response) for response in responses]
            for text, first, end in order:
                if not (0 <= text < len(ends) and first == reached[text] and first < end <= ends[text]):
                    raise ValueError(
                        f"history state: group {g}'s order has the range {(text, first, end)}, which does not continue "
                        f"its text where the ranges before it ended"
                    )
                reached[text] = end
            if reached != ends:
                raise ValueError(f"history state: group {g}'s order does not cover its texts")

    @property
    def num_tokens(self) -> int:
        """Prompt and response tokens held."""
        return sum(len(prompt) + sum(map(len, responses)) for prompt, responses in self.groups)
