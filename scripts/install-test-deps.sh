#!/usr/bin/env bash
# Installs what the test suite reads dptrain's outputs with: a virtual environment in build/venv
# with the tensorboard and Pillow packages from PyPI (e2e/tensorboard), and onnx and onnxruntime
# (e2e/export_onnx: dpexport's models checked and run). Idempotent; root for apt.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${DP_TEST_VENV:-build/venv}
packages=("tensorboard>=2.15,<3" "pillow>=9" "onnx" "onnxruntime")

source scripts/python-venv.sh
need_python_venv install-test-deps
if "$venv/bin/python3" -c 'import tensorboard, PIL, numpy, onnx, onnxruntime' 2>/dev/null; then
  echo "install-test-deps: $venv has $("$venv/bin/python3" -c 'import tensorboard, onnx, onnxruntime as ort; print("tensorboard", tensorboard.__version__, "onnx", onnx.__version__, "onnxruntime", ort.__version__)')"
  exit 0
fi
echo "install-test-deps: creating $venv with ${packages[*]}"
[[ -x $venv/bin/python3 ]] || /usr/bin/python3 -m venv "$venv"
"$venv/bin/python3" -m pip install -q --disable-pip-version-check "${packages[@]}"
