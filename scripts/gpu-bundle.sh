#!/usr/bin/env bash
# Packs a CUDA build with every shared library it needs into one folder, for GPU nodes lacking them.
#
#   bash scripts/gpu-bundle.sh [BUILD_DIR [BUNDLE_DIR]]   (defaults build/gpu and gpu-bundle)
#
# For GPU machines that cannot install the build's dependencies (no apt, no network), e.g. a lent
# test node: build here (cmake --preset cuda-release -B build/gpu -DCMAKE_CUDA_ARCHITECTURES=90,
# then the targets gpu-check.sh runs), bundle, copy the folder over, and there:
#
#   source gpu-bundle/env.sh &&
#     DP_BUILD_DIR=gpu-bundle/build DP_PREBUILT=1 bash scripts/gpu-check.sh
#
# BUNDLE_DIR/build/{app,tests,bench}/  the binaries gpu-check.sh runs, where it expects them
# BUNDLE_DIR/lib/                      their libraries and Open MPI's, except glibc's, the GPU
#                                      driver's, cuDNN's and NCCL's (those come from the target)
# BUNDLE_DIR/lib/fallback/             libstdc++ and libgcc_s, used only if the target's are older
# BUNDLE_DIR/openmpi/                  mpirun, Open MPI's and PMIx's components and help files
# BUNDLE_DIR/env.sh                    sets PATH, LD_LIBRARY_PATH and Open MPI's relocation
#                                      variables, and finds cuDNN 9 and NCCL 2 on the target
#                                      (DP_CUDA_LIBS, else pip's nvidia-* packages or a search)
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD=${1:-build/gpu}
OUT=${2:-gpu-bundle}
binaries=(app/dptrain app/dppredict tests/test_cuda tests/test_cuda_backend
  tests/test_nccl_reducer_mpi bench/bench_gpu_throughput)
OMPI_LIB=/usr/lib/x86_64-linux-gnu/openmpi/lib
PMIX=/usr/lib/x86_64-linux-gnu/pmix2

for b in "${binaries[@]}"; do
  [[ -x "$BUILD/$b" ]] || {
    echo "gpu-bundle: $BUILD/$b is not built (cmake --build $BUILD --target $(basename "$b"))" >&2
    exit 1
  }
done
[[ -d "$OMPI_LIB/openmpi3" && -d "$PMIX/lib/pmix" ]] || {
  echo "gpu-bundle: Open MPI 4 or PMIx is not where Debian 12 puts them ($OMPI_LIB, $PMIX)" >&2
  exit 1
}

rm -rf "$OUT"
mkdir -p "$OUT/lib/fallback" "$OUT/openmpi/bin" "$OUT/openmpi/share" "$OUT/openmpi/etc"
for b in "${binaries[@]}"; do
  mkdir -p "$OUT/build/$(dirname "$b")"
  cp "$BUILD/$b" "$OUT/build/$b"
done

# Open MPI: mpirun/orted, its components (libdir/openmpi3), help files; PMIx: library, components.
cp /usr/bin/orterun /usr/bin/orted "$OUT/openmpi/bin/"
ln -s orterun "$OUT/openmpi/bin/mpirun"
cp -r "$OMPI_LIB/openmpi3" "$OUT/openmpi/"
cp -r /usr/share/openmpi "$OUT/openmpi/share/"
cp /etc/openmpi/openmpi-mca-params.conf "$OUT/openmpi/etc/"
cp -r "$PMIX/lib/pmix" "$OUT/openmpi/pmix"
cp -r "$PMIX/share/pmix" "$OUT/openmpi/share/pmix"

