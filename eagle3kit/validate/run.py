"""`eagle3kit validate`'s orchestration: scan the dataset once, run the checks, report."""

from __future__ import annotations

from pathlib import Path

from eagle3kit import _hf, _ui
from eagle3kit.chat.reasoning import Profile, learn_profile, load_renderer
from eagle3kit.chat.render import Renderer
from eagle3kit.format import Dataset, DatasetError
from eagle3kit.validate.checks import CheckResult, Context, damaged, run_checks
from eagle3kit.validate.clean import write_clean
from eagle3kit.validate.config import ValidateConfig
from eagle3kit.validate.figures import scan
from eagle3kit.validate.report import ValidateReport, partitions, show


def load_profile(cfg: ValidateConfig, ds: Dataset) -> Profile:
    try:
        renderer = _load_renderer(cfg, ds)
    except _hf.CustomCodeRefused as exc:
        if cfg.tokenizer is not None:  # the user named it: their mistake, said by its flag
            raise
        # The dataset's own copy, maybe from elsewhere: its code is not run, the checks that
        # read the data alone still are.
        why = str(_hf.custom_code_error("", exc.path))
        _ui.warn(f"{why}; the checks that need the tokenizer are skipped")
        return Profile(why_none=why)
    if renderer is None:
        return Profile(why_none="no tokenizer stored in the dataset; pass --tokenizer")
    think = (cfg.think_start, cfg.think_end) if cfg.think_start is not None else None
    return learn_profile(renderer, think)  # type: ignore[arg-type]


def _load_renderer(cfg: ValidateConfig, ds: Dataset) -> Renderer | None:
    stored = ds.tokenizer_dir
    tok_dir = cfg.tokenizer or (
        stored
        if (stored / "tokenizer_config.json").is_file() or (stored / "tokenizer.json").is_file()
        else None
    )
    if tok_dir is None:
        return None
    recorded = ds.recorded()
    template = cfg.chat_template
    if template is None and cfg.tokenizer is None:
        name = recorded.chat_template_file
        if name and (stored / Path(name).name).is_file():
            template = stored / Path(name).name
    # Trust comes from the command line only, never from what the dataset recorded.
    return load_renderer(
        Path(tok_dir),
        chat_template=template,
        chat_template_kwargs=recorded.chat_template_kwargs,
        system=recorded.system,
        trust_remote_code=cfg.trust_remote_code,
    )


def _damaged_report(cfg: ValidateConfig, ds: Dataset, problems: list[str]) -> ValidateReport:
    """Every damaged or missing shard as the integrity row; nothing else can be read."""
    rows = [damaged(problems, len(ds.shards))] + [
        CheckResult(name, "skip", "skipped: the shards it reads are damaged (integrity)")
        for name in cfg.selected()
        if name != "integrity"
    ]
    return ValidateReport(
        path=str(cfg.path),
        samples=len(ds),
        tokens=ds.num_tokens,
        profile={},
        checks=rows,
        partitions={},
        damaged=True,
    )


def validate(cfg: ValidateConfig) -> ValidateReport:
    ds = Dataset(cfg.path, kind="tokens", verify_shards=False)
    _ui.warn_all(ds.warnings)
    if len(ds) == 0:
        raise DatasetError(f"{cfg.path}: the dataset holds no samples; nothing to validate")
    problems = ds.check_files() or ds.verify()
    if problems:
        return _damaged_report(cfg, ds, problems)
    selected = cfg.selected()
    prof = load_profile(cfg, ds)
    figures = scan(ds, prof, want_meta="round_trip" in selected and prof.renderer is not None)
    checks = run_checks(selected, Context(cfg, ds, prof, figures))
    warnings = []
    if prof.harmony and prof.analysis is None:
        warnings.append(
            "gpt-oss harmony tokens, but the chat template shows no analysis "
            "channel for a reasoning turn: the reasoning checks are skipped"
        )
    return ValidateReport(
        path=str(cfg.path),
        samples=len(ds),
        tokens=ds.num_tokens,
        profile=prof.describe(),
        checks=checks,
        partitions=partitions(figures),
        warnings=warnings,
    )


def run(cfg: ValidateConfig) -> ValidateReport:
    report = validate(cfg)
    if cfg.write_clean is not None and not report.damaged:
        report.clean = write_clean(cfg, report)
    if cfg.output.json:
        _ui.print_json(report.to_dict())
    else:
        show(report, cfg.output)
    return report
