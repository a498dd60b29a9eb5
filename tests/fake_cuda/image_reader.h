#ifndef GPUEXEC_TESTS_FAKE_CUDA_IMAGE_READER_H_
#define GPUEXEC_TESTS_FAKE_CUDA_IMAGE_READER_H_

// What the libcuda double reads from a real module image: the kernels it
// holds and each kernel's parameter layout, as cuModuleGetFunction and
// cuFuncGetParamInfo report them on a GPU.
//
//   cubin   A 64-bit little-endian ELF. Kernels are the `.text.<name>`
//           sections and the global STT_FUNC symbols; a kernel's parameters
//           come from its `.nv.info.<name>` section, a list of records
//           (u8 format, u8 attribute, then a u16: the value for formats 1-3,
//           the byte count of the value that follows for format 4, SVAL).
//           EIATTR_KPARAM_INFO (0x17) holds u32 index, u16 ordinal, u16
//           offset, u32 flags whose bits 18..31 are the size in bytes;
//           EIATTR_PARAM_CBANK (0x0a) and EIATTR_CBANK_PARAM_SIZE (0x19) the
//           total size. Checked against nvcc 13's sm_90 output: records of
//           formats 1-3 are 4 bytes (a u8 value is padded). A kernel's
//           registers per thread come from the global `.nv.info` section's
//           EIATTR_REGCOUNT (0x2f) records: u32 symbol index, u32 count.
//   PTX     Text: each `.entry <name>(...)` with its `.param` list; sizes
//           and alignments from the types (`.align N .b8 name[M]` for
//           structs), offsets laid out as the ABI does.
//   fatbin  The first uncompressed cubin entry, else the first uncompressed
//           PTX entry, of the first fatbin.
//
// The daemon bounds an image before the driver sees it, but this reader
// trusts nothing: every offset and size is checked against `size`, and a
// malformed image gives an error that says what is wrong and where, never
// a read outside [data, data + size). Pure functions, no driver state.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace gxfake {

struct ParamSlot {
  size_t offset = 0;
  size_t size = 0;
  bool operator==(const ParamSlot& o) const { return offset == o.offset && size == o.size; }
};

struct ImageKernel {
  std::string name;
  std::vector<ParamSlot> params;  // by ordinal
  int registers = -1;             // per thread; -1 where the image does not say
};

enum class ImageFormat { kUnknown, kCubin, kPtx, kFatbin };

// What the magic at `image` says; reads at most 4 bytes, or up to the first
// byte that is not whitespace for text.
ImageFormat SniffImage(const void* image);

// The bytes `image` spans by its own headers: for a cubin the end of its
// furthest table or section, for a fatbin its header and fat size, for PTX
// its text and NUL. 0 when the headers overflow or the ELF identification
// is not a 64-bit little-endian one (checked byte by byte before anything
// past it is read). This is how far
// cuModuleLoadDataEx, which gets no length, may read.
size_t DeclaredImageSize(const void* image);

// Reads the kernels of the image [data, data + size). Returns false with
// `error` set when the image is malformed.
bool ReadImage(const uint8_t* data, size_t size, std::vector<ImageKernel>* kernels,
               std::string* error);

}  // namespace gxfake

#endif  // GPUEXEC_TESTS_FAKE_CUDA_IMAGE_READER_H_