# Every shared library these need, but those the target must provide itself.
glibc='linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libresolv|libutil'
skip="^($glibc|libcuda|libcudnn[a-z_]*|libnccl|libnvidia[a-z-]*)\\.so"
mapfile -t objects < <(printf '%s\n' "${binaries[@]/#/$BUILD/}" /usr/bin/orterun /usr/bin/orted \
  "$OMPI_LIB"/openmpi3/*.so "$PMIX"/lib/pmix/*.so)
ldd "${objects[@]}" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u |
  while read -r soname path; do
    [[ "$soname" =~ $skip ]] && continue
    case "$soname" in
      libstdc++.so.* | libgcc_s.so.*) cp -L "$path" "$OUT/lib/fallback/$soname" ;;
      *) cp -L "$path" "$OUT/lib/$soname" ;;
    esac
  done
missing=$(ldd "${objects[@]}" 2>/dev/null | grep 'not found' | sort -u || true)
[[ -z "$missing" ]] || {
  echo "gpu-bundle: unresolved libraries here: $missing" >&2
  exit 1
}

cat >"$OUT/env.sh" <<'EOF'
# Source on the GPU machine: run this bundle's binaries, Open MPI and PMIx from where it lies.
_dp_b=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export DP_BUNDLE_ORIG_LD_LIBRARY_PATH=${LD_LIBRARY_PATH-}
# cuDNN 9 and NCCL 2 come from the target: DP_CUDA_LIBS (colon-separated folders), else every
# nvidia/*/lib folder of pip's nvidia-* packages (PyTorch's: cuDNN, NCCL, and the NVRTC and cuBLASLt
# that some cuDNN engines open), else the first folder under /usr or /opt holding the library.
_dp_cuda=${DP_CUDA_LIBS-}
if [[ -z "$_dp_cuda" ]]; then
  _dp_cuda=$(python3 -c 'import glob, os, site
dirs = site.getsitepackages() + [site.getusersitepackages()]
found = {d for b in dirs for d in glob.glob(os.path.join(b, "nvidia", "*", "lib"))}
print(":".join(sorted(found)))' \
    2>/dev/null)
  for _dp_lib in libcudnn.so.9 libnccl.so.2; do
    _dp_dir=""
    for _dp_d in ${_dp_cuda//:/ }; do [[ -e "$_dp_d/$_dp_lib" ]] && _dp_dir=$_dp_d; done
    [[ -n "$_dp_dir" ]] && continue
    _dp_dir=$(find /usr /opt -name "$_dp_lib" -print -quit 2>/dev/null | xargs -r dirname)
    if [[ -n "$_dp_dir" ]]; then
      _dp_cuda+=${_dp_cuda:+:}$_dp_dir
    else
      echo "gpu-bundle: $_dp_lib not found on this machine (set DP_CUDA_LIBS)" >&2
    fi
  done
fi
_dp_ld=$_dp_b/lib:$_dp_cuda
# The build machine's libstdc++/libgcc_s only where this machine's lacks the build's newest
# symbols.
_dp_cxx=$(ldconfig -p 2>/dev/null | awk '/libstdc\+\+\.so\.6 .*x86-64/ {print $NF; exit}')
if [[ -z "$_dp_cxx" ]] || ! grep -qa GLIBCXX_3.4.30 "$_dp_cxx"; then
  _dp_ld+=:$_dp_b/lib/fallback
fi
export LD_LIBRARY_PATH=$_dp_ld${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PATH=$_dp_b/openmpi/bin:$PATH
# Open MPI and PMIx were built for /usr: point every installation folder at the bundle.
export OPAL_PREFIX=$_dp_b/openmpi OPAL_BINDIR=$_dp_b/openmpi/bin OPAL_LIBDIR=$_dp_b/lib
export OPAL_PKGLIBDIR=$_dp_b/openmpi/openmpi3 OPAL_DATADIR=$_dp_b/openmpi/share
export OPAL_PKGDATADIR=$_dp_b/openmpi/share/openmpi OPAL_SYSCONFDIR=$_dp_b/openmpi/etc
export OMPI_MCA_mca_base_component_path=$_dp_b/openmpi/openmpi3
export OMPI_MCA_mca_base_param_files=$_dp_b/openmpi/etc/openmpi-mca-params.conf
export OMPI_MCA_mca_base_component_show_load_errors=0
# One node: start ranks (and a singleton's helper daemon) locally, no ssh/rsh needed.
export OMPI_MCA_plm=isolated
export PMIX_INSTALL_PREFIX=$_dp_b/openmpi PMIX_MCA_mca_base_component_path=$_dp_b/openmpi/pmix
export PMIX_MCA_mca_base_component_show_load_errors=0
# Python (PyTorch beside dptrain) runs with the machine's own libraries, not the bundle's.
export PYTHON=$_dp_b/python
unset _dp_b _dp_cuda _dp_lib _dp_dir _dp_d _dp_ld _dp_cxx
EOF
cat >"$OUT/python" <<'EOF'
#!/bin/sh
# python3 with the library path it had before gpu-bundle/env.sh was sourced.
if [ -n "$DP_BUNDLE_ORIG_LD_LIBRARY_PATH" ]; then
  export LD_LIBRARY_PATH="$DP_BUNDLE_ORIG_LD_LIBRARY_PATH"
else
  unset LD_LIBRARY_PATH
fi
exec python3 "$@"
EOF
chmod +x "$OUT/python"
echo "gpu-bundle: $OUT ($(du -sh "$OUT" | cut -f1)): $(ls "$OUT/lib" | wc -l) libraries," \
  "binaries: ${binaries[*]}"
