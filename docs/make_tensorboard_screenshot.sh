#!/usr/bin/env bash
# Regenerate docs/tensorboard_sweep.png: a smoke sweep logged with TensorBoardLogger, served
# by TensorBoard on 127.0.0.1 only, photographed by headless Chromium
# (Debian: apt-get install -y chromium).
#   PYTHON=.venv/bin/python TENSORBOARD=tensorboard docs/make_tensorboard_screenshot.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
TENSORBOARD=${TENSORBOARD:-tensorboard}
STUDY=${STUDY:-runs/tb_sweep}
"$PYTHON" - "$STUDY" <<'PY'
import sys

from interp_toolkit.loggers import TensorBoardLogger
from interp_toolkit.studies.sweep.run import run_sweep
from interp_toolkit.studies.grid.config import preset

result = run_sweep(preset("smoke"), sys.argv[1], workers=1, progress=False, report=False,
                   callbacks=[TensorBoardLogger()])
print(len(result.rows), "runs")
PY
"$TENSORBOARD" --logdir "$STUDY" --host 127.0.0.1 --port 6123 > "$STUDY/tensorboard.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER' EXIT
for _ in $(seq 60); do curl -s -o /dev/null http://127.0.0.1:6123/ && break; sleep 1; done
chromium --headless=new --no-sandbox --disable-gpu --hide-scrollbars --window-size=1500,1050 \
  --virtual-time-budget=40000 --screenshot=docs/tensorboard_sweep.png \
  "http://127.0.0.1:6123/?darkMode=false#scalars&_smoothingWeight=0&tagFilter=accuracy"
