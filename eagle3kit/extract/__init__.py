"""`eagle3kit extract`: the target's hidden states for every sample of a token dataset, from
transformers (hf.py) or a vLLM server (vllm.py); run.py plans and runs it. The face other
code imports."""

from eagle3kit.extract.config import ExtractConfig
from eagle3kit.extract.result import ExtractResult
from eagle3kit.extract.run import batches, run, scan, workload

__all__ = ["ExtractConfig", "ExtractResult", "batches", "run", "scan", "workload"]
