"""`validate --write-clean`: a new dataset without the samples any check flagged."""

from __future__ import annotations

from eagle3kit import _ui
from eagle3kit.format import Dataset, DatasetWriter
from eagle3kit.validate.config import ValidateConfig
from eagle3kit.validate.report import ValidateReport


def write_clean(cfg: ValidateConfig, report: ValidateReport) -> dict:
    """Copy every sample no check flagged into cfg.write_clean; the input is not touched."""
    assert cfg.write_clean is not None
    flagged: set[int] = set()
    for c in report.checks:
        flagged.update(c.flagged.tolist())
    ds = Dataset(cfg.path, verify_shards=False)
    _ui.warn_all(ds.warnings)
    kept = 0
    config = dict(ds.manifest.get("config", {}))
    provenance = {**ds.manifest.get("provenance", {}), "cleaned_from": str(cfg.path),
                  "removed_samples": len(flagged)}
    with DatasetWriter(cfg.write_clean, config=config, provenance=provenance) as writer:
        _ui.warn_all(writer.warnings)
        stored = ds.tokenizer_dir
        if stored.is_dir():
            writer.store_tokenizer(sorted(p for p in stored.iterdir() if p.is_file()))
        for i, sample in enumerate(ds.iter_samples()):
            if i not in flagged:
                kept += writer.add(sample)
    return {"path": str(cfg.write_clean), "kept": kept, "removed": len(flagged)}
