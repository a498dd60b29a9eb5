// The README's walk-through kernel: y = a * x + y on n floats.
//   nvcc -cubin -arch=sm_90 -o saxpy.cubin saxpy.cu
extern "C" __global__ void saxpy(float a, const float* x, float* y, unsigned long long n) {
  unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
