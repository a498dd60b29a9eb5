// One small kernel: the real-image seeds of image_check_fuzz (README.md).
extern "C" __global__ void seed_saxpy(float a, const float* x, float* y, unsigned n) {
  __shared__ float tile[32];
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  tile[threadIdx.x % 32] = i < n ? x[i] : 0.0f;
  __syncthreads();
  if (i < n) y[i] = a * tile[threadIdx.x % 32] + y[i];
}
