"""`eagle3kit convert`'s orchestration: JSONL (jsonl.py), Parquet (parquet.py) or hidden
states (hidden_export.py, hidden_import.py)."""

from __future__ import annotations

from eagle3kit import _ui
from eagle3kit.convert.config import ConvertConfig
from eagle3kit.convert.jsonl import export_jsonl, import_jsonl
from eagle3kit.convert.result import ConvertResult


def run(cfg: ConvertConfig) -> ConvertResult:
    if cfg.hidden:
        if cfg.hidden == "export":
            from eagle3kit.convert.hidden_export import export_hidden

            result = export_hidden(cfg)
        else:
            from eagle3kit.convert.hidden_import import import_hidden

            result = import_hidden(cfg)
    elif cfg.parquet:
        from eagle3kit.convert.parquet import export_parquet, import_parquet

        result = export_parquet(cfg) if cfg.exporting else import_parquet(cfg)
    else:
        result = export_jsonl(cfg) if cfg.exporting else import_jsonl(cfg)
    if cfg.output.json:
        _ui.print_json(result.__dict__)
    return result
