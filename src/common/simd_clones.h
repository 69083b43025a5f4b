#pragma once

// DP_SIMD_CLONES on a hot loop's function compiles it three times
// (x86-64-v4: AVX-512, x86-64-v3: AVX2 + FMA, baseline: SSE2) and picks the
// widest the CPU has once at load time (an ifunc), so one binary runs
// vector code everywhere without -march. Libraries using it build with
// -ffp-contract=off (no fused multiply-add in some clones only), so every
// clone rounds alike and results do not depend on the machine's CPU.
// Sanitizer builds and other architectures get the plain function.

#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#define DP_SIMD_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define DP_SIMD_CLONES
#endif
