"""Where completions come from: HTTP servers (SGLang, vLLM) or transformers in-process.

A backend is anything with `name`, `slots`, `generate(request)` and `healthy()`; the
scheduler treats them alike. An HTTP backend can also be probed again (`identity`), so a
server that restarted is checked before it gets more work.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import eagle3kit.gen.servers as servers
from eagle3kit.gen.types import Completion, GenRequest

PROBE_TEXT = "Hello, world! 12345 ünïcödé 你好 <tag> \n\tdone."
"""The text each server tokenizes, to be compared with --tokenizer's ids."""


class Backend(Protocol):
    slots: int

    @property
    def name(self) -> str: ...

    @property
    def max_model_len(self) -> int | None: ...

    async def generate(self, request: GenRequest) -> Completion: ...

    async def healthy(self) -> bool: ...

    async def close(self) -> None: ...


@dataclass
class HttpBackend:
    """One server URL with its own slots and its own connection pool."""

    info: servers.ServerInfo
    slots: int
    api_key: str | None = field(default=None, repr=False)
    timeout: float | None = None
    chat_rebuild: Any = None
    """For --api openai-chat: (reasoning, content) -> completion ids."""
    chat_template_kwargs: dict | None = None
    _client: Any = None

    @property
    def name(self) -> str:
        return self.info.url

    @property
    def max_model_len(self) -> int | None:
        return self.info.max_model_len

    def client(self):
        if self._client is None:
            self._client = servers.make_client(self.slots)
        return self._client

    async def generate(self, request: GenRequest) -> Completion:
        if self.info.api == "openai-chat":
            extra = (
                {"chat_template_kwargs": self.chat_template_kwargs}
                if self.chat_template_kwargs
                else None
            )
            return await servers.chat_generate(
                self.client(),
                self.info,
                request.messages or [],
                request,
                self.chat_rebuild,
                api_key=self.api_key,
                timeout=self.timeout,
                extra_body=extra,
            )
        return await servers.generate(
            self.client(), self.info, request, api_key=self.api_key, timeout=self.timeout
        )

    async def healthy(self) -> bool:
        # A /health behind the same key as the server answers 401 without it.
        return await servers.health(self.client(), self.info.url, api_key=self.api_key)

    async def identity(self) -> servers.ServerInfo:
        """Probe the server again (model, API, context); UserError when it cannot be."""
        return await servers.probe(
            self.client(), self.info.url, api=self.info.api, api_key=self.api_key
        )

    async def tokenizer_disagreement(self, local: list[int]) -> str | None:
        """Why the server's tokenization of PROBE_TEXT differs from `local`; None when it
        agrees or the server has no /tokenize. ServerError when the request fails."""
        remote = await servers.tokenize(self.client(), self.info, PROBE_TEXT, api_key=self.api_key)
        if remote is None or list(remote) == list(local):
            return None
        return (
            f"the server's tokenizer ({self.info.model}) does not agree with --tokenizer on "
            f"a probe text ({len(remote)} vs {len(local)} tokens)"
        )

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None


async def connect(
    url: str, api: str, slots: int, api_key: str | None, timeout: float | None, **chat: Any
) -> HttpBackend:
    """Probe the server once; a dead or unknown server ends the run before anything starts."""
    client = servers.make_client(slots)
    try:
        info = await servers.probe(client, url, api=api, api_key=api_key)
    except BaseException:
        await client.aclose()
        raise
    return HttpBackend(info, slots, api_key=api_key, timeout=timeout, _client=client, **chat)
