// sparkbuild test data: one kernel and its host-side launcher.
#include <cuda_runtime.h>

__global__ void spark_scale(float *values, float factor, int count) {
  int index = blockIdx.x * blockDim.x + threadIdx.x;
  if (index < count) values[index] *= factor;
}

extern "C" int spark_scale_launch(float *values, float factor, int count) {
  spark_scale<<<(count + 255) / 256, 256>>>(values, factor, count);
  return static_cast<int>(cudaGetLastError());
}
