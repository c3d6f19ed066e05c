"""The shipped model run by ONNX Runtime instead of torch: the same vectors (to about 1e-7), a query in a quarter
of the time, and no torch import in processes that find the graph already made.

The graph is made once from the packaged weights (torch's exporter, at the first embedding on a machine), checked
against torch on probe sentences, and kept in the cache directory under a name that says which weights it came
from. Later processes load it directly. What the model does around the transformer is done here as
sentence-transformers does it: the model's tokenizer (truncated at max_seq_length, padded to the longest text of a
batch), mean pooling over the attention mask, then normalisation; texts are batched by length, as
sentence-transformers batches them, so little padding is computed.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger("memshelf")

CACHE_ENV = "MEMSHELF_CACHE_DIR"
"""Where the exported graph is kept; default $XDG_CACHE_HOME/memshelf, else ~/.cache/memshelf."""
RUNTIME_ENV = "MEMSHELF_LOCAL_RUNTIME"
"""'onnx' (the default when onnxruntime is installed) or 'torch' (sentence-transformers, as before)."""
BATCH = 16
"""Texts per ONNX run: with texts sorted by length, small batches pad least (measured in bench/bench_embed.py)."""
AGREEMENT = 1e-4
"""Largest difference from torch's vector, in any dimension, for an exported graph to be used."""
PROBES = ["Where is the printer toner?", "The office printer is on 192.168.1.40 and jams on thick paper.",
          "Kaleb moved to Porto last spring; his sister still lives in Lisbon.", "ok"]


def cache_dir() -> Path:
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "memshelf"


def wanted() -> bool:
    """Whether the local model should run on ONNX Runtime: asked for (or not refused) and installed."""
    choice = os.environ.get(RUNTIME_ENV, "onnx").strip().lower()
    if choice not in ("onnx", "torch"):
        log.warning("%s=%r is neither 'onnx' nor 'torch': using onnx where installed", RUNTIME_ENV, choice)
    if choice == "torch":
        return False
    import importlib.util

    return importlib.util.find_spec("onnxruntime") is not None


class OnnxModel:
    """The transformer as an ONNX graph, with the tokenizer and pooling around it."""

    def __init__(self, graph: Path, model_dir: Path) -> None:
        import onnxruntime
        from tokenizers import Tokenizer

        options = onnxruntime.SessionOptions()
        options.log_severity_level = 3  # warnings about unused initialisers are noise here
        self.session = onnxruntime.InferenceSession(str(graph), options, providers=["CPUExecutionProvider"])
        longest = json.loads((model_dir / "sentence_bert_config.json").read_text())["max_seq_length"]
        self.tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self.tokenizer.enable_truncation(longest)
        self.tokenizer.enable_padding(pad_id=self.tokenizer.token_to_id("[PAD]") or 0)
        self._lock = threading.Lock()  # the tokenizer's settings are shared: encode one batch at a time

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        out = np.empty((len(texts), 0), dtype=np.float32)
        for start in range(0, len(texts), BATCH):
            chosen = order[start:start + BATCH]
            vectors = self._run([texts[i] for i in chosen])
            if out.shape[1] == 0:
                out = np.empty((len(texts), vectors.shape[1]), dtype=np.float32)
            out[chosen] = vectors
        return out

    def _run(self, texts: list[str]) -> np.ndarray:
        with self._lock:
            encoded = self.tokenizer.encode_batch(texts)
        ids = np.array([e.ids for e in encoded], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encoded], dtype=np.int64)
        hidden = self.session.run(None, {"input_ids": ids, "attention_mask": mask,
                                         "token_type_ids": np.zeros_like(ids)})[0]
        weights = mask[..., None].astype(np.float32)
        pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        return (pooled / np.clip(norms, 1e-12, None)).astype(np.float32)


def load(model_dir: Path, stamp: str, torch_model: Callable[[], Any]) -> OnnxModel | None:
    """The ONNX model for the packaged weights: from the cache, else exported now from `torch_model()` and checked
    against it. None when that cannot be done (no exporter, no writable cache, a graph that disagrees): the caller
    then uses torch, and says why once."""
    graph = cache_dir() / f"{stamp}.onnx"
    if graph.exists():
        try:
            return OnnxModel(graph, model_dir)
        except Exception as exc:  # a damaged file: make it again
            log.warning("the cached ONNX graph %s could not be loaded (%s); exporting it again", graph, exc)
    try:
        model = torch_model()
        _export(model, graph)
        onnx = OnnxModel(graph, model_dir)
        expected = model.encode(PROBES, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False)
        difference = float(np.abs(onnx.encode(PROBES) - expected).max())
    except Exception as exc:
        log.warning("the local model runs on torch: its ONNX graph could not be made (%s: %s)",
                    type(exc).__name__, exc)
        return None
    if difference > AGREEMENT:
        graph.unlink(missing_ok=True)
        log.warning("the local model runs on torch: its ONNX graph's vectors differ from torch's by %.2g", difference)
        return None
    _prune(graph)
    return onnx


def _prune(graph: Path) -> None:
    """Delete the graphs older weights of the same model left in the cache (the stamp is the model's name, a dash
    and the size of its weights): about 90 MB each, and no longer loaded once these weights have their own."""
    name = graph.stem.rsplit("-", 1)[0]
    for old in graph.parent.glob(f"{name}-*.onnx"):
        if old != graph:
            try:
                old.unlink()
            except OSError as exc:  # another process's file, say: it only costs disk space
                log.info("could not delete the old ONNX graph %s: %s", old, exc)


def _export(model: Any, graph: Path) -> None:
    """Export the transformer of a SentenceTransformer to `graph`, atomically (a reader never sees half a file)."""
    import torch

    transformer = model[0].auto_model.eval()

    class Hidden(torch.nn.Module):
        """The transformer's last hidden state from the three inputs, by name."""

        def __init__(self) -> None:
            super().__init__()
            self.transformer = transformer

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            return self.transformer(input_ids=input_ids, attention_mask=attention_mask,
                                    token_type_ids=token_type_ids).last_hidden_state

    sample = model.tokenizer(["an example to trace"], return_tensors="pt")
    axes = {"input_ids": {0: "batch", 1: "tokens"}, "attention_mask": {0: "batch", 1: "tokens"},
            "token_type_ids": {0: "batch", 1: "tokens"}, "hidden": {0: "batch", 1: "tokens"}}
    graph.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=graph.parent, prefix=graph.name, suffix=".part")
    os.close(handle)
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the tracer's notes on Python control flow: the graph is checked after
            torch.onnx.export(Hidden(), (sample["input_ids"], sample["attention_mask"], sample["token_type_ids"]),
                              temporary, input_names=["input_ids", "attention_mask", "token_type_ids"],
                              output_names=["hidden"], dynamic_axes=axes, opset_version=17, dynamo=False)
        os.replace(temporary, graph)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)
