#!/usr/bin/env bash
# Installs oneDNN 3.2 (Intel's PyPI wheels, GNU OpenMP runtime, libdnnl.so.3 and its headers and
# CMake config) under build/onednn-3.2 for the `onednn3` preset. Idempotent; needs python3-venv.
set -euo pipefail
cd "$(dirname "$0")/.."
version=2023.2.0  # the wheels' version: oneDNN 3.2.0, the last built with GNU OpenMP
prefix=${DP_ONEDNN_PREFIX:-build/onednn-3.2}
if [[ -f $prefix/lib/cmake/dnnl/dnnl-config.cmake && -e $prefix/lib/libdnnl.so.3 ]]; then
  echo "install-onednn: $prefix has oneDNN $(sed -n 's/^set(PACKAGE_VERSION "\([0-9.]*\)")$/\1/p' "$prefix/lib/cmake/dnnl/dnnl-config-version.cmake")"
  exit 0
fi
source scripts/python-venv.sh
need_python_venv install-onednn
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
/usr/bin/python3 -m venv "$work/venv"
# Pinned by hash: pip refuses any other file (PyPI's files for 2023.2.0, manylinux1 x86_64).
cat > "$work/requirements.txt" <<REQ
onednn-cpu-gomp==$version --hash=sha256:2f22a54d6a890ed14bfa185d42a4be65d8b5b1df85dc1f0f3a9abe31620416fb
onednn-devel-cpu-gomp==$version --hash=sha256:9763c69e8c907e119056bd52ad918ca84ac9ba939d130a99dfa95ccca3e5e284
REQ
"$work/venv/bin/python3" -m pip download -q --disable-pip-version-check --no-deps \
  --require-hashes -r "$work/requirements.txt" -d "$work"
# A wheel's <name>.data/data/ tree is what pip would install under sys.prefix: lib/, include/.
mkdir -p "$work/tree"
for wheel in "$work"/*.whl; do
  "$work/venv/bin/python3" -m zipfile -e "$wheel" "$work/unpacked"
done
cp -a "$work"/unpacked/*.data/data/. "$work/tree/"
# zip keeps no symbolic links: the wheels carry three copies of the library.
for link in libdnnl.so libdnnl.so.3; do ln -sf libdnnl.so.3.2 "$work/tree/lib/$link"; done
rm -rf "$prefix"
mkdir -p "$(dirname "$prefix")"
mv "$work/tree" "$prefix"
echo "install-onednn: oneDNN 3.2 ($version wheels) in $prefix"
