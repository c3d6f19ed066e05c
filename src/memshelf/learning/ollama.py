"""The `ollama:MODEL` extractor: a chat model on a running Ollama server (https://ollama.com), over POST /api/chat.

The answer's JSON schema goes in the request's `format`, which Ollama turns into a grammar the model must follow;
the temperature is 0. The server is found as the Ollama embedder finds it (`host`, else OLLAMA_HOST, else
localhost:11434). Token counts are Ollama's prompt_eval_count and eval_count.
"""

from __future__ import annotations

from typing import Any

import httpx

from ..embedders._http import deadline_client
from ..embedders.ollama import resolve_ollama_host
from ..embedders.openai import error_text
from ..errors import EmbedderError, ExtractorError
from ._chat import ANSWER_SCHEMA, INSTALL, MAX_ANSWER_TOKENS, ChatExtractor, Meter, Reply, count, extractor_timeout
from .base import Extractor, ExtractorProvider

DEFAULT_MODEL = "llama3.2"


class OllamaExtractor(ChatExtractor):
    """Proposals from any chat model an Ollama server has pulled, e.g. llama3.2 or qwen2.5."""

    unreachable_hint = "start it with `ollama serve`, or set OLLAMA_HOST to where it runs"
    url_hint = "fix OLLAMA_HOST"
    busy_hint = "check that `ollama serve` is healthy, or set OLLAMA_HOST to a server that is"
    not_json_hint = "upgrade Ollama (0.5 or later reads a JSON schema), and check that OLLAMA_HOST points at it"

    def __init__(self, model: str = DEFAULT_MODEL, host: str | None = None, timeout: float | None = None) -> None:
        self.model_name = model
        self.name = f"ollama:{model}"
        try:
            self.host = resolve_ollama_host(host)
        except EmbedderError as exc:
            raise ExtractorError(str(exc)) from None
        self.where = f"Ollama at {self.host}"
        self.timeout = extractor_timeout(timeout)
        self._client = deadline_client(self.timeout, base_url=self.host)

    def _chat(self, messages: list[dict[str, str]], meter: Meter) -> Reply:
        payload = {"model": self.model_name, "messages": messages, "stream": False, "format": ANSWER_SCHEMA,
                   "options": {"temperature": 0, "num_predict": MAX_ANSWER_TOKENS}}
        meter.calls += 1
        body = self._reply(self._post("/api/chat", payload))
        message = body.get("message")
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, str):
            raise ExtractorError(f"{self.where} answered without a message: {self.not_json_hint}")
        return Reply(content, count(body.get("prompt_eval_count")), count(body.get("eval_count")))

    def _reply(self, response: httpx.Response) -> dict[str, Any]:
        said = error_text(response).lower()
        if response.status_code == 404 and "model" in said and "not found" in said:
            raise ExtractorError(
                f"{self.where} does not have the model {self.model_name!r} ({error_text(response)}): "
                f"run `ollama pull {self.model_name}`, or pick a model it has (`ollama list`)")
        return self._json(response, error_text(response))


def _factory(model: str | None) -> Extractor:
    return OllamaExtractor(model or DEFAULT_MODEL)


provider = ExtractorProvider(_factory, requires=("pydantic",), install=INSTALL)
"""What the `ollama` entry point of the `memshelf.extractors` group names."""
