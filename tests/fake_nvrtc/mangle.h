#ifndef GPUEXEC_TESTS_FAKE_NVRTC_MANGLE_H_
#define GPUEXEC_TESTS_FAKE_NVRTC_MANGLE_H_

// Kernel symbols as NVRTC lowers them: the Itanium C++ ABI's mangling of a
// free function at namespace scope, for the types source_scan.h reads.
//
// Modelled: builtin scalar types (v b c a h s t i j l m x y f d), __half
// and __nv_bfloat16 as classes (6__half, 13__nv_bfloat16), pointers (P),
// const (K; a parameter's top-level const is dropped, a template
// argument's kept), template parameters (T_, T0_, ...), type template
// arguments (I...E, then the return type v), and substitutions (S_, S0_,
// ... S9_, SA_ ...) in the ABI's order. Not modelled: namespaces, classes,
// non-type template arguments, volatile and __restrict__ (read, ignored).
// Checked against NVRTC 13.0 in fake_nvrtc_test.

#include <string>
#include <vector>

#include "tests/fake_nvrtc/source_scan.h"

namespace gxnvrtc {

// The symbol of `kernel` with template arguments `args` (one per template
// parameter; none for a kernel that is not a template). An extern "C"
// kernel's symbol is its name.
std::string MangleKernel(const KernelDecl& kernel, const std::vector<TypeRef>& args);

// A template argument as C++ writes it ("const float*"), for messages.
std::string TypeName(const TypeRef& type);

}  // namespace gxnvrtc

#endif  // GPUEXEC_TESTS_FAKE_NVRTC_MANGLE_H_
