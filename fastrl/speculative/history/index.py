"""The history index: suffix-match drafts from a prompt group's prompt, live siblings and earlier responses.

One ``HistoryIndex`` per engine (or rollout worker). Sequences of one prompt group (same group key: by default
the prompt's token ids) share a ``_Group``: the prompt, every response still decoding (tokens appended as they
are emitted, in any batch composition), and the kept responses of earlier RL steps. A draft for a sequence finds
where the end of its own text (prompt + output) occurs in the group's texts, longest n-gram first, and ranks the
continuations that follow those occurrences into a tree (``rank_continuations``): no model forward.

Lookup structure: per group, a map from every n-gram (n <= ``max_key``) to the (doc, end position) of its
occurrences, appended in emission order. Each response doc starts with the prompt's last ``max_match`` tokens so
a match may span the prompt/response boundary (the first tokens of a response are drafted from its siblings').
Text is only appended and logged as it arrives (``extend`` runs for every row of every round, whatever the
round's strategy); the group indexes it, in the logged order, when one of its sequences is next drafted, so an engine
whose selector seldom picks a history arm seldom pays for the index.

Memory is bounded by ``token_budget`` tokens held (prompts, prompt tails, responses): after every ``start`` and
``finish`` the index evicts whole least-recently-used groups with no live sequence, then the oldest finished
responses of live groups, until it holds at most the budget or only live text remains. A dropped response's
occurrences are skipped by lookups and filtered out of the lists in batches, so the rest keep their arrival order.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field

from fastrl.speculative.history.config import HistoryConfig
from fastrl.speculative.history.draft import HistoryDraft, rank_continuations
from fastrl.speculative.history.state import HistoryState


@dataclass
class _Group:
    """The texts of one prompt group and their n-gram occurrences."""

    prompt_doc: int
    docs: dict[int, list[int]] = field(default_factory=dict)  # doc id -> tokens (responses: prompt tail first)
    ngrams: dict[tuple[int, ...], list[tuple[int, int]]] = field(default_factory=dict)  # -> (doc, end position)
    dead: dict[int, list[int]] = field(default_factory=dict)  # removed texts whose occurrences are still in `ngrams`
    dead_tokens: int = 0  # their tokens (`_remove_docs` filters them out when they pass a quarter of the group's)
    live: set[int] = field(default_factory=set)  # doc ids still decoding
    pending: list[tuple[int, int, int]] = field(default_factory=list)  # (doc, first end, end) not yet indexed
    log: list[list[int]] = field(default_factory=list)  # every [doc, first end, end] queued, in arrival order
    finished: list[int] = field(default_factory=list)  # kept responses, oldest first
    num_tokens: int = 0
    filter_passes: int = 0  # times `_remove_docs` filtered the n-gram lists (for benchmarks)
    used: int = 0  # when it was last used (`HistoryIndex._use`): the groups' order in `HistoryIndex._groups`


def prompt_group_key(prompt_ids: Sequence[int]) -> tuple[int, ...]:
    """The default group key: the prompt's token ids as a tuple (exact, no hash collisions)."""
    return tuple(int(t) for t in prompt_ids)


