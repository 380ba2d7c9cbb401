"""timm's ``create_loader``, batches made by raypipe: ``from raypipe.timm import create_loader``.

See ``raypipe.integrations.timm_loader`` for what each argument does here, and docs/timm.md for the patch
that switches timm's ``train.py``.
"""

from raypipe.integrations.timm_loader import create_loader

__all__ = ["create_loader"]
