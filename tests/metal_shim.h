// The part of Metal that mlxnet's kernels may use, declared for clang's C++ front end so that a
// kernel rendered for Metal can be type-checked without Apple's compiler. It stands where MLX's
// preamble stands (MLX compiles `metal::utils() + source`: <metal_stdlib>, `using namespace
// metal`, float16_t and bfloat16_t). Only declarations: nothing is defined away, and a name
// that is not declared here is an error, as CUDA's __syncthreads or threadIdx must be.
//
// Address spaces are real and distinct (clang's address_space attribute): device, constant and
// threadgroup pointers do not convert into one another, which is Metal's rule.

#define device __attribute__((address_space(1)))
#define constant __attribute__((address_space(2)))
#define threadgroup __attribute__((address_space(3)))
#define INFINITY (__builtin_huge_valf())

typedef unsigned int uint;
typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef short int16_t;
typedef unsigned short uint16_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long long int64_t;
typedef unsigned long long uint64_t;
typedef _Float16 half;
typedef __bf16 bfloat;
typedef unsigned int uint2 __attribute__((ext_vector_type(2)));
typedef unsigned int uint3 __attribute__((ext_vector_type(3)));
typedef float float2 __attribute__((ext_vector_type(2)));
typedef float float4 __attribute__((ext_vector_type(4)));

namespace metal {
enum class mem_flags { mem_none = 0, mem_device = 1, mem_threadgroup = 2, mem_texture = 4 };
void threadgroup_barrier(mem_flags flags);

#define MLXNET_SHIM_FLOAT_MATH(T)                                                          \
  T exp(T x); T log(T x); T sqrt(T x); T rsqrt(T x); T abs(T x); T floor(T x); T ceil(T x); \
  T fmax(T a, T b); T fmin(T a, T b); T min(T a, T b); T max(T a, T b);                    \
  T tanh(T x); T precise_divide(T a, T b); bool isnan(T x); bool isinf(T x);
MLXNET_SHIM_FLOAT_MATH(float)
MLXNET_SHIM_FLOAT_MATH(half)
#undef MLXNET_SHIM_FLOAT_MATH
int min(int a, int b); int max(int a, int b); int abs(int x);
uint min(uint a, uint b); uint max(uint a, uint b);
}  // namespace metal

using namespace metal;
typedef half float16_t;
typedef bfloat bfloat16_t;
