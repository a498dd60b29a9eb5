// The images beside this file, for image_kernels_test (CI has no nvcc):
//   nvcc -arch=sm_90 -cubin|-ptx|-fatbin listing.cu, and
//   nvcc -arch=sm_90 -fatbin -Xfatbin -compress-all -o listing_compressed.fatbin listing.cu
// Three kernels (one of them with a C++ name) and a device function that is none.
__device__ __noinline__ float helper(float x) { return x * 2.0f + 1.0f; }
extern "C" __global__ void saxpy(int n, float a, const float* x, float* y) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * helper(x[i]) + y[i];
}
extern "C" __global__ void fill(float* y, float v, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = v;
}
__global__ void mangled(int* p) { *p = 1; }
