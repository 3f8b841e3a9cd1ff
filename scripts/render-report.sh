#!/usr/bin/env bash
# Renders an HTML page (dptrain's report.html) to a PNG with headless Chromium, offline.
#   scripts/render-report.sh RUN_DIR/report.html [OUT.png] [WIDTHxHEIGHT]
# Default output: next to the page, <page>.png, 1280x1800. Needs Debian's `chromium` (large; not
# installed by scripts/install-deps.sh): apt-get install chromium
set -euo pipefail

page=${1:?usage: $0 PAGE.html [OUT.png] [WIDTHxHEIGHT]}
out=${2:-${page%.html}.png}
size=${3:-1280x1800}

browser=""
for b in chromium chromium-browser google-chrome; do
  if command -v "$b" >/dev/null 2>&1; then browser=$b; break; fi
done
if [[ -z $browser ]]; then
  echo "render-report: no Chromium found; install it with: apt-get install chromium" >&2
  exit 1
fi
[[ -f $page ]] || { echo "render-report: '$page' is not a file" >&2; exit 1; }
[[ $size =~ ^([0-9]+)x([0-9]+)$ ]] || { echo "render-report: size must be WxH, got '$size'" >&2; exit 2; }

abs=$(cd "$(dirname "$page")" && pwd)/$(basename "$page")
profile=$(mktemp -d)
trap 'rm -rf "$profile"' EXIT
# --no-sandbox: Chromium refuses to run as root otherwise. No network is needed (the page is
# self-contained); the proxy setting makes sure none is used.
"$browser" --headless=new --no-sandbox --disable-gpu --hide-scrollbars --no-first-run \
  --user-data-dir="$profile" --proxy-server="127.0.0.1:9" \
  --window-size="${BASH_REMATCH[1]},${BASH_REMATCH[2]}" --screenshot="$out" "file://$abs" \
  >/dev/null 2>&1
[[ -s $out ]] || { echo "render-report: Chromium wrote no screenshot" >&2; exit 1; }
echo "render-report: $out"
