"""A live view of the engine's speculation: what SGLang shows in /server_info, for progress bars and dashboards."""

from __future__ import annotations

from dataclasses import dataclass

from fastrl.strategy.round_stats import RoundStats

EMA_ALPHA = 0.2


@dataclass
class ServerInfo:
    """The active strategy, an EMA of the accept length of recent rounds, and the queue state."""

    active_strategy: str = "disable"
    rounds: int = 0
    accept_length_ema: float = 1.0
    last_batch_size: int = 0
    running: int = 0
    waiting: int = 0

    def observe(self, stats: RoundStats) -> None:
        """Fold in one decode round."""
        self.active_strategy = str(stats.strategy)
        self.rounds += 1
        self.last_batch_size = stats.batch_size
        if self.rounds == 1:
            self.accept_length_ema = stats.mean_accept_length
        else:
            self.accept_length_ema += EMA_ALPHA * (stats.mean_accept_length - self.accept_length_ema)

    def postfix(self) -> dict[str, str]:
        """Short fields for a progress bar."""
        return {"strategy": self.active_strategy, "accept": f"{self.accept_length_ema:.2f}", "bs": str(self.running)}
