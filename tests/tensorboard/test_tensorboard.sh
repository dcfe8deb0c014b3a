#!/usr/bin/env bash
# TensorBoard reads what dtf writes: a Python virtual environment (cached in <venv_dir>) gets
# `tensorboard` from PyPI; write_run trains a small network in a monitored_training_session
# whose hooks write an event file; check_run.py reads it with TensorBoard's EventAccumulator
# and compares tags, steps and values with what the writer recorded.
#
#   test_tensorboard.sh <write_run> <venv_dir> <work_dir>
set -euo pipefail
write_run=$1 venv=$2 work=$3
here=$(cd "$(dirname "$0")" && pwd)
bash "$here/ensure_venv.sh" "$venv"
"$venv/bin/python" -c "import tensorboard; print('test_tensorboard: tensorboard', tensorboard.__version__)"

rm -rf "$work"
mkdir -p "$work"
timeout 120 "$write_run" "$work" 60
timeout 120 "$venv/bin/python" "$here/check_run.py" "$work"
