// Test kernels. The service test suite runs them on a real GPU (compiled by
// nvcc to sm_90 cubin, PTX and fatbin) and on the libcuda test double, which
// implements each of them on the host with the same parameter layout.
// Any change here must be mirrored in tests/fake_cuda.
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

namespace cg = cooperative_groups;

extern "C" {

__global__ void gx_empty() {}

// out[i] = value for i < n.
__global__ void gx_fill_u32(uint32_t* out, uint32_t value, uint64_t n) {
  uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x;
  uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
  for (; i < n; i += stride) out[i] = value;
}

// y[i] = a * x[i] + y[i] for i < n.
__global__ void gx_saxpy(float a, const float* x, float* y, uint64_t n) {
  uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x;
  uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
  for (; i < n; i += stride) y[i] = a * x[i] + y[i];
}

// Spins for `ns` nanoseconds of wall time (one thread is enough).
__global__ void gx_spin(uint64_t ns) {
  uint64_t start;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  uint64_t now = start;
  while (now - start < ns) {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  }
}

// Writes through an address that is not mapped: CUDA_ERROR_ILLEGAL_ADDRESS.
__global__ void gx_fault(uint64_t address) { *reinterpret_cast<volatile uint32_t*>(address) = 1; }

// Uses `n` 32-bit words of dynamic shared memory per block: block b writes
// out[b] = sum over k < n of (k ^ b). Launch with shared_memory_bytes = 4*n.
__global__ void gx_bigshared(uint32_t* out, uint32_t n) {
  extern __shared__ uint32_t smem[];
  for (uint32_t k = threadIdx.x; k < n; k += blockDim.x) smem[k] = k ^ blockIdx.x;
  __syncthreads();
  if (threadIdx.x == 0) {
    uint32_t sum = 0;
    for (uint32_t k = 0; k < n; ++k) sum += smem[k];
    out[blockIdx.x] = sum;
  }
}

struct gx_quad {
  uint32_t a;
  uint32_t b;
  float c;
  uint32_t d;
};

// A by-value struct argument (16 bytes): out = {a, b, bits(c), d}.
__global__ void gx_struct(gx_quad q, uint32_t* out) {
  if (threadIdx.x == 0 && blockIdx.x == 0) {
    out[0] = q.a;
    out[1] = q.b;
    out[2] = __float_as_uint(q.c);
    out[3] = q.d;
  }
}

// Every scalar kind; out[k] receives the raw bits of argument k,
// zero-extended to 64 bits. Layout (offset:size): a 0:1, b 2:2, c 4:4, d 8:8,
// e 16:2, f 18:2, g 20:4, h 24:8, out 32:8.
__global__ void gx_types(int8_t a, int16_t b, uint32_t c, int64_t d, __half e, __nv_bfloat16 f,
                         float g, double h, uint64_t* out) {
  if (threadIdx.x == 0 && blockIdx.x == 0) {
    out[0] = (uint8_t)a;
    out[1] = (uint16_t)b;
    out[2] = c;
    out[3] = (uint64_t)d;
    out[4] = __half_as_ushort(e);
    out[5] = __bfloat16_as_ushort(f);
    out[6] = __float_as_uint(g);
    out[7] = (uint64_t)__double_as_longlong(h);
  }
}

// out[linear block id] = rank of the block in its cluster (0 without one).
__global__ void gx_cluster_rank(uint32_t* out) {
  if (threadIdx.x == 0) {
    uint32_t b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    out[b] = cg::this_cluster().block_rank();
  }
}

// Shaped like a Triton 3.x kernel: the user's parameters, then the two
// pointers Triton appends (global scratch, profile scratch). out[i] = x[i] +
// y[i] for i < n. When a scratch pointer is not null, the first thread of
// block b (linear block id) writes b + 1 to its 32-bit word b.
__global__ void gx_add_scratch(const float* x, const float* y, float* out, int n,
                               void* global_scratch, void* profile_scratch) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x) {
    out[i] = x[i] + y[i];
  }
  if (threadIdx.x == 0) {
    uint32_t b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    if (global_scratch != nullptr) static_cast<uint32_t*>(global_scratch)[b] = b + 1;
    if (profile_scratch != nullptr) static_cast<uint32_t*>(profile_scratch)[b] = b + 1;
  }
}

// TMA: loads the FLOAT32 box of a rank-2 tensor map at (x, y) (innermost
// first) into shared memory with cp.async.bulk.tensor and copies its
// `count` elements (the box's) to out, innermost fastest. Elements outside
// the tensor read as the map's fill. At most 4096 elements. x times 4 must
// be a multiple of 16 (TMA's rule for a box's inner start: on the H200 any
// other x is an illegal instruction).
// The 128 opaque, 64-byte aligned bytes of a CUtensorMap (the driver's
// header is not the kernels' to include).
struct alignas(64) GxTensorMap {
  unsigned long long opaque[16];
};

__global__ void gx_tensormap_copy(const __grid_constant__ GxTensorMap map, float* out, int x, int y,
                                  uint32_t count) {
#if __CUDA_ARCH__ >= 900
  __shared__ alignas(128) float tile[4096];
  __shared__ alignas(8) uint64_t bar;
  if (count > 4096) return;
  const uint32_t bar_addr = static_cast<uint32_t>(__cvta_generic_to_shared(&bar));
  const uint32_t tile_addr = static_cast<uint32_t>(__cvta_generic_to_shared(tile));
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar_addr));
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar_addr),
                 "r"(count * 4)
                 : "memory");
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%2, %3}], [%4];" ::"r"(tile_addr),
        "l"(reinterpret_cast<uint64_t>(&map)), "r"(x), "r"(y), "r"(bar_addr)
        : "memory");
  }
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], 0;\n"
      "@!done bra WAIT_%=;\n"
      "}" ::"r"(bar_addr)
      : "memory");
  for (uint32_t i = threadIdx.x; i < count; i += blockDim.x) out[i] = tile[i];
#endif
}

// Needs a cooperative launch: the first thread of each block adds one to
// *counter (zero before), then every block waits until all have; block 0
// writes the count that met to out[0].
__global__ void gx_coop_count(uint32_t* counter, uint32_t* out) {
  const uint32_t blocks = gridDim.x * gridDim.y * gridDim.z;
  if (threadIdx.x == 0) {
    atomicAdd(counter, 1u);
    while (atomicAdd(counter, 0u) < blocks) {
    }
    if (blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0) out[0] = atomicAdd(counter, 0u);
  }
}

// A programmatic dependent launch pair: the producer writes data[i] = i + 1
// and lets its dependent start; the consumer waits for it (griddepcontrol
// waits for the producer's completion and memory) and writes out[i] =
// 2 * data[i].
__global__ void gx_pdl_produce(uint32_t* data, uint32_t n) {
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    data[i] = i + 1;
  }
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__global__ void gx_pdl_consume(const uint32_t* data, uint32_t* out, uint32_t n) {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    out[i] = 2 * data[i];
  }
}

// Block b spins `ns` nanoseconds (so that the blocks spread over every SM
// they may run on), then writes the SM it ran on to out[b]: how many SMs a
// stream's kernels reach.
__global__ void gx_sm_ids(uint32_t* out, uint64_t ns) {
  uint64_t start;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  uint64_t now = start;
  while (now - start < ns) {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  }
  if (threadIdx.x == 0) {
    uint32_t sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    out[blockIdx.x] = sm;
  }
}

}  // extern "C"
