"""History drafts: suffix matches over a prompt group's prompt, live siblings and earlier responses."""

from fastrl.speculative.history.config import HistoryConfig
from fastrl.speculative.history.draft import HistoryDraft, rank_continuations
from fastrl.speculative.history.index import HistoryIndex, prompt_group_key
from fastrl.speculative.history.state import HistoryState, merge_history_states
from fastrl.speculative.history.tree import history_draft_tree, pad_draft

__all__ = [
    "HistoryConfig",
    "HistoryDraft",
    "HistoryIndex",
    "HistoryState",
    "history_draft_tree",
    "merge_history_states",
    "pad_draft",
    "prompt_group_key",
    "rank_continuations",
]
