"""Tasks with verifiable rewards; the bundled one is the arithmetic chain."""

from fastrl.rl.tasks.config import TaskConfig
from fastrl.rl.tasks.problem import Problem
from fastrl.rl.tasks.task import ArithChainTask

__all__ = ["ArithChainTask", "Problem", "TaskConfig"]
