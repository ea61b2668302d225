"""The GAN task: G and D trained in turn (hinge or non-saturating loss), G_ema, sample sheets, FID/IS/KID."""

from bigbatch.tasks.gan import task  # noqa: F401  (registers "gan")
