"""The classify task: image classifiers on the engine with the fast-ImageNet recipe (task.py), their
learning-rate schedule (lr.py), held-out validation (validation.py), and the metrics' feature
classifier trained by it and handed to them (features.py)."""

from bigbatch.tasks.classify import features, task  # noqa: F401  (registers the task)
