#!/usr/bin/env bash
# Installs the Debian 12 packages dptrain needs to build, run and test (idempotent; root).
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  ccache  # one compile of the sources the presets share (scripts/test.sh builds three)
  openmpi-bin libopenmpi-dev
  mpich libmpich-dev  # the second MPI (preset mpich): the ABI of Cray MPICH, Intel MPI, MVAPICH
  libhdf5-dev hdf5-tools zlib1g-dev
  libturbojpeg0-dev libpng-dev
  libtiff-dev libgdk-pixbuf-2.0-dev  # TIFF and BMP masks and images (dpprep build)
  libboost-program-options-dev
  libprotobuf-dev protobuf-compiler
  libdnnl-dev ocl-icd-opencl-dev
  libgtest-dev
  iproute2 util-linux  # ip, unshare, nsenter: the simulated cluster of tests/cluster
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi
if [[ $(id -u) -ne 0 ]]; then
  echo "install-deps: error: missing packages (${missing[*]}) and not root; see INSTALL.md for clusters without root" >&2
  exit 1
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"
