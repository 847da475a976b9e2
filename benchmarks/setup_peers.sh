#!/usr/bin/env bash
# Build the curvature benchmark's own venv with the peer libraries (hessian-eigenthings,
# curvlinops + scipy eigsh). Torch is pinned by a constraints file: unconstrained,
# curvlinops' dependencies (backpack -> torchvision) upgrade torch to a CUDA build
# (docs/numerics.md#benchmarks). Never install the peers into the project's .venv.
#
#   benchmarks/setup_peers.sh [VENV_DIR]      (default: .bench-venv at the repository root)
#
# torch==2.13.0 is installed with plain pip (the project's machines keep the CPU wheel on
# local disk, the same way `make install` finds it). Elsewhere, set TORCH_INDEX_URL to the
# torch wheel index that matches the machine (CPU or your CUDA version).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${1:-$root/.bench-venv}"
python="${PYTHON:-python3}"
torch_index="${TORCH_INDEX_URL:-}"

"$python" -m venv "$venv"
constraints="$(mktemp)"
trap 'rm -f "$constraints"' EXIT
echo "torch==2.13.0" > "$constraints"

if [ -n "$torch_index" ]; then
    "$venv/bin/pip" install --extra-index-url "$torch_index" torch==2.13.0
else
    "$venv/bin/pip" install torch==2.13.0
fi
"$venv/bin/pip" install -c "$constraints" \
    hessian-eigenthings==1.0.0a5 curvlinops-for-pytorch==3.0.1 \
    numpy scipy threadpoolctl safetensors pydantic typer "transformers>=5.0,<6"
# backpack (curvlinops) pulls PyPI's torchvision, which fails to load beside the pinned torch
# ("operator torchvision::nms does not exist") and then breaks transformers' model imports
# (the GPT-2 rows); neither peer needs it at run time
if ! "$venv/bin/python" -c "import torchvision" 2>/dev/null; then
    "$venv/bin/pip" uninstall -y torchvision
fi
# the engine itself (its installed package names) without re-resolving its dependencies
"$venv/bin/pip" install --no-deps -e "$root"

"$venv/bin/python" - <<'PY'
import torch, hessian_eigenthings, curvlinops  # noqa: F401
from transformers import GPT2LMHeadModel  # noqa: F401  (the GPT-2 rows)
from importlib.metadata import version
assert torch.__version__.startswith("2.13.0"), f"torch was changed to {torch.__version__}"
print("torch", torch.__version__, "| hessian-eigenthings", version("hessian-eigenthings"),
      "| curvlinops", version("curvlinops-for-pytorch"))
PY
echo "ready: $venv/bin/python benchmarks/bench_curvature.py"
