"""The xseg task: DeepFaceLab's XSeg face segmenter trained on the faces labelled in DFL's XSeg editor."""

from bigbatch.tasks.xseg import task  # noqa: F401  (registers the task)
