"""The fix for vLLM 0.32.0's CPU build at temperature > 0 (vllm#55005), for a user's server.

`sitecustomize.py` here replaces the build's broken C++ stand-in for the Triton
`expand_kernel` with a correct one when Python starts: put this folder first on the vLLM
server's PYTHONPATH. `python -m eagle3kit.bench.vllm_cpu_expand_fix` prints the folder:

    PYTHONPATH=$(python -m eagle3kit.bench.vllm_cpu_expand_fix) \
        python -m vllm.entrypoints.openai.api_server --model DIR ...

(a server on another machine takes a copy of the file, in a folder of its own). Python loads
only the first `sitecustomize` on its path: this one takes the place of any other.
"""

from __future__ import annotations

from pathlib import Path

FOLDER = Path(__file__).resolve().parent
"""What the server's PYTHONPATH starts with."""
