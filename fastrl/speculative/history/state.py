"""What a history index keeps across RL steps (``HistoryState``): its groups' prompts and kept responses, and the
order their texts arrived in, validated on construction; ``merge_history_states`` folds several into one."""

from __future__ import annotations

from collections.abc import Sequence
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


def merge_history_states(states: Sequence[HistoryState]) -> HistoryState:
    """One state holding every group of ``states`` (the indexes of several rollout workers, to restore into one).

    Each state lists its groups least recently used first; which worker used a group last is not known, so the
    states are interleaved from their most recently used ends (every state's i-th most recent group, in state order,
    comes after their (i+1)-th): an index too small for them all, restoring the result oldest first, evicts every
    state's oldest groups first. A prompt held by several states becomes one group, at the place of its most recent
    copy, with the copies' responses one state after the other, and their arrival orders likewise (the prompt's
    from the first copy). A state without orders arrived text by text."""
    ranked = sorted(
        ((len(state.groups) - g, s, g) for s, state in enumerate(states) for g in range(len(state.groups))),
        key=lambda rank: (-rank[0], rank[1]),
    )
    copies: dict[tuple[int, ...], list[tuple[int, int]]] = {}  # prompt -> its (state, group)s, in state order
    place: dict[tuple[int, ...], int] = {}  # prompt -> the rank of its most recent copy
    for i, (_, s, g) in enumerate(ranked):
        prompt = tuple(states[s].groups[g][0])
        copies.setdefault(prompt, []).append((s, g))
        place[prompt] = i
    groups: list[tuple[list[int], list[list[int]]]] = []
    orders: list[list[tuple[int, int, int]]] = []
    for prompt in sorted(copies, key=place.__getitem__):
        responses: list[list[int]] = []
        order: list[tuple[int, int, int]] = []
        for c, (s, g) in enumerate(sorted(copies[prompt])):
            copy_responses = states[s].groups[g][1]
            copy_order = states[s].orders[g] if states[s].orders is not None else _text_by_text(prompt, copy_responses)
            shift = len(responses)
            order.extend((text + shift if text else 0, first, end) for text, first, end in copy_order if text or not c)
            responses.extend(list(response) for response in copy_responses)
        groups.append((list(prompt), responses))
        orders.append(order)
    return HistoryState(groups, orders)


def _text_by_text(prompt: Sequence[int], responses: Sequence[Sequence[int]]) -> list[tuple[int, int, int]]:
    """The order of a group whose texts arrived one after the other (how a state without orders loads)."""
    return [(0, 0, len(prompt))] + [(i + 1, -1, len(response)) for i, response in enumerate(responses)]
