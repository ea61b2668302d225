"""The [swap] and [xseg] sections of the config: DeepFaceLab SAEHD's and XSeg's training options
(bigbatch.config's tree holds them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from bigbatch.config_types import Section, at_least_zero, positive


@dataclass
class SwapConfig(Section):
    """The swap task's training options, DeepFaceLab SAEHD's (its option names; its defaults)."""

    _name = "swap"

    optimizer: Literal["adabelief", "rmsprop"] = "adabelief"
    """DFL's AdaBelief (its default) or RMSprop, as DFL updates (no bias correction)."""
    lr: float = 5e-5
    """The learning rate (DFL's fixed 5e-5)."""
    lr_dropout: bool = False
    """DFL's lr_dropout: each weight updated with probability 0.3 per step, the rate on a 500-step cosine."""
    random_warp: bool = True
    """Train on randomly warped faces against the unwarped ones (off late in training, as DFL users do;
    then a liae model's inter_AB stays as it is, as in DFL)."""
    src_flip: bool = False
    """Mirror src faces at random (p 0.4), DFL's random_src_flip."""
    dst_flip: bool = True
    """Mirror dst faces at random (p 0.4), DFL's random_dst_flip."""
    masked_training: bool = True
    """Weigh the image losses inside the face mask (blurred), when the data carries masks."""
    eyes_mouth_prio: bool = False
    """Add 300·L1 inside the eyes and mouth (needs data prepared with an eyes-and-mouth channel)."""
    true_face_power: float = 0.0
    """df archis: the weight of a code discriminator pushing src codes toward dst's, so that the swap looks more
    like src's face (DFL's "True face power": 0.0..1.0)."""
    gan_power: float = 0.0
    """The weight of a U-Net patch discriminator on src reconstructions (DFL: 0.0..5.0; usually 0.1)."""
    gan_patch_size: int = 0
    """The patch discriminator's receptive field in pixels (0: resolution / 8, DFL's default)."""
    gan_dims: int = 16
    """The patch discriminator's base channels."""
    ct_mode: Literal["none", "rct", "lct", "mkl", "idt", "sot"] = "none"
    """DFL's colour transfer: each src face recoloured like a random dst face before training on it
    (rct: Reinhard in L*a*b*; lct: linear; mkl: Monge-Kantorovich; idt: iterative distribution
    transfer; sot: sliced optimal transport, the slowest)."""
    random_hsv_power: float = 0.0
    """DFL's random hue/saturation/value shift of the src input (0.0..0.3; 0.05 typical)."""
    face_style_power: float = 0.0
    """DFL's face style loss: the swapped face's colours inside the mask learn dst's (0.0..100.0; start
    from 0.001 after 10k iterations, DFL advises)."""
    bg_style_power: float = 0.0
    """DFL's background style loss: the swapped face outside the mask learns dst's (0.0..100.0; 2.0 typical)."""
    uniform_yaw: bool = False
    """DFL's uniform_yaw: each side's faces drawn evenly over 128 bins of yaw (from their landmarks, which
    `prepare` keeps from aligned DFL faces), not as often as each yaw is in the set, so that the few side views
    train as much as the many frontal ones (DFL: "helps to fix blurry side faces")."""
    blur_out_mask: bool = False
    """Blur the targets' background near the face mask (needs masks in the data), DFL's blur_out_mask."""
    face_type: Literal["", "h", "mf", "f", "wf", "head"] = ""
    """DFL's face type of the faces (half, mid, full, whole face, head), which its merger crops by; "":
    the one `prepare --masks dfl` read from the faces, else unknown (export-dfl then asks for it)."""

    def _validate(self) -> None:
        positive(self, "lr", "gan_dims")
        # Each >= 0 and within DFL's range (its model asks for them so, and export-dfl writes them into its options)
        for name, top, typical in (
            ("random_hsv_power", 0.3, "; 0.05 typical"),
            ("true_face_power", 1.0, "; 0.01 typical"),
            ("gan_power", 5.0, "; 0.1 typical"),
            ("face_style_power", 100.0, ""),
            ("bg_style_power", 100.0, ""),
        ):
            at_least_zero(self, **{name: "a finite number >= 0 (0 = off)"})
            if getattr(self, name) > top:
                self._fail(name, f"must be in 0.0..{top} (DFL's range{typical}), got {getattr(self, name)}")
        if self.gan_patch_size != 0 and not 3 <= self.gan_patch_size <= 640:
            self._fail(
                "gan_patch_size", f"must be pixels in 3..640, or 0 for resolution / 8, got {self.gan_patch_size}"
            )


@dataclass
class XSegConfig(Section):
    """The xseg task's training options, DeepFaceLab XSeg's (its defaults)."""

    _name = "xseg"

    lr: float = 1e-4
    """RMSprop's learning rate (DFL's fixed 1e-4)."""
    lr_dropout: bool = True
    """DFL's XSeg optimizer: each weight updated with probability 0.3 per step (no cosine, unlike SAEHD's option)."""
    face_type: Literal["", "h", "mf", "f", "wf", "head"] = ""
    """DFL's face type of the faces the model masks ("": the one `prepare --masks labels` read from them);
    `bigbatch xseg apply` and `merge --xseg` cut faces of other types to it."""

    def _validate(self) -> None:
        positive(self, "lr")
