"""format/recorded.py: what gen records in a token dataset for later stages, read through one
typed view (`Dataset.recorded()`), from datasets written by the real writer."""

from __future__ import annotations

from pathlib import Path

from eagle3kit.format import Dataset, DatasetWriter, Recorded, TokenSample

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
