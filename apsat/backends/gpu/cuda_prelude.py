"""Fixed CUDA C text every kernel may call (split out of cuda.py, which writes the
kernels): the cast primitive and the warp reductions."""
from __future__ import annotations

# the `round` primitive (a cast): to nearest even in the type its code names (a literal, so
# the branches fold), back in float
ROUND = '''__device__ __forceinline__ float apsat_round(float x, float code) {
  if (code == 10.0f) return __half2float(__float2half_rn(x));
  if (code == 16.0f) return __bfloat162float(__float2bfloat16_rn(x));
  return x;
}
'''


WARP_REDUCE = '''__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = apsat_max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
'''
