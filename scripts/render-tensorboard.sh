#!/usr/bin/env bash
# Screenshots TensorBoard's scalars and images dashboards for a log directory with headless Chromium.
#   scripts/render-tensorboard.sh LOGDIR [OUTDIR]
# Starts `tensorboard --logdir LOGDIR` (build/venv's, else the one on PATH) on a free loopback port,
# writes OUTDIR/tensorboard-scalars.png and OUTDIR/tensorboard-images.png (default: LOGDIR), and
# stops it. Needs Debian's `chromium` (apt-get install chromium) and the tensorboard package
# (scripts/install-test-deps.sh puts it in build/venv).
set -euo pipefail
cd "$(dirname "$0")/.."
logdir=${1:?usage: $0 LOGDIR [OUTDIR]}
outdir=${2:-$logdir}
[[ -d $logdir ]] || { echo "render-tensorboard: '$logdir' is not a directory" >&2; exit 1; }
tensorboard=build/venv/bin/tensorboard
[[ -x $tensorboard ]] || tensorboard=$(command -v tensorboard) ||
  { echo "render-tensorboard: no tensorboard; run scripts/install-test-deps.sh" >&2; exit 1; }
browser=$(command -v chromium || command -v chromium-browser || command -v google-chrome) ||
  { echo "render-tensorboard: no Chromium; install it with: apt-get install chromium" >&2; exit 1; }
port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
profile=$(mktemp -d)
"$tensorboard" --logdir "$logdir" --host 127.0.0.1 --port "$port" >"$profile/tensorboard.log" 2>&1 &
tb_pid=$!
trap 'kill $tb_pid 2>/dev/null; wait $tb_pid 2>/dev/null; rm -rf "$profile"' EXIT
for _ in $(seq 60); do  # up to 30 s for the server, then for the runs to be loaded
  runs=$(curl -s "http://127.0.0.1:$port/data/runs" || true)
  [[ $runs == \[\"* ]] && break
  sleep 0.5
done
[[ $runs == \[\"* ]] || { echo "render-tensorboard: tensorboard found no runs in '$logdir'" >&2; exit 1; }
mkdir -p "$outdir"
for page in "scalars:scalars&_smoothingWeight=0" "images:images"; do
  out="$outdir/tensorboard-${page%%:*}.png"
  "$browser" --headless=new --no-sandbox --disable-gpu --hide-scrollbars --no-first-run \
    --user-data-dir="$profile/chromium" --window-size=1500,1300 --virtual-time-budget=15000 \
    --screenshot="$out" "http://127.0.0.1:$port/?darkMode=false#${page#*:}" >/dev/null 2>&1
  [[ -s $out ]] || { echo "render-tensorboard: Chromium wrote no screenshot" >&2; exit 1; }
  echo "render-tensorboard: $out (runs: $runs)"
done
