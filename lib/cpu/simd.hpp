// Function attributes for the CPU backend's hot loops in a library built for any x86-64.
#pragma once

// Compiled for AVX2 + FMA (x86-64-v3) as well as for the baseline, picked at load time (GCC's
// target_clones; a `#pragma omp parallel` inside is cloned with its function). At the baseline's
// 4 floats a vector the Winograd transforms took 15% of a 2-thread AVX2 full-width step in perf.
// AVX2 and not AVX-512, so that a run capped at AVX2 (ONEDNN_MAX_CPU_ISA) runs these as an AVX2
// machine does; the memory-bound passes gain little from wider vectors.
// The clones may fuse a * b + c into an FMA (one rounding, not two); a file whose results must
// stay bit for bit the baseline's is built with -ffp-contract=off (lib/CMakeLists.txt).
#define DP_AVX2_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))

// Code for the CPUs bf16 runs on (AVX512-BF16).
#define DP_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))
