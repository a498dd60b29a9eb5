// Kernels compiled at run time (NVRTC, or its test double in CI). The
// extern "C" ones have the names and parameter layouts of the libcuda
// double's models (tests/fake_cuda/fake_cuda.cc, after gx_kernels.cu), so
// a module compiled from this source runs on the double too. No headers:
// NVRTC has no standard include directories.

extern "C" {

// y[i] = a * x[i] + y[i] for i < n.
__global__ void gx_saxpy(float a, const float* x, float* y, unsigned long long n) {
  unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
  unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  for (; i < n; i += stride) y[i] = a * x[i] + y[i];
}

// out[i] = value for i < n.
__global__ void gx_fill_u32(unsigned int* out, unsigned int value, unsigned long long n) {
  unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
  unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  for (; i < n; i += stride) out[i] = value;
}

}  // extern "C"

// A template: instantiated by name expression ("gx_axpy<float>").
template <typename T>
__global__ void gx_axpy(T a, const T* x, T* y, unsigned long long n) {
  unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
