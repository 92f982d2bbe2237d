#!/usr/bin/env bash
# The GPU check of issue 32, as one command of at most 8 minutes on a GPU machine (Python 3.12,
# its own CUDA build of torch, no network): torchstep-agent against torchrun on the same GPU —
# a DDP step over NCCL under the agent with the zygote on, a rank killed mid-step and recovered,
# CUDA_VISIBLE_DEVICES / LOCAL_RANK as torchrun sets them, startup and recovery times
# (bench/gpu_bench.py says what each check is); then a stuck rank cancelled: its stacks and
# NCCL's flight recorder dump in the result (bench/gpu_flight.py).
#
#   bench/gpu.sh --build-wheels   here (network, the repo's .venv): fill bench/gpu-wheels/ with the
#                                 torchstep wheel, torchx's and their pure-Python dependencies (~5 MiB,
#                                 git-ignored; it travels with the working tree)
#   bench/gpu.sh [--runs N]       on the GPU machine: install the wheels the machine lacks with
#                                 `pip install --no-index --no-deps --target`, run the check, write
#                                 bench/results/gpu.json and the "On a GPU" section of docs/performance.md
#                                 (and copies into $OUT when set)
#   bench/gpu.sh --dry            the CPU parts (gloo, no GPU asserts), on any machine: what make test runs
#
# PYTHON picks the interpreter (default python3; the one whose torch is measured).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
PYTHON=${PYTHON:-python3}
WHEELS=${GPU_WHEELS:-$HERE/gpu-wheels}
TORCHX=$(sed -n 's/^torchx==//p' "$ROOT/requirements/dev.lock")

# The torchstep wheel, built from a copy of the tree (a build writes build/ and egg-info
# beside the sources: never into the checkout, where a test run may build at the same time).
torchstep_wheel() {  # PYTHON_WITH_SETUPTOOLS DEST
    local src
    src=$(mktemp -d "${TMPDIR:-/tmp}/torchstep-src.XXXXXX")
    cp -r "$ROOT/adapters/core/." "$src/"
    rm -rf "$src/build" "$src"/src/*.egg-info
    "$1" -m pip wheel -q --no-deps --no-build-isolation -w "$2" "$src"
    rm -rf "$src"
}

build_wheels() {
    local py=$ROOT/.venv/bin/python
    rm -rf "$WHEELS" && mkdir -p "$WHEELS"
    torchstep_wheel "$py" "$WHEELS"
    # torchx and its dependencies as the GPU machine's Python 3.12 installs them (pure wheels or
    # cp312 manylinux ones), from PyPI whatever this machine's pip configuration says
    PIP_CONFIG_FILE=/dev/null PIP_FIND_LINKS= "$py" -m pip download -q --dest "$WHEELS" --only-binary=:all: \
        --python-version 3.12 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
        "torchx==${TORCHX:-0.7.0}" "pyyaml>=6"
    du -sh "$WHEELS"
    ls "$WHEELS"
}

if [[ ${1:-} == --build-wheels ]]; then
    build_wheels
    exit 0
fi

dry=0
for arg in "$@"; do [[ $arg == --dry ]] && dry=1; done
work=$(mktemp -d "${TMPDIR:-/tmp}/torchstep-gpu.XXXXXX")
trap 'rm -rf "$work"' EXIT
site=$work/site

if [[ ! -d $WHEELS ]]; then
    if [[ $dry == 1 ]]; then  # no wheel folder here: the torchstep wheel alone, built from the tree
        WHEELS=$work/wheels
        torchstep_wheel "$PYTHON" "$WHEELS"
    else
        echo "gpu.sh: no $WHEELS; fix: run 'bench/gpu.sh --build-wheels' (or make gpu-wheels) where there is a network" >&2
        exit 2
    fi
fi

# The wheels to install: torchstep always (the version under test), any other only where this
# Python lacks that distribution (never shadow what torch brought: filelock, fsspec, ...).
mapfile -t wanted < <("$PYTHON" - "$WHEELS" <<'EOF'
import importlib.metadata as md
import pathlib
import re
import sys

for wheel in sorted(pathlib.Path(sys.argv[1]).glob("*.whl")):
    name = re.sub(r"[-_.]+", "-", wheel.name.split("-")[0]).lower()
    try:
        md.version(name)
        present = name != "torchstep"
    except md.PackageNotFoundError:
        present = False
    if not present:
        print(wheel)
EOF
)
if ((${#wanted[@]} == 0)); then
    echo "gpu.sh: no torchstep wheel in $WHEELS; fix: bench/gpu.sh --build-wheels" >&2
    exit 2
fi
if "$PYTHON" -m pip --version >/dev/null 2>&1; then
    "$PYTHON" -m pip install -q --no-index --no-deps --disable-pip-version-check --target "$site" "${wanted[@]}"
else  # no pip in the image: a wheel is a zip of the files --target would write
    "$PYTHON" -c 'import sys, zipfile; [zipfile.ZipFile(w).extractall(sys.argv[1]) for w in sys.argv[2:]]' "$site" "${wanted[@]}"
fi
echo "gpu.sh: installed into $site: $(cd "$site" && ls -d ./*.dist-info | sed 's|^\./||; s|\.dist-info$||' | tr '\n' ' ')"
export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}

args=("$@")
if [[ $dry == 0 ]]; then
    args+=(--write-docs)
fi
if [[ -n ${OUT:-} ]]; then
    args+=(--out "$OUT")
fi
# 9 minutes at most in all: no run starts after 400 s, and a stuck one is cut at 470 s; then
# the stacks and NCCL flight recorder check (bench/gpu_flight.py), cut at 60 s
cd "$ROOT"
code=0
timeout --kill-after 5 470 "$PYTHON" "$HERE/gpu_bench.py" --budget 400 "${args[@]}" || code=$?
flight=()
if [[ $dry == 1 ]]; then
    flight+=(--dry)
fi
if [[ -n ${OUT:-} ]]; then
    flight+=(--out "$OUT")
fi
timeout --kill-after 5 60 "$PYTHON" "$HERE/gpu_flight.py" "${flight[@]}" || code=$((code ? code : 1))
exit $code
