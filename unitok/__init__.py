"""unitok: one transformer backbone for every modality's tokens."""

__version__ = "0.1.0"

from unitok.auto import AutoModel, load  # noqa: E402
from unitok.pipelines import pipeline  # noqa: E402

__all__ = ["AutoModel", "load", "pipeline"]
