#ifndef GPUEXEC_SERVER_COMMON_CPU_RELAX_H_
#define GPUEXEC_SERVER_COMMON_CPU_RELAX_H_

namespace gpuexec {

// A spinning thread's hint to its core (x86 `pause`, Arm `yield`): a few
// to some 150 cycles with the core, so a spinning thread looks at what it
// waits for after each, not after many.
inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace gpuexec

#endif  // GPUEXEC_SERVER_COMMON_CPU_RELAX_H_
