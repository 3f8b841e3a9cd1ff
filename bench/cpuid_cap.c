// LD_PRELOAD shim that hides CPU features above an ISA from CPUID, so that a peer without an ISA
// cap of its own (ONNX Runtime's MLAS) dispatches as on an older CPU of the same machine.
//
//   CPUID_CAP=avx2 LD_PRELOAD=libcpuid_cap.so python3 peer.py
//
// CPUID_CAP: avx2 (hides AVX-512, AVX512-BF16/FP16 and AMX) or avx512_core (hides AVX512-VNNI,
// -BF16, -FP16 and AMX); unset or anything else changes nothing. It uses Linux's CPUID faulting
// (arch_prctl ARCH_SET_CPUID, as rr does): every CPUID of the process then raises SIGSEGV, and
// the handler runs the real instruction with faulting briefly off and clears the hidden bits.
// The setting is per thread and inherited by threads made after it, so the shim turns it on in
// its constructor, before the program starts any. Where the CPU or the hypervisor cannot fault
// on CPUID, the shim says so once on stderr and changes nothing. cpuid_cap_answered() (for ctypes)
// says how many CPUID instructions it has answered so far.
#define _GNU_SOURCE
#include <asm/prctl.h>
#include <cpuid.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

enum { kNone, kAvx2, kAvx512Core };
static int cap = kNone;
static volatile long answered = 0;

long cpuid_cap_answered(void) {
  return answered;
}

// Leaf 7 bits (Intel SDM vol. 2A, CPUID). Subleaf 0 EBX: AVX512 F DQ IFMA PF ER CD BW VL;
// ECX: VBMI VBMI2 VNNI BITALG VPOPCNTDQ; EDX: 4VNNIW 4FMAPS VP2INTERSECT FP16, and AMX-BF16
// AMX-TILE AMX-INT8. Subleaf 1 EAX: AVX512_BF16.
#define BIT(n) (1u << (n))
static const uint32_t kAvx512Ebx =
    BIT(16) | BIT(17) | BIT(21) | BIT(26) | BIT(27) | BIT(28) | BIT(30) | BIT(31);
static const uint32_t kAvx512Ecx = BIT(1) | BIT(6) | BIT(11) | BIT(12) | BIT(14);
static const uint32_t kAvx512Edx = BIT(2) | BIT(3) | BIT(8) | BIT(23);
static const uint32_t kAmxEdx = BIT(22) | BIT(24) | BIT(25);
static const uint32_t kBf16Eax1 = BIT(5);
static const uint32_t kVnniEcx = BIT(11);
static const uint32_t kFp16Edx = BIT(23);

static void hide(uint32_t leaf, uint32_t sub, uint32_t* a, uint32_t* b, uint32_t* c, uint32_t* d) {
  if (leaf != 7) return;
  if (sub == 0) {
    *d &= ~kAmxEdx;
    if (cap == kAvx2) {
      *b &= ~kAvx512Ebx;
      *c &= ~kAvx512Ecx;
      *d &= ~kAvx512Edx;
    } else {
      *c &= ~kVnniEcx;
      *d &= ~kFp16Edx;
    }
  } else if (sub == 1) {
    *a &= ~kBf16Eax1;
  }
}

static void on_fault(int sig, siginfo_t* info, void* ctx) {
  ucontext_t* uc = (ucontext_t*)ctx;
  greg_t* r = uc->uc_mcontext.gregs;
  const unsigned char* ip = (const unsigned char*)r[REG_RIP];
  if (ip[0] != 0x0f || ip[1] != 0xa2) {  // not CPUID: a real fault, die as without the shim
    signal(sig, SIG_DFL);
    (void)info;
    return;  // the instruction faults again, now with the default action
  }
  const uint32_t leaf = (uint32_t)r[REG_RAX], sub = (uint32_t)r[REG_RCX];
  uint32_t a, b, c, d;
  syscall(SYS_arch_prctl, ARCH_SET_CPUID, 1L);
  __cpuid_count(leaf, sub, a, b, c, d);
  syscall(SYS_arch_prctl, ARCH_SET_CPUID, 0L);
  hide(leaf, sub, &a, &b, &c, &d);
  r[REG_RAX] = a;
  r[REG_RBX] = b;
  r[REG_RCX] = c;
  r[REG_RDX] = d;
  r[REG_RIP] += 2;
  __sync_fetch_and_add(&answered, 1);
}

__attribute__((constructor)) static void start(void) {
  const char* want = getenv("CPUID_CAP");
  if (!want) return;
  if (!strcmp(want, "avx2"))
    cap = kAvx2;
  else if (!strcmp(want, "avx512_core"))
    cap = kAvx512Core;
  else
    return;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_fault;
  sa.sa_flags = SA_SIGINFO | SA_NODEFER;
  sigaction(SIGSEGV, &sa, NULL);
  if (syscall(SYS_arch_prctl, ARCH_SET_CPUID, 0L) != 0) {
    fprintf(stderr, "cpuid_cap: this CPU cannot fault on CPUID; CPUID_CAP=%s has no effect\n",
            want);
    signal(SIGSEGV, SIG_DFL);
  }
}
