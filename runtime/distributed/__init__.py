"""Tensor and data parallelism: who runs which rank (`topology`, torch-free), the rank processes and their
supervision (`processes`, torch-free), and one TP group's collectives and control channel (`group`)."""
