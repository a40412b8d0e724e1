"""`python -m eagle3kit.bench.vllm_cpu_expand_fix`: the folder a vLLM CPU server takes first on
its PYTHONPATH (see the package's docstring)."""

from eagle3kit.bench.vllm_cpu_expand_fix import FOLDER

print(FOLDER)
