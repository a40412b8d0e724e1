"""`eagle3kit convert`: token datasets to and from JSONL (jsonl.py) or Parquet (parquet.py),
hidden-state datasets to and from speculators' and SpecForge's files (hidden_export.py,
hidden_import.py, over hidden.py); config.py decides which. The face other code imports."""

from eagle3kit.convert.config import ConvertConfig
from eagle3kit.convert.result import ConvertResult
from eagle3kit.convert.run import run

__all__ = ["ConvertConfig", "ConvertResult", "run"]
