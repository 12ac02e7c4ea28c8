"""unitok: one transformer backbone for every modality's tokens."""

__version__ = "0.1.0"
