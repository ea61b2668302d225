"""The swap task's two ends, independent of training: faces found, landmarked and aligned as DeepFaceLab's
extractor does (detect, landmarks, align, extract), and video in and out (video)."""
