#!/usr/bin/env bash
# ensure_venv.sh <venv_dir>: a Python virtual environment with tensorboard from PyPI, created
# once and reused (the tests keep it in the build directory). Two tests may call this at the
# same time: a lock keeps them from building it twice.
set -euo pipefail
venv=$1
python=${DTF_TEST_PYTHON3:-python3}
mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
flock -w 600 9 || { echo "ensure_venv: timed out waiting for $venv.lock"; exit 1; }
if ! "$venv/bin/python" -c "import tensorboard" 2>/dev/null; then
  echo "ensure_venv: creating $venv and installing tensorboard from PyPI"
  rm -rf "$venv"
  "$python" -m venv "$venv" || { echo "ensure_venv: python3 -m venv failed (install python3-venv)"; exit 1; }
  "$venv/bin/pip" install --quiet --disable-pip-version-check tensorboard ||
    { echo "ensure_venv: pip install tensorboard failed (is PyPI reachable?)"; exit 1; }
fi
