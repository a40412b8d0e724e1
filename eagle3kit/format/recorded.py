"""What one stage records in a token dataset's manifest for the stages after it.

gen writes, under the manifest's `config` (what decides the samples) and `provenance` (where
they came from), how each prompt was rendered, how the completions were sampled, which API
family answered and whether the tokenizer's own code was trusted; validate, extract and train
read it back. They read it through `Recorded` (`Dataset.recorded()`), never by key, so the
contract between the stages is this one class. extract carries the sampling and the API
family into a hidden-state dataset's `hidden.tokens` record, where this view reads them for
that dataset. The JSON is described in docs/format.md; a key that is missing or of the
wrong type (an older dataset, a hand-edited manifest) reads as "not recorded".
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Recorded:
    """The typed view of what gen recorded for later stages (see the module docstring)."""

    renderer: Mapping[str, Any]
    """config.renderer: the rendering's identity (template hash, template kwargs, system
    prompt, tokenizer hashes); empty when not recorded."""
    renderers: tuple[str | None, ...]
    """config.renderer of this config and of each earlier one (a run continued with --force),
    as canonical JSON (None where absent): more than one distinct value means the dataset
    mixes tokenizers or templates."""
    chat_template_file: str | None
    """provenance.chat_template_file: the name of the template file gen used (`--chat-template`),
    kept beside the stored tokenizer."""
    trust_remote_code: bool
    """provenance.trust_remote_code: a record of what gen was run with, never a switch: no
    later stage turns trust on because a dataset says so (docs/security.md)."""
    api_family: str | None
    """config.api_family: "ids" (the server returned token ids) or "text" (an OpenAI-style
    chat API, ids rebuilt from text)."""
    sampling: Mapping[str, Any] | None = None
    """config's SAMPLING_KEYS (those recorded; for a hidden-state dataset, those extract
    carried), when they record a temperature and every run that wrote the samples
    (config_history) drew from the same distribution (DISTRIBUTION_KEYS); None otherwise:
    data made by other tools or an older extract, or runs that differed."""

    @property
    def chat_template_xxh3(self) -> str | None:
        """The hash of the chat template the samples were rendered with."""
        return _str(self.renderer.get("chat_template_xxh3"))

    @property
    def chat_template_kwargs(self) -> dict[str, Any] | None:
        """The template's extra arguments gen rendered with (`--chat-template-kwargs`)."""
        kwargs = self.renderer.get("chat_template_kwargs")
        return dict(kwargs) if isinstance(kwargs, Mapping) and kwargs else None

    @property
    def system(self) -> str | None:
        """The system prompt gen added to every conversation (`--system`)."""
        return _str(self.renderer.get("system"))

    @property
    def text_api(self) -> bool:
        """Whether the samples' ids were rebuilt from a text API's answers."""
        return self.api_family == "text"

    @property
    def drawn_at(self) -> float | None:
        """The temperature every completion was drawn at from the target's whole
        distribution (no top-k, top-p or min-p), as the ids the server returned: what lets
        train read a decode's verdicts off the data. None where that is not known: sampling
        not recorded or not the same for every run, a distribution cut by top-k, top-p or
        min-p, or ids rebuilt from text."""
        if self.sampling is None or self.text_api:
            return None
        s = self.sampling
        whole = s.get("top_p", 1) == 1 and s.get("top_k", -1) in (-1, 0) and not s.get("min_p")
        return float(s["temperature"]) if whole else None

    @classmethod
    def of(cls, manifest: Mapping[str, Any]) -> Recorded:
        """The view of `manifest` (a dataset's parsed manifest.json)."""
        config, provenance = _dict(manifest.get("config")), _dict(manifest.get("provenance"))
        history = manifest.get("config_history")
        earlier = [_dict(h) for h in history if h] if isinstance(history, list) else []
        # A hidden-state dataset: what extract carried over from its token dataset.
        tokens = _dict(_dict(manifest.get("hidden")).get("tokens"))
        return cls(
            renderer=_dict(config.get("renderer")),
            renderers=tuple(_canonical(c.get("renderer")) for c in [config, *earlier]),
            chat_template_file=_str(provenance.get("chat_template_file")),
            trust_remote_code=provenance.get("trust_remote_code") is True,
            api_family=_str(config.get("api_family")) or _str(tokens.get("api_family")),
            sampling=_sampling([_dict(tokens.get("sampling"))] if tokens else [config, *earlier]),
        )


def _dict(value: Any) -> dict[str, Any]:
    return dict(value) if isinstance(value, Mapping) else {}


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _canonical(value: Any) -> str | None:
    return None if value is None else json.dumps(value, sort_keys=True)


SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "max_tokens", "n", "sampling_seed")
"""gen's sampling settings, as its manifest config records them."""
DISTRIBUTION_KEYS = ("temperature", "top_p", "top_k", "min_p")
"""The SAMPLING_KEYS that decide the distribution a completion is drawn from."""


def _sampling(configs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The SAMPLING_KEYS configs[0] records, when it records a temperature and every later
    config (the earlier runs of a dataset continued with --force) drew alike; else None."""
    first = configs[0]
    temperature = first.get("temperature")
    if not isinstance(temperature, int | float) or isinstance(temperature, bool):
        return None
    if any(c.get(k) != first.get(k) for c in configs[1:] for k in DISTRIBUTION_KEYS):
        return None
    return {k: first[k] for k in SAMPLING_KEYS if k in first}


@dataclass(frozen=True)
class Origin:
    """Where a dataset's samples came from, for a reader that describes it (an export's
    model card): the prompts and the servers and sampling that answered them (gen), or the
    token dataset whose hidden states these are (extract). Unrecorded reads as empty."""

    stage: str | None
    prompts: tuple[str, ...]
    """provenance.prompts: the prompt files gen read."""
    prompt_dataset: str | None
    """provenance.dataset: the named prompt set (`gen --dataset`)."""
    servers: tuple[str, ...]
    """provenance.servers (gen) or provenance.server (extract)."""
    engine: str | None
    served_model: str | None
    """config.model: the model the servers reported serving."""
    sampling: Mapping[str, Any]
    """The SAMPLING_KEYS gen recorded (those not null)."""
    tokens: str | None
    """provenance.tokens: the token dataset a hidden-state dataset was extracted from."""

    @classmethod
    def of(cls, manifest: Mapping[str, Any]) -> Origin:
        config, provenance = _dict(manifest.get("config")), _dict(manifest.get("provenance"))
        servers = provenance.get("servers")
        if not isinstance(servers, list):
            servers = [provenance.get("server")]
        prompts = provenance.get("prompts")
        return cls(
            stage=_str(config.get("stage")),
            prompts=tuple(p for p in prompts if _str(p)) if isinstance(prompts, list) else (),
            prompt_dataset=_str(provenance.get("dataset")),
            servers=tuple(s for s in servers if _str(s)),
            engine=_str(provenance.get("engine")) or _str(config.get("engine")),
            served_model=_str(config.get("model")),
            sampling={k: config[k] for k in SAMPLING_KEYS if config.get(k) is not None},
            tokens=_str(provenance.get("tokens")),
        )
