"""Tasks: each owns its step's loss math (GAN now; classifier and autoencoder later)."""
