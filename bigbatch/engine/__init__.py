"""The engine: devices, processes, accumulation, EMA and checkpoints, applied from outside the models."""
