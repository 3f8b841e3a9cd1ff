// Prints the CPUID feature bits that bench/cpuid_cap.c hides, read in a thread started by the
// program (the shim's CPUID faulting must reach threads made after its constructor).
#include <cpuid.h>
#include <pthread.h>
#include <stdio.h>

static void* probe(void* out) {
  unsigned a, b, c, d, a1 = 0, b1, c1, d1, a7, b7, c7, d7;
  __cpuid(1, a, b, c, d);
  __cpuid_count(7, 0, a7, b7, c7, d7);
  if (a7 >= 1) __cpuid_count(7, 1, a1, b1, c1, d1);
  snprintf((char*)out, 256,
           "fma=%u avx2=%u avx512f=%u avx512bw=%u avx512_vnni=%u avx512_bf16=%u amx_tile=%u",
           (c >> 12) & 1, (b7 >> 5) & 1, (b7 >> 16) & 1, (b7 >> 30) & 1, (c7 >> 11) & 1,
           (a1 >> 5) & 1, (d7 >> 24) & 1);
  return NULL;
}

int main(void) {
  char line[256];
  pthread_t t;
  if (pthread_create(&t, NULL, probe, line) != 0 || pthread_join(t, NULL) != 0) return 1;
  puts(line);
  return 0;
}
