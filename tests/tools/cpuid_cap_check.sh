#!/bin/bash
# Checks bench/cpuid_cap.c, the shim that caps the inference benchmark's peers at an ISA: under
# CPUID_CAP=avx2 a program sees no AVX-512, VNNI, BF16 or AMX and keeps AVX2 and FMA; under
# avx512_core it keeps AVX-512 without them; an unknown cap changes nothing. Exit 77 (skipped)
# where the CPU has no AVX-512 to hide or cannot fault on CPUID.
set -u
probe=$1 shim=$2
native=$("$probe") || { echo "cpuid_probe failed"; exit 1; }
echo "native:      $native"
case "$native" in
  *avx512f=1*) ;;
  *) echo "skipped: this CPU has no AVX-512 to hide"; exit 77 ;;
esac
err=$(CPUID_CAP=avx2 LD_PRELOAD=$shim "$probe" 2>&1 >/dev/null)
if [[ $err == *"cannot fault"* ]]; then echo "skipped: $err"; exit 77; fi
fail=0
expect() {  # expect CAP WANTED: the probe's line under CPUID_CAP=CAP is WANTED
  local got
  got=$(CPUID_CAP=$1 LD_PRELOAD=$shim "$probe") || { echo "probe under $1 failed"; fail=1; return; }
  echo "$1: $got"
  [[ $got == "$2" ]] || { echo "  expected: $2"; fail=1; }
}
expect avx2 "fma=1 avx2=1 avx512f=0 avx512bw=0 avx512_vnni=0 avx512_bf16=0 amx_tile=0"
expect avx512_core "fma=1 avx2=1 avx512f=1 avx512bw=1 avx512_vnni=0 avx512_bf16=0 amx_tile=0"
expect native "$native"
exit $fail
