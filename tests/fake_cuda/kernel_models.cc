// The kernels the double runs: host functions ("models") that mirror
// tests/kernels/gx_kernels.cu, plus the examples' kernels (`saxpy` of
// client/cpp/examples/saxpy.cu, the Triton tutorial's `add_kernel`), found by
// name, or by name and parameter layout for a real image. Also
// cuTensorMapEncodeTiled, whose maps the model of gx_tensormap_copy reads.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "tests/fake_cuda/fake_cuda_internal.h"

namespace gxfake::internal {
namespace {

// The kernels `gpuexecd --simulator` runs, as its refusal lists them.
constexpr char kExampleKernels[] = "saxpy, add_kernel";

// The device memory behind [addr, addr + count * sizeof(T)), or null when
// the range is not inside one allocation of the launch's device.
template <typename T>
T* DeviceSpan(const KernelLaunch& launch, uint64_t addr, uint64_t count) {
  if (count > SIZE_MAX / sizeof(T)) return nullptr;
  if (!RangeIsLive(addr, count * sizeof(T), launch.device,
                   /*allow_free_pending=*/true)) {
    return nullptr;
  }
  return reinterpret_cast<T*>(static_cast<uintptr_t>(addr));
}

bool RunEmpty(const KernelLaunch&) { return true; }

bool RunFillU32(const KernelLaunch& l) {
  const uint64_t n = l.Arg<uint64_t>(16);
  if (n == 0) return true;
  uint32_t* out = DeviceSpan<uint32_t>(l, l.Arg<uint64_t>(0), n);
  if (out == nullptr) return false;
  std::fill_n(out, n, l.Arg<uint32_t>(8));
  return true;
}

bool RunSaxpy(const KernelLaunch& l) {
  const float a = l.Arg<float>(0);
  const uint64_t n = l.Arg<uint64_t>(24);
  if (n == 0) return true;
  const float* x = DeviceSpan<const float>(l, l.Arg<uint64_t>(8), n);
  float* y = DeviceSpan<float>(l, l.Arg<uint64_t>(16), n);
  if (x == nullptr || y == nullptr) return false;
  // nvcc contracts a * x + y into one FFMA; so does the double.
  for (uint64_t i = 0; i < n; ++i) y[i] = std::fma(a, x[i], y[i]);
  return true;
}

bool RunSpin(const KernelLaunch& l) {
  std::this_thread::sleep_for(std::chrono::nanoseconds(l.Arg<uint64_t>(0)));
  return true;
}

// Like the CUDA kernel, a store through an address that is in fact mapped
// succeeds; anything else faults.
bool RunFault(const KernelLaunch& l) {
  uint32_t* p = DeviceSpan<uint32_t>(l, l.Arg<uint64_t>(0), 1);
  if (p == nullptr) return false;
  *reinterpret_cast<volatile uint32_t*>(p) = 1;
  return true;
}

bool RunBigShared(const KernelLaunch& l) {
  const uint32_t n = l.Arg<uint32_t>(8);
  // The kernel touches smem[0, n): less dynamic shared memory is a fault.
  if (static_cast<uint64_t>(n) * 4 > l.shared_bytes) return false;
  const unsigned blocks = l.grid[0];  // Blocks along y/z repeat out[x].
  uint32_t* out = DeviceSpan<uint32_t>(l, l.Arg<uint64_t>(0), blocks);
  if (out == nullptr) return false;
  for (uint32_t b = 0; b < blocks; ++b) {
    uint32_t sum = 0;
    for (uint32_t k = 0; k < n; ++k) sum += k ^ b;
    out[b] = sum;
  }
  return true;
}

bool RunStruct(const KernelLaunch& l) {
  uint32_t* out = DeviceSpan<uint32_t>(l, l.Arg<uint64_t>(16), 4);
  if (out == nullptr) return false;
  std::memcpy(out, l.args.data(), 16);  // {a, b, bits(c), d}
  return true;
}

bool RunTypes(const KernelLaunch& l);  // Needs the slot table; see below.

bool RunClusterRank(const KernelLaunch& l) {
  const uint64_t gx = l.grid[0], gy = l.grid[1], gz = l.grid[2];
  uint32_t* out = DeviceSpan<uint32_t>(l, l.Arg<uint64_t>(0), gx * gy * gz);
  if (out == nullptr) return false;
  const unsigned cx = l.cluster[0], cy = l.cluster[1], cz = l.cluster[2];
  for (uint64_t z = 0; z < gz; ++z) {
    for (uint64_t y = 0; y < gy; ++y) {
      for (uint64_t x = 0; x < gx; ++x) {
        out[x + gx * (y + gy * z)] =
            static_cast<uint32_t>((x % cx) + cx * ((y % cy) + cy * (z % cz)));
      }
    }
  }
  return true;
}

// The double's encoding of a tensor map (cuTensorMapEncodeTiled): what
// gx_tensormap_copy needs, in the 128 bytes of a CUtensorMap.
struct FakeTensorMap {
  uint64_t magic;
  uint64_t address;
  uint32_t data_type;
  uint32_t rank;
  uint64_t dims[5];
  uint64_t strides[4];
  uint32_t box[5];
  uint32_t oob_fill;
};
static_assert(sizeof(FakeTensorMap) <= sizeof(CUtensorMap));
constexpr uint64_t kFakeTensorMapMagic = 0x47584d4150763100;  // "GXMAPv1"

// gx_tensormap_copy(map, out, x, y, count): the FLOAT32 box of a rank 1 or
// 2 map at (x, y), innermost fastest; outside the tensor 0 (NaN with NaN
// fill). `count` must be the box's elements (the GPU's kernel needs it);
// x a multiple of 4.
bool RunTensorMapCopy(const KernelLaunch& l) {
  FakeTensorMap m;
  std::memcpy(&m, l.args.data(), sizeof(m));
  if (m.magic != kFakeTensorMapMagic || m.data_type != CU_TENSOR_MAP_DATA_TYPE_FLOAT32 ||
      m.rank < 1 || m.rank > 2) {
    return false;  // as a TMA fault
  }
  const int32_t x = l.Arg<int32_t>(136);
  const int32_t y = l.Arg<int32_t>(140);
  // A box's inner start off a 16-byte boundary: an illegal instruction on
  // the H200.
  if ((int64_t{x} * 4) % 16 != 0) return false;
  const uint64_t bx = m.box[0];
  const uint64_t by = m.rank == 2 ? m.box[1] : 1;
  if (l.Arg<uint32_t>(144) != bx * by) return false;
  float* out = DeviceSpan<float>(l, l.Arg<uint64_t>(128), bx * by);
  if (out == nullptr) return false;
  const float fill = m.oob_fill != 0 ? std::numeric_limits<float>::quiet_NaN() : 0.0f;
  for (uint64_t j = 0; j < by; ++j) {
    for (uint64_t i = 0; i < bx; ++i) {
      const int64_t gx = int64_t{x} + static_cast<int64_t>(i);
      const int64_t gy = m.rank == 2 ? int64_t{y} + static_cast<int64_t>(j) : 0;
      const bool inside = gx >= 0 && static_cast<uint64_t>(gx) < m.dims[0] && gy >= 0 &&
                          (m.rank == 1 || static_cast<uint64_t>(gy) < m.dims[1]);
      float v = fill;
      if (inside) {
        const uint64_t addr = m.address + static_cast<uint64_t>(gx) * 4 +
                              (m.rank == 2 ? static_cast<uint64_t>(gy) * m.strides[0] : 0);
        const float* src = DeviceSpan<const float>(l, addr, 1);
        if (src == nullptr) return false;
        v = *src;
      }
      out[j * bx + i] = v;
    }
  }
  return true;
}

// gx_coop_count(counter, out): every block adds one to *counter and meets
// the others at a grid-wide barrier; out[0] = the blocks that met.
bool RunCoopCount(const KernelLaunch& l) {
  uint32_t* counter = DeviceSpan<uint32_t>(l, l.Arg<uint64_t>(0), 1);
  uint32_t* out = DeviceSpan<uint32_t>(l, l.Arg<uint64_t>(8), 1);
  if (counter == nullptr || out == nullptr) return false;
  const uint64_t blocks = uint64_t{l.grid[0]} * l.grid[1] * l.grid[2];
  *counter += static_cast<uint32_t>(blocks);
  *out = static_cast<uint32_t>(blocks);
  return true;
}

// gx_pdl_produce(data, n): data[i] = i + 1. gx_pdl_consume(data, out, n):
// out[i] = 2 * data[i] (stream order gives the double what the GPU's
// dependency wait does).
bool RunPdlProduce(const KernelLaunch& l) {
  const uint32_t n = l.Arg<uint32_t>(8);
  uint32_t* data = DeviceSpan<uint32_t>(l, l.Arg<uint64_t>(0), n);
  if (n > 0 && data == nullptr) return false;
  for (uint32_t i = 0; i < n; ++i) data[i] = i + 1;
  return true;
}
bool RunPdlConsume(const KernelLaunch& l) {
  const uint32_t n = l.Arg<uint32_t>(16);
  const uint32_t* data = DeviceSpan<const uint32_t>(l, l.Arg<uint64_t>(0), n);
  uint32_t* out = DeviceSpan<uint32_t>(l, l.Arg<uint64_t>(8), n);
  if (n > 0 && (data == nullptr || out == nullptr)) return false;
  for (uint32_t i = 0; i < n; ++i) out[i] = 2 * data[i];
  return true;
}

// Word b (linear block id) of each non-null scratch buffer = b + 1.
bool RunAddScratch(const KernelLaunch& l) {
  const int32_t n = l.Arg<int32_t>(24);
  if (n > 0) {
    const float* x = DeviceSpan<const float>(l, l.Arg<uint64_t>(0), n);
    const float* y = DeviceSpan<const float>(l, l.Arg<uint64_t>(8), n);
    float* out = DeviceSpan<float>(l, l.Arg<uint64_t>(16), n);
    if (x == nullptr || y == nullptr || out == nullptr) return false;
    for (int32_t i = 0; i < n; ++i) out[i] = x[i] + y[i];
  }
  const uint64_t blocks = uint64_t{l.grid[0]} * l.grid[1] * l.grid[2];
  for (size_t offset : {size_t{32}, size_t{40}}) {
    const uint64_t addr = l.Arg<uint64_t>(offset);
    if (addr == 0) continue;
    uint32_t* words = DeviceSpan<uint32_t>(l, addr, blocks);
    if (words == nullptr) return false;
    for (uint64_t b = 0; b < blocks; ++b) words[b] = static_cast<uint32_t>(b + 1);
  }
  return true;
}

// The Triton tutorial's add_kernel(x, y, out, n), with or without the
// scratch pointers Triton 3.x appends (unused: it needs none).
bool RunTritonAdd(const KernelLaunch& l) {
  const int32_t n = l.Arg<int32_t>(24);
  if (n <= 0) return true;
  const float* x = DeviceSpan<const float>(l, l.Arg<uint64_t>(0), n);
  const float* y = DeviceSpan<const float>(l, l.Arg<uint64_t>(8), n);
  float* out = DeviceSpan<float>(l, l.Arg<uint64_t>(16), n);
  if (x == nullptr || y == nullptr || out == nullptr) return false;
  for (int32_t i = 0; i < n; ++i) out[i] = x[i] + y[i];
  return true;
}

// gx_sm_ids(out, ns): block b writes the SM it ran on; the blocks go round
// the stream's SMs in order. The blocks spin side by side: one `ns` in all.
bool RunSmIds(const KernelLaunch& l) {
  const uint64_t blocks = uint64_t{l.grid[0]} * l.grid[1] * l.grid[2];
  uint32_t* out = DeviceSpan<uint32_t>(l, l.Arg<uint64_t>(0), blocks);
  if (out == nullptr) return false;
  std::this_thread::sleep_for(std::chrono::nanoseconds(l.Arg<uint64_t>(8)));
  for (uint64_t b = 0; b < blocks; ++b) out[b] = l.first_sm + b % l.sm_count;
  return true;
}

const std::vector<KernelDef>& Kernels() {
  static const std::vector<KernelDef>* const kernels = new std::vector<KernelDef>{
      {"gx_empty", {}, RunEmpty},
      {"gx_fill_u32", {{0, 8}, {8, 4}, {16, 8}}, RunFillU32},
      {"gx_saxpy", {{0, 4}, {8, 8}, {16, 8}, {24, 8}}, RunSaxpy},
      {"gx_spin", {{0, 8}}, RunSpin},
      {"gx_fault", {{0, 8}}, RunFault},
      {"gx_bigshared", {{0, 8}, {8, 4}}, RunBigShared},
      {"gx_struct", {{0, 16}, {16, 8}}, RunStruct},
      {"gx_types",
       {{0, 1}, {2, 2}, {4, 4}, {8, 8}, {16, 2}, {18, 2}, {20, 4}, {24, 8}, {32, 8}},
       RunTypes},
      {"gx_cluster_rank", {{0, 8}}, RunClusterRank},
      {"gx_add_scratch", {{0, 8}, {8, 8}, {16, 8}, {24, 4}, {32, 8}, {40, 8}}, RunAddScratch},
      {"gx_tensormap_copy", {{0, 128}, {128, 8}, {136, 4}, {140, 4}, {144, 4}}, RunTensorMapCopy},
      {"gx_coop_count", {{0, 8}, {8, 8}}, RunCoopCount},
      {"gx_pdl_produce", {{0, 8}, {8, 4}}, RunPdlProduce},
      {"gx_pdl_consume", {{0, 8}, {8, 8}, {16, 4}}, RunPdlConsume},
      {"gx_sm_ids", {{0, 8}, {8, 8}}, RunSmIds},
      // The examples' kernels, by the names and layouts nvcc and Triton
      // give them.
      {"saxpy", {{0, 4}, {8, 8}, {16, 8}, {24, 8}}, RunSaxpy},
      {"add_kernel", {{0, 8}, {8, 8}, {16, 8}, {24, 4}}, RunTritonAdd},
      {"add_kernel", {{0, 8}, {8, 8}, {16, 8}, {24, 4}, {32, 8}}, RunTritonAdd},
      {"add_kernel", {{0, 8}, {8, 8}, {16, 8}, {24, 4}, {32, 8}, {40, 8}}, RunTritonAdd},
  };
  return *kernels;
}

}  // namespace

const KernelDef* FindKernel(const std::string& name) {
  for (const KernelDef& k : Kernels()) {
    if (name == k.name) return &k;
  }
  return nullptr;
}

const KernelDef* FindModel(const std::string& name, const std::vector<ParamSlot>& params) {
  for (const KernelDef& k : Kernels()) {
    if (name == k.name && params == k.params) return &k;
  }
  return nullptr;
}

namespace {

// out[k] = raw bits of argument k, zero-extended to 64 bits.
bool RunTypes(const KernelLaunch& l) {
  uint64_t* out = DeviceSpan<uint64_t>(l, l.Arg<uint64_t>(32), 8);
  if (out == nullptr) return false;
  const std::vector<ParamSlot>& params = FindKernel("gx_types")->params;
  for (size_t k = 0; k < 8; ++k) {
    uint64_t bits = 0;  // Little-endian: copying the low bytes zero-extends.
    std::memcpy(&bits, l.args.data() + params[k].offset, params[k].size);
    out[k] = bits;
  }
  return true;
}

}  // namespace
}  // namespace gxfake::internal

