"""format/recorded.py: what gen records in a token dataset for later stages, read through one
typed view (`Dataset.recorded()`), from datasets written by the real writer."""

from __future__ import annotations

from pathlib import Path

import pytest

from eagle3kit.format import Dataset, DatasetWriter, Recorded, TokenSample
from eagle3kit.format.recorded import SAMPLING_KEYS

RENDERER = {
    "chat_template_xxh3": "ab12",
    "chat_template_kwargs": {"enable_thinking": False},
    "system": "Be brief.",
    "tokenizer_xxh3": "cd34",
}


def write(path: Path, config: dict, provenance: dict | None = None, **options) -> Dataset:
    with DatasetWriter(path, config=config, provenance=provenance, **options) as writer:
        writer.add(TokenSample(f"s{len(options)}", [1, 2], [3, 4]))
    return Dataset(path)


def test_the_view_reads_what_gen_records(tmp_path: Path) -> None:
    # gen/run.py's keys: config.renderer and config.api_family, provenance's template file
    # and trust.
    ds = write(
        tmp_path / "ds",
        {"renderer": RENDERER, "api_family": "text"},
        {"chat_template_file": "/elsewhere/tool.jinja", "trust_remote_code": True},
    )
    got = ds.recorded()
    assert got == Recorded(
        renderer=RENDERER,
        renderers=(got.renderers[0],),
        chat_template_file="/elsewhere/tool.jinja",
        trust_remote_code=True,
        api_family="text",
    )
    assert got.chat_template_xxh3 == "ab12" and got.system == "Be brief."
    assert got.chat_template_kwargs == {"enable_thinking": False} and got.text_api


def test_a_missing_or_mistyped_record_reads_as_not_recorded(tmp_path: Path) -> None:
    # A convert-made dataset records none of it; a hand-edited one may hold anything.
    assert write(tmp_path / "none", {}).recorded() == Recorded({}, (None,), None, False, None)
    odd = write(
        tmp_path / "odd",
        {"renderer": "qwen3", "api_family": 3},
        {"chat_template_file": ["x"], "trust_remote_code": "yes"},
    ).recorded()
    assert odd == Recorded({}, ('"qwen3"',), None, False, None)
    assert (odd.chat_template_xxh3, odd.chat_template_kwargs, odd.system) == (None, None, None)
    assert not odd.text_api


def test_a_run_continued_with_force_shows_two_renderings(tmp_path: Path) -> None:
    path = tmp_path / "ds"
    assert len(set(write(path, {"renderer": RENDERER}).recorded().renderers)) == 1
    other = {**RENDERER, "chat_template_xxh3": "ff00"}
    got = write(path, {"renderer": other}, mode="resume", force=True).recorded()
    assert len(set(got.renderers)) == 2 and got.chat_template_xxh3 == "ff00"


SAMPLED = {
    "stage": "gen",
    "api_family": "ids",
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": -1,
    "min_p": 0.0,
    "max_tokens": 64,
    "n": 1,
    "sampling_seed": 0,
}
"""gen's config keys for completions sampled at temperature 1 from the whole distribution."""


def test_the_sampling_temperature_holds_while_every_run_drew_alike(tmp_path: Path) -> None:
    path = tmp_path / "ds"
    got = write(path, SAMPLED).recorded()
    assert got.sampling == {k: SAMPLED[k] for k in SAMPLING_KEYS} and got.drawn_at == 1.0
    # Continued with --force: a longer cap draws alike, another temperature does not.
    longer = write(path, {**SAMPLED, "max_tokens": 128}, mode="resume", force=True).recorded()
    assert longer.drawn_at == 1.0 and longer.sampling["max_tokens"] == 128
    hotter = write(path, {**SAMPLED, "temperature": 1.2}, mode="resume", force=True).recorded()
    assert hotter.sampling is None and hotter.drawn_at is None


@pytest.mark.parametrize(
    "config",
    [
        {**SAMPLED, "top_p": 0.9},
        {**SAMPLED, "top_k": 20},
        {**SAMPLED, "min_p": 0.05},
        {**SAMPLED, "api_family": "text"},  # ids rebuilt from text: not what was sampled
        {**SAMPLED, "temperature": "1"},  # hand-edited
        {"stage": "convert"},  # another tool's data: nothing recorded
    ],
)
def test_a_cut_distribution_or_an_unknown_one_is_not_a_temperature(
    tmp_path: Path, config: dict
) -> None:
    assert write(tmp_path / "ds", config).recorded().drawn_at is None


def test_a_hidden_datasets_view_is_its_token_datasets_record() -> None:
    """extract carries the sampling and the API family into `hidden.tokens`; an older
    extract's record has neither."""
    tokens = {"created": 1.0, "sampling": {k: SAMPLED[k] for k in SAMPLING_KEYS}}
    hidden = {"config": {"stage": "extract"}, "hidden": {"tokens": {**tokens, "api_family": "ids"}}}
    assert Recorded.of(hidden).drawn_at == 1.0
    text = {**hidden, "hidden": {"tokens": {**tokens, "api_family": "text"}}}
    assert Recorded.of(text).text_api and Recorded.of(text).drawn_at is None
    older = {**hidden, "hidden": {"tokens": {"created": 1.0}}}
    assert Recorded.of(older).sampling is None and Recorded.of(older).drawn_at is None
