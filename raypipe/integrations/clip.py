"""open_clip's tokenizer as a field transform: captions become token ids on the workers.

``ClipTokens("ViT-B-32")`` is a small picklable value (a model name, at most a config file's path): a
field transform travels with every chunk's stage spec, and a tokenizer object pickles to megabytes
(its vocabulary). Each worker process makes the tokenizer once, on first use, from ``open_clip``
(``pip install 'raypipe[clip]'``); nothing is downloaded for open_clip's own tokenizer.
"""

from __future__ import annotations

import json
import os

import numpy as np

__all__ = ["ClipTokens"]

_TOKENIZERS: dict[tuple, object] = {}  # this process's, by (model, config, context length)


class ClipTokens:
    """Text to open_clip's token ids for ``model``: an int64 array of ``(context_length,)``.

    Args:
        model: an open_clip model name (``"ViT-B-32"``), or the name of ``model_config``'s model.
        model_config: a model config JSON file to register first (a model of your own; its file name,
            less ``.json``, is the model's name), read on each worker: a path every worker can read.
        context_length: ids per caption (None: the model's, 77 for OpenAI's).

    Raises:
        ValueError: an empty ``model``, or a ``model_config`` that is not a ``.json`` file.
    """

    def __init__(self, model: str, *, model_config: str | os.PathLike | None = None, context_length: int | None = None):
        if not isinstance(model, str) or not model:
            raise ValueError(f"model={model!r}: expected an open_clip model name")
        if model_config is not None:
            model_config = os.fspath(model_config)
            if not model_config.endswith(".json"):
                raise ValueError(f"model_config={model_config!r}: expected a model config .json file")
        if context_length is not None and (
            isinstance(context_length, bool) or not isinstance(context_length, int) or context_length < 1
        ):
            raise ValueError(f"context_length={context_length!r}: expected an int >= 1 or None")
        self.model, self.model_config, self.context_length = model, model_config, context_length

    def tokenizer(self):
        """This process's open_clip tokenizer for the model (made on first use)."""
        key = (self.model, self.model_config, self.context_length)
        tok = _TOKENIZERS.get(key)
        if tok is None:
            import open_clip

            if self.model_config is not None:
                open_clip.add_model_config(self.model_config)
            kwargs = {} if self.context_length is None else {"context_length": self.context_length}
            tok = _TOKENIZERS[key] = open_clip.get_tokenizer(self.model, **kwargs)
        return tok

    def __call__(self, text: str) -> np.ndarray:
        return self.tokenizer()([text])[0].numpy().astype(np.int64, copy=False)

    def __repr__(self) -> str:
        return f"ClipTokens({json.dumps(self.model)})"
