"""The classify task: image classifiers on the engine with the fast-ImageNet recipe (task.py), their
learning-rate schedule (lr.py) and held-out validation (validation.py)."""

from bigbatch.tasks.classify import task  # noqa: F401  (registers the task)
