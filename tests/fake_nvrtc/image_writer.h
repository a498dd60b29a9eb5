#ifndef GPUEXEC_TESTS_FAKE_NVRTC_IMAGE_WRITER_H_
#define GPUEXEC_TESTS_FAKE_NVRTC_IMAGE_WRITER_H_

// The module images the NVRTC double "compiles": PTX text and a cubin ELF
// that carry exactly what tests/fake_cuda/image_reader.h reads, in the
// encoding it documents (nvcc 13's sm_90 output):
//
//   PTX    `.version 9.0`, `.target sm_XY`, `.address_size 64`, then per
//          kernel `.visible .entry <symbol>(.param <type> <symbol>_param_N,
//          ...)` with an empty body (`ret;`). A 2-byte class (__half) is
//          `.param .align 2 .b8 <name>[2]`, as NVVM writes structs.
//   cubin  64-bit little-endian ELF, ET_EXEC, EM_CUDA (190), ELFOSABI 0x41
//          and ABI version 8, e_flags 0x06000004 | XY << 8 (as NVRTC 13
//          writes them). Sections: .shstrtab, .strtab, .symtab, the global
//          .nv.info (EIATTR_REGCOUNT per kernel), then per kernel
//          .nv.info.<symbol> (EIATTR_CUDA_API_VERSION, EIATTR_KPARAM_INFO
//          per parameter from the last ordinal to the first, as nvcc orders
//          them, EIATTR_MAXREG_COUNT, EIATTR_CBANK_PARAM_SIZE,
//          EIATTR_PARAM_CBANK), .text.<symbol> (128 zero bytes) and
//          .nv.constant0.<symbol> (0x210 bytes of driver constants, then
//          the parameters). Symbols: a LOCAL section symbol for each .text
//          and .nv.constant0 section, then a GLOBAL STT_FUNC <symbol> per
//          kernel. No program headers.
//
// Parameters are laid out with natural alignment (each at the next
// multiple of its size), as the CUDA ABI lays out scalars and pointers.

#include <cstddef>
#include <string>
#include <vector>

namespace gxnvrtc {

struct ImageParam {
  size_t size = 0;                 // also the alignment: 1, 2, 4 or 8
  const char* ptx_type = nullptr;  // ".u32", ...; nullptr: `.align size .b8 [size]`
};

struct ImageKernelSpec {
  std::string symbol;
  std::vector<ImageParam> params;
};

// Offsets of `params` by natural alignment; `*total` the bytes they span.
std::vector<size_t> ParamOffsets(const std::vector<ImageParam>& params, size_t* total);

// `arch` is XY of sm_XY / compute_XY.
std::string WritePtx(int arch, const std::vector<ImageKernelSpec>& kernels);
// `registers`: what EIATTR_REGCOUNT says for every kernel (1..255).
std::string WriteCubin(int arch, const std::vector<ImageKernelSpec>& kernels, int registers);

}  // namespace gxnvrtc

#endif  // GPUEXEC_TESTS_FAKE_NVRTC_IMAGE_WRITER_H_
