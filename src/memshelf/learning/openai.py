"""The `openai:MODEL` extractor: the OpenAI API, or any server that speaks its POST /chat/completions (vLLM, LM
Studio, llama.cpp's llama-server, Ollama's /v1...).

The answer's JSON schema goes in `response_format` (`json_schema`, strict); a server that answers 400 saying it
does not support that is asked again, and from then on, with `json_object` (plain JSON mode), and the schema is
checked on our side as always. The temperature is 0. The server and key are found as the OpenAI embedder finds them
(`base_url`/`api_key`, else OPENAI_BASE_URL/OPENAI_API_KEY; no key sends no Authorization header, which local
servers accept). Token counts are the reply's usage.prompt_tokens and usage.completion_tokens.
"""

from __future__ import annotations

import os
from typing import Any

import httpx

from ..embedders._http import deadline_client
from ..embedders.openai import DEFAULT_BASE_URL, error_text
from ..errors import ExtractorError
from ._chat import ANSWER_SCHEMA, INSTALL, MAX_ANSWER_TOKENS, ChatExtractor, Meter, Reply, count, extractor_timeout
from .base import Extractor, ExtractorProvider

DEFAULT_MODEL = "gpt-4o-mini"
SCHEMA_FORMAT = {"type": "json_schema", "json_schema": {"name": "proposals", "strict": True, "schema": ANSWER_SCHEMA}}
JSON_FORMAT = {"type": "json_object"}


def _rejects_schema(response: httpx.Response) -> bool:
    """A 400 that says the server does not take a JSON schema in response_format."""
    said = error_text(response).lower()
    return response.status_code == 400 and ("json_schema" in said or "response_format" in said)


class OpenAIExtractor(ChatExtractor):
    """Proposals from an OpenAI chat model (gpt-4o-mini by default) or any model behind a compatible server."""

    unreachable_hint = "check the network, or set OPENAI_BASE_URL to a server that runs"
    url_hint = "fix base_url or OPENAI_BASE_URL"
    busy_hint = "wait and retry, or check the account's rate limits and quota"
    not_json_hint = ("check that OPENAI_BASE_URL points at an OpenAI-compatible /chat/completions endpoint "
                     "(often .../v1)")

    def __init__(self, model: str = DEFAULT_MODEL, base_url: str | None = None, api_key: str | None = None,
                 timeout: float | None = None) -> None:
        self.model_name = model
        self.name = f"openai:{model}"
        self.base_url = (base_url or os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL).rstrip("/")
        self.where = self.base_url
        self.timeout = extractor_timeout(timeout)
        key = api_key or os.environ.get("OPENAI_API_KEY")
        self._client = deadline_client(self.timeout, headers={"Authorization": f"Bearer {key}"} if key else {})
        self.response_format: dict[str, Any] = SCHEMA_FORMAT  # JSON_FORMAT once the server refuses a schema

    def _chat(self, messages: list[dict[str, str]], meter: Meter) -> Reply:
        response = self._send(messages, meter)
        if self.response_format is SCHEMA_FORMAT and _rejects_schema(response):
            self.response_format = JSON_FORMAT
            response = self._send(messages, meter)
        return self._answer(self._reply(response))

    def _send(self, messages: list[dict[str, str]], meter: Meter) -> httpx.Response:
        payload = {"model": self.model_name, "messages": messages, "temperature": 0, "max_tokens": MAX_ANSWER_TOKENS,
                   "response_format": self.response_format}
        meter.calls += 1
        return self._post(f"{self.base_url}/chat/completions", payload)

    def _answer(self, body: dict[str, Any]) -> Reply:
        choices = body.get("choices")
        first = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
        message = first.get("message")
        if not isinstance(message, dict):
            raise ExtractorError(f"{self.where} answered without a message: {self.not_json_hint}")
        content = message.get("content")  # None when the model refused; read as an answer that is not JSON
        usage = body.get("usage")
        usage = usage if isinstance(usage, dict) else {}
        return Reply(content if isinstance(content, str) else "", count(usage.get("prompt_tokens")),
                     count(usage.get("completion_tokens")))

    def _reply(self, response: httpx.Response) -> dict[str, Any]:
        if response.status_code in (401, 403):
            raise ExtractorError(
                f"{self.base_url} rejected the API key (HTTP {response.status_code}: {error_text(response)}): "
                "set OPENAI_API_KEY (or pass api_key=) to a key that may use the chat completions API")
        if response.status_code == 404:
            raise ExtractorError(
                f"{self.base_url} has no model {self.model_name!r} or no /chat/completions "
                f"(HTTP 404: {error_text(response)}): check the model name, and that OPENAI_BASE_URL ends "
                "where the API's paths begin (often .../v1)")
        return self._json(response, error_text(response))


def _factory(model: str | None) -> Extractor:
    return OpenAIExtractor(model or DEFAULT_MODEL)


provider = ExtractorProvider(_factory, requires=("pydantic",), install=INSTALL)
"""What the `openai` entry point of the `memshelf.extractors` group names."""
