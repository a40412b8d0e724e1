"""`eagle3kit export`: a trained drafter as the checkpoints vLLM and SGLang load (run.py
writes and checks them; config.py holds the options). The face other code imports."""

from eagle3kit.export.config import ExportConfig
from eagle3kit.export.result import Exported, ExportResult
from eagle3kit.export.run import run

__all__ = ["ExportConfig", "ExportResult", "Exported", "run"]
