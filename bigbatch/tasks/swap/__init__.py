"""The face-swap task (DeepFaceLab's SAEHD): its losses and optimizers so far; the task itself next."""
