"""Import weights from the reference implementations into unitok models, outputs unchanged.

`from_transformers` dispatches on the Hugging Face class; each family registers its converter.
"""

from unitok.convert.transformers import from_transformers, register_transformers_converter

__all__ = ["from_transformers", "register_transformers_converter"]
