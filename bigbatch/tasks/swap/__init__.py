"""The face-swap task (DeepFaceLab's SAEHD): the task (task.py), its losses, optimizers, warp
augmentation, discriminators, held-out score, and DFL model folders in and out (dfl.py)."""

from bigbatch.tasks.swap import task  # noqa: F401  (registers the task)
