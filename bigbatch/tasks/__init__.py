"""Tasks: what the training loop trains, each owning its models, step and loss math, checkpoint state,
previews and scores (bigbatch.tasks.interface says what a task provides). Registered by name."""

from bigbatch.tasks import classify, gan, swap, xseg  # noqa: F401  (registers the tasks)
from bigbatch.tasks.interface import Feed, Scorer, Task, build_task, list_tasks, register

__all__ = ["Feed", "Scorer", "Task", "build_task", "list_tasks", "register"]