using namespace gxfake::internal;  // NOLINT(build/namespaces): the entry points are global

// --- Tensor maps ---

// Checks what the driver documents checking and writes FakeTensorMap.
GX_EXPORT CUresult cuTensorMapEncodeTiled(
    CUtensorMap* tensorMap, CUtensorMapDataType dataType, cuuint32_t rank, void* globalAddress,
    const cuuint64_t* globalDim, const cuuint64_t* globalStrides, const cuuint32_t* boxDim,
    const cuuint32_t* elementStrides, CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle,
    CUtensorMapL2promotion l2Promotion, CUtensorMapFloatOOBfill oobFill) {
  GX_RETURN_IF_ERROR(EntryStatus());
  if (tensorMap == nullptr || reinterpret_cast<uintptr_t>(tensorMap) % 64 != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (rank < 1 || rank > 5 || (interleave != CU_TENSOR_MAP_INTERLEAVE_NONE && rank < 3)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (dataType > CU_TENSOR_MAP_DATA_TYPE_TFLOAT32_FTZ ||
      interleave > CU_TENSOR_MAP_INTERLEAVE_32B || swizzle > CU_TENSOR_MAP_SWIZZLE_128B ||
      l2Promotion > CU_TENSOR_MAP_L2_PROMOTION_L2_256B ||
      oobFill > CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const uintptr_t address = reinterpret_cast<uintptr_t>(globalAddress);
  if (address % (interleave == CU_TENSOR_MAP_INTERLEAVE_32B ? 32 : 16) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  FakeTensorMap m;
  std::memset(&m, 0, sizeof(m));
  m.magic = kFakeTensorMapMagic;
  m.address = address;
  m.data_type = dataType;
  m.rank = rank;
  m.oob_fill = oobFill;
  for (cuuint32_t i = 0; i < rank; ++i) {
    if (globalDim[i] == 0 || globalDim[i] > (uint64_t{1} << 32)) return CUDA_ERROR_INVALID_VALUE;
    if (boxDim[i] == 0 || boxDim[i] > 256) return CUDA_ERROR_INVALID_VALUE;
    if (elementStrides[i] == 0 || elementStrides[i] > 8) return CUDA_ERROR_INVALID_VALUE;
    m.dims[i] = globalDim[i];
    m.box[i] = boxDim[i];
    if (i + 1 < rank) {
      if (globalStrides[i] % 16 != 0 || globalStrides[i] >= (uint64_t{1} << 40)) {
        return CUDA_ERROR_INVALID_VALUE;
      }
      m.strides[i] = globalStrides[i];
    }
  }
  std::memset(tensorMap, 0, sizeof(*tensorMap));
  std::memcpy(tensorMap, &m, sizeof(m));
  return CUDA_SUCCESS;
}

// --- Test-only exports ---

// The kernels of real images the double runs (comma-separated), for the
// daemon's refusal of the others.
GX_EXPORT const char* gxfake_example_kernels(void) { return kExampleKernels; }

// --- Signatures ---

GX_CHECK_SIGNATURE(cuTensorMapEncodeTiled, cuTensorMapEncodeTiled);