class HistoryIndex:
    """Per-group suffix index over prompts, live sibling outputs and earlier responses (pure Python, no tensors).

    Lifecycle of a sequence: ``start`` (with its group key and prompt), ``extend`` with every emitted token,
    ``draft`` before a round, ``finish`` (``keep=True`` keeps the response for later steps of the same group).
    Drafts are deterministic: the same sequence of calls gives the same drafts.
    """

    def __init__(self, config: HistoryConfig | None = None) -> None:
        self.config = config or HistoryConfig()
        self._groups: OrderedDict[Hashable, _Group] = OrderedDict()  # least recently used first
        self._seqs: dict[Hashable, tuple[Hashable, int]] = {}  # seq id -> (group key, doc id)
        self._next_doc = 0
        self.num_tokens = 0
        self._clock = 0  # counts `_use` calls
        self._idle_groups = 0  # groups with no live sequence (what `_enforce_budget` may evict whole)
        self._keeping: dict[Hashable, None] = {}  # keys of the groups holding kept responses (it may drop those)

    # ---- lifecycle ---------------------------------------------------------------------------------------

    def start(self, seq_id: Hashable, group_key: Hashable | None, prompt_ids: Sequence[int]) -> None:
        """Register a live sequence of group ``group_key`` (``None``: ``prompt_group_key(prompt_ids)``). ValueError
        when the group is held with another prompt (a group's sequences share its prompt)."""
        if seq_id in self._seqs:
            raise ValueError(f"history index: sequence {seq_id!r} is already started")
        prompt = [int(t) for t in prompt_ids]
        if not prompt:
            raise ValueError(f"history index: sequence {seq_id!r} has an empty prompt")
        key = prompt_group_key(prompt) if group_key is None else group_key
        group = self._groups.get(key)
        if group is None:
            group = _Group(prompt_doc=self._new_doc())
            self._groups[key] = group
            self._add_doc(group, group.prompt_doc, prompt, first=0)
        elif group.docs[group.prompt_doc] != prompt:
            raise ValueError(
                f"history index: sequence {seq_id!r} starts in group {key!r} with another prompt than the group's "
                f"({len(prompt)} tokens, the group's {len(group.docs[group.prompt_doc])}): give each prompt its own key"
            )
        elif not group.live:
            self._idle_groups -= 1
        self._use(key, group)
        doc = self._new_doc()
        prompt_tokens = group.docs[group.prompt_doc]
        tail = prompt_tokens[-self.config.max_match :]
        self._add_doc(group, doc, tail, first=len(tail) - 1)
        group.live.add(doc)
        self._seqs[seq_id] = (key, doc)
        self._enforce_budget()

    def extend(self, seq_id: Hashable, tokens: Sequence[int]) -> None:
        """Append emitted tokens to a live sequence (visible to its own and its siblings' next drafts)."""
        key, doc = self._lookup(seq_id)
        group = self._groups[key]
        text = group.docs[doc]
        first = len(text)
        text.extend(int(token) for token in tokens)
        if len(text) > first:
            _queue(group, doc, first, len(text))
        group.num_tokens += len(tokens)
        self.num_tokens += len(tokens)

    def finish(self, seq_id: Hashable, keep: bool) -> None:
        """End a sequence; ``keep`` keeps its response as history of its group, else it is dropped."""
        key, doc = self._lookup(seq_id)
        del self._seqs[seq_id]
        group = self._groups[key]
        group.live.discard(doc)
        if not group.live:
            self._idle_groups += 1
        if keep:
            self._keeping[key] = None
            group.finished.append(doc)
        else:
            self._remove_docs(group, [doc])
        self._enforce_budget()

    # ---- checkpoints -------------------------------------------------------------------------------------

    def state(self) -> HistoryState:
        """The prompts and kept responses of every group, least recently used first (live sequences left out).
        Groups are rebuilt from their prompts by ``load_state``: every group must have the default key."""
        groups, orders = [], []
        for key, group in self._groups.items():
            prompt = group.docs[group.prompt_doc]
            if key != prompt_group_key(prompt):
                raise ValueError(f"history index: group {key!r} is not keyed by its prompt; its state cannot be saved")
            tail = len(prompt[-self.config.max_match :])
            responses = [group.docs[doc][tail:] for doc in group.finished]
            # a group of a prompt alone (its responses dropped or evicted) is kept too: it holds its place in the
            # budget and the eviction order, so that the restored index evicts, and drafts, as this one would
            groups.append((list(prompt), responses))
            texts = {group.prompt_doc: (0, 0)} | {doc: (i + 1, tail) for i, doc in enumerate(group.finished)}
            order: list[list[int]] = []
            for d, f, e in group.log:
                if d in texts:  # not a live or dropped text
                    text, shift = texts[d]
                    _append_range(order, text, f - shift, e - shift)
            orders.append([(text, first, end) for text, first, end in order])
        return HistoryState(groups, orders)

    def load_state(self, state: HistoryState) -> None:
        """Replace what the index holds by ``state`` (from ``state()``, maybe of an index of other sizes: the token
        budget applies as the groups are restored, oldest first). A group indexes its texts when it is next drafted,
        in the order they arrived (``HistoryState.orders``), so it drafts as the saved index would have; a state
        without orders indexes the prompt, then each response after the other. ValueError while sequences are
        live."""
        if self._seqs:
            raise ValueError(f"history index: cannot load a state while {len(self._seqs)} sequences are live")
        self._groups.clear()
        self._keeping.clear()
        self.num_tokens = self._idle_groups = 0
        if state.orders is not None:
            for (prompt, responses), order in zip(state.groups, state.orders, strict=True):
                self._restore_group(prompt, responses, order)
                self._enforce_budget()
            return
        for prompt, responses in state.groups:
            for response in responses or [None]:  # None: a group of its prompt alone, made by a dropped text
                seq_id = ("load_state", self._next_doc)  # not a caller's id: none is live
                self.start(seq_id, None, prompt)
                if response is not None:
                    self.extend(seq_id, response)
                self.finish(seq_id, keep=response is not None)

    # ---- drafting ----------------------------------------------------------------------------------------

    def draft(self, seq_id: Hashable, max_nodes: int, max_depth: int, chain: bool = False) -> HistoryDraft:
        """A draft of at most ``max_nodes`` nodes (root included) and depth ``max_depth`` for a live sequence.

        The root is the sequence's last token. The continuations follow the occurrences of the n-grams ending the
        sequence's text (its own earlier text, siblings, earlier responses, the prompt), longest n-gram first and
        most recent first, each weighted by ``match_base ** L`` for its context match length L.
        """
        if max_depth < 1 or max_nodes < 1:
            raise ValueError(f"history draft needs max_nodes >= 1 and max_depth >= 1, got {max_nodes}, {max_depth}")
        key, doc = self._lookup(seq_id)
        group = self._groups[key]
        self._use(key, group)
        self._index_pending(group)
        context = group.docs[doc]
        return rank_continuations(context[-1], self._continuations(group, context, max_depth), max_nodes, chain)

    def index_pending(self, seq_ids: Iterable[Hashable]) -> None:
        """Index what the groups of these live sequences emitted since their last draft (what their next draft would
        do first; the engine does it before a history round so that the round's time can be told apart from it)."""
        for seq_id in seq_ids:
            key, _ = self._lookup(seq_id)
            self._index_pending(self._groups[key])

    def _continuations(self, group: _Group, context: list[int], max_depth: int) -> list[tuple[list[int], float]]:
        """(continuation, weight) of up to ``max_candidates`` occurrences: longest n-gram first, then most recent."""
        cfg = self.config
        found: list[tuple[list[int], float]] = []
        seen: set[tuple[int, int]] = set()
        for k in range(min(cfg.max_key, len(context)), 0, -1):
            for hit in reversed(group.ngrams.get(tuple(context[-k:]), ())):
                doc, end = hit
                text = group.docs.get(doc)
                if text is None or end + 1 >= len(text) or hit in seen:
                    continue  # a removed text, a text's own end (nothing follows yet), or found with a longer n-gram
                seen.add(hit)
                length = _match_length(context, text, end, k, cfg.max_match)
                found.append((text[end + 1 : end + 1 + max_depth], cfg.match_base**length))
                if len(found) == cfg.max_candidates:
                    return found
        return found

    # ---- bookkeeping -------------------------------------------------------------------------------------

    @property
    def num_groups(self) -> int:
        """Prompt groups held."""
        return len(self._groups)

    def is_live(self, seq_id: Hashable) -> bool:
        """Whether the sequence is started and not finished."""
        return seq_id in self._seqs

    def has_group(self, group_key: Hashable) -> bool:
        """Whether the group is held (not evicted)."""
        return group_key in self._groups

    def _lookup(self, seq_id: Hashable) -> tuple[Hashable, int]:
        entry = self._seqs.get(seq_id)
        if entry is None:
            raise ValueError(f"history index: sequence {seq_id!r} is not started")
        return entry

    def _use(self, key: Hashable, group: _Group) -> None:
        """Make the group the most recently used one."""
        self._groups.move_to_end(key)
        self._clock += 1
        group.used = self._clock

    def _new_doc(self) -> int:
        self._next_doc += 1
        return self._next_doc - 1

    def _add_doc(self, group: _Group, doc: int, tokens: list[int], first: int) -> None:
        """Add a text whose n-grams ending at positions ``first`` on are indexed (a response's prompt tail is there
        only as context: its n-grams are the prompt's)."""
        text = list(tokens)
        group.docs[doc] = text
        if max(first, 0) < len(text):
            _queue(group, doc, max(first, 0), len(text))
        group.num_tokens += len(text)
        self.num_tokens += len(text)

    def _restore_group(self, prompt: list[int], responses: list[list[int]], order: list[tuple[int, int, int]]) -> None:
        """Add one group of a state with orders: its prompt, its kept responses (each after the prompt's tail, as
        ``start`` makes them) and their ranges queued in the saved order."""
        key = prompt_group_key(prompt)
        if key in self._groups:
            raise ValueError("history index: a state holds one prompt group twice")
        group = _Group(prompt_doc=self._new_doc())
        self._groups[key] = group
        self._use(key, group)
        tail = [int(t) for t in prompt[-self.config.max_match :]]
        docs = [group.prompt_doc] + [self._new_doc() for _ in responses]
        texts = [[int(t) for t in prompt]] + [tail + [int(t) for t in response] for response in responses]
        for doc, text in zip(docs, texts, strict=True):
            group.docs[doc] = text
            group.num_tokens += len(text)
            self.num_tokens += len(text)
        group.finished = docs[1:]
        self._idle_groups += 1
        if responses:
            self._keeping[key] = None
        for text, first, end in order:
            shift = len(tail) if text else 0
            _queue(group, docs[text], first + shift, end + shift)

    def _index_pending(self, group: _Group) -> None:
        """Index the tokens emitted since the group's last draft, in the order they were emitted."""
        for doc, first, end in group.pending:  # a removed doc's entries went with it (`_remove_docs`)
            text = group.docs[doc]
            for position in range(first, end):
                self._index_position(group, doc, text, position)
        group.pending.clear()

    def _index_position(self, group: _Group, doc: int, text: list[int], end: int) -> None:
        """Record the n-grams ending at ``end`` (lengths 1..max_key that fit in the text)."""
        ngrams = group.ngrams
        for k in range(1, min(self.config.max_key, end + 1) + 1):
            ngrams.setdefault(tuple(text[end - k + 1 : end + 1]), []).append((doc, end))

    def _remove_docs(self, group: _Group, docs: list[int]) -> None:
        """Drop texts from a group. Their occurrences stay in the n-gram lists, skipped by lookups, until the dead
        tokens pass a quarter of the group's; then the lists holding their n-grams are filtered, so every other
        occurrence keeps its arrival order and the group drafts as if the dropped texts had never been there."""
        for doc in docs:
            text = group.docs.pop(doc)
            group.dead[doc] = text
            group.num_tokens -= len(text)
            self.num_tokens -= len(text)
            group.dead_tokens += len(text)
        group.pending = [entry for entry in group.pending if entry[0] not in group.dead]
        if 4 * group.dead_tokens <= group.num_tokens:
            return
        max_key, dead = self.config.max_key, group.dead
        touched = {
            tuple(text[i : i + k])
            for text in dead.values()
            for k in range(1, max_key + 1)
            for i in range(len(text) - k + 1)
        }
        for key in touched:
            hits = group.ngrams.get(key)
            if hits is not None:
                live = [hit for hit in hits if hit[0] not in dead]
                if live:
                    group.ngrams[key] = live
                else:
                    del group.ngrams[key]
        group.log = [entry for entry in group.log if entry[0] not in dead]
        group.dead, group.dead_tokens = {}, 0
        group.filter_passes += 1

    def _enforce_budget(self) -> None:
        """Evict LRU groups without live sequences, then the oldest kept responses of live groups.

        The groups are walked from the least recently used end, and no further than the budget needs or than there
        are groups without live sequences (``_idle_groups``); the kept responses are dropped from the groups that hold
        some (``_keeping``), least recently used first. A call visits the groups it takes from and the live ones
        before them in the LRU order, never every group held."""
        budget = self.config.token_budget
        if self.num_tokens <= budget or not self._idle_groups and not self._keeping:
            return
        evict: list[Hashable] = []
        held, idle = self.num_tokens, self._idle_groups
        for key, group in self._groups.items() if idle else ():
            if not group.live:
                evict.append(key)
                held -= group.num_tokens
                idle -= 1
                if held <= budget or idle == 0:
                    break
        for key in evict:
            self.num_tokens -= self._groups.pop(key).num_tokens
            self._idle_groups -= 1
            self._keeping.pop(key, None)
        if self.num_tokens <= budget:
            return
        for key in sorted(self._keeping, key=lambda k: self._groups[k].used):  # all live now, in the LRU order
            group = self._groups[key]
            drop: list[int] = []
            excess = self.num_tokens - budget
            while group.finished and excess > 0:
                doc = group.finished.pop(0)
                drop.append(doc)
                excess -= len(group.docs[doc])
            if not group.finished:
                del self._keeping[key]
            self._remove_docs(group, drop)
            if self.num_tokens <= budget:
                return


def _queue(group: _Group, doc: int, first: int, end: int) -> None:
    """Queue positions [first, end) of a text for indexing, and log them."""
    group.pending.append((doc, first, end))
    _append_range(group.log, doc, first, end)


def _append_range(ranges: list[list[int]], text: int, first: int, end: int) -> None:
    """Append [text, first, end) to ``ranges``, extending the last range instead when this one continues it."""
    last = ranges[-1] if ranges else None
    if last is not None and last[0] == text and last[2] == first:
        last[2] = end
    else:
        ranges.append([text, first, end])


def _match_length(context: list[int], text: list[int], end: int, known: int, limit: int) -> int:
    """How many tokens ending ``context`` equal those ending at ``text[end]`` (at least ``known``, at most limit)."""
    length = known
    top = min(limit, len(context), end + 1)
    while length < top and context[-1 - length] == text[end - length]:
        length += 1
    return length
