"""dit-trainer: train and sample class-conditional Diffusion Transformers."""

__version__ = "0.1.0"
