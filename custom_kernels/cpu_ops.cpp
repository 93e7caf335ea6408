// mlxnet's CPU primitives (built on first use by mlxnet/_native.py, loaded as mlxnet_cpu_ops).
//
// MLX's CPU back end has no custom-kernel hook and runs its copies and elementwise passes on
// one core. The hot spots of the ports are written here as MLX primitives instead:
// - im2col: the patch matrix of a convolution, with the zero padding implicit (no pad pass),
//   copied as contiguous runs on every core (mx.conv2d's own unfold is a scalar strided copy).
// - bias_act: a convolution's epilogue, relu(y + bias + residual), in one pass on every core.
// - bias_silu: silu(y + bias) in one pass on every core, with the same float32 operations
//   (and exp polynomial) as the MLX-composed reference in mlxnet/ops/activations/cpu.py.
// - direct_conv2d: a register-tiled direct convolution with bias and SiLU fused, for the small
//   channel counts where a GEMM runs far below peak.
// - sigmoid and softmax (over the last axis): the same exp polynomial, on every core.
// - gelu (erf and tanh forms): x·Φ(x) from an erfc fit around the same polynomial, on every
//   core (MLX evaluates erf one scalar at a time; the composed path is four passes). The
//   MLX-composed references are mx.compile'd passes, which MLX's CPU JIT compiles with g++
//   into $TMPDIR on every fresh TMPDIR (~1.8 s before a detector's first result); these are
//   compiled once per installation with the rest of this file.
// - layer_norm over the last axis: one row per step on every core (MLX's runs on one).
// - attention (softmax(scale·q·kᵀ)·v, no bias) for many queries against a few keys: sixteen
//   query rows per vector step, where MLX runs a BLAS call per head too small to use a core.
// - col2im (im2col's adjoint) and batch_norm_train (training-mode BatchNorm + SiLU, with its
//   gradient as a second primitive): the pieces of a training step that MLX's CPU back end runs
//   slowest (its convolution gradients unfold pixel by pixel; its BatchNorm is a dozen passes).
// Each has a vjp, written with MLX ops or these primitives, so gradients flow as through the
// references.
#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <future>
#include <limits>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <variant>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/variant.h>
#include <nanobind/stl/vector.h>

#include "mlx/backend/cpu/encoder.h"
#include "mlx/ops.h"
#include "mlx/primitives.h"
#include "mlx/transforms.h"

namespace mx = mlx::core;
namespace nb = nanobind;

namespace {

size_t cores() {
  return std::max(1u, std::thread::hardware_concurrency());
}

// The helper threads of parallel_for. After a task each stays awake for kSpin (50 us; 200 was
// no faster) before it blocks, so the next op's parallel pass finds it running (as OpenMP's
// threads spin between parallel regions). A thread that has blocked can take a hundred
// microseconds or more to run again, longer after the process was idle for a while (on a VM,
// its virtual CPU has been halted): waking one per op made a YOLOv8n forward on a 2-core VM 25%
// slower after a 0.2 s pause than back to back. The caller takes tasks too, so a job finishes
// even if no helper wakes.
class Helpers {
 public:
  static constexpr auto kSpin = std::chrono::microseconds(50);

  explicit Helpers(size_t n) {
    for (size_t i = 0; i < n; ++i) std::thread([this] { loop(); }).detach();
  }

  // task(ctx, k) for k in [0, tasks): the caller's thread and the helpers, each task once. Jobs
  // from two threads at once, or from inside a task, run on their caller alone.
  void run(size_t tasks, void (*task)(const void*, size_t), const void* ctx) {
    std::unique_lock<std::mutex> job(job_mutex_, std::try_to_lock);
    if (!job.owns_lock() || in_job_ || tasks > kIndexMask) {
      for (size_t k = 0; k < tasks; ++k) task(ctx, k);
      return;
    }
    in_job_ = true;
    task_ = task, ctx_ = ctx;
    remaining_.store(tasks, std::memory_order_relaxed);
    // One word holds the job's generation, its task count and the next task: whoever takes a
    // task reads its count from the same word, so a thread still taking from the job before
    // cannot run a task twice or one of a job not yet published (the store releases the
    // fields above; every take is an acquiring read-modify-write of this release sequence).
    uint64_t gen = (ticket_.load(std::memory_order_relaxed) >> kGenShift) + 1;
    ticket_.store((gen << kGenShift) | (uint64_t(tasks) << kTasksShift), std::memory_order_seq_cst);
    if (sleepers_.load(std::memory_order_seq_cst) > 0) {
      std::lock_guard<std::mutex> lock(sleep_mutex_);
      wake_.notify_all();
    }
    take_tasks();
    while (remaining_.load(std::memory_order_acquire) > 0) relax();
    in_job_ = false;
  }

 private:
  static constexpr int kTasksShift = 20, kGenShift = 40;
  static constexpr uint64_t kIndexMask = (uint64_t(1) << kTasksShift) - 1;

  static void relax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#else
    std::this_thread::yield();
#endif
  }

  void take_tasks() {
    for (;;) {
      uint64_t t = ticket_.fetch_add(1, std::memory_order_acq_rel);
      uint64_t k = t & kIndexMask, tasks = (t >> kTasksShift) & kIndexMask;
      if (k >= tasks) return;
      task_(ctx_, k);
      remaining_.fetch_sub(1, std::memory_order_acq_rel);
    }
  }

  uint64_t generation() const {
    return ticket_.load(std::memory_order_seq_cst) >> kGenShift;
  }

  void loop() {
    uint64_t seen = 0;
    for (;;) {
      auto since = std::chrono::steady_clock::now();
      uint64_t g;
      while ((g = generation()) == seen) {
        if (std::chrono::steady_clock::now() - since < kSpin) {
          relax();
          continue;
        }
        std::unique_lock<std::mutex> lock(sleep_mutex_);
        sleepers_.fetch_add(1, std::memory_order_seq_cst);
        wake_.wait(lock, [&] { return generation() != seen; });
        sleepers_.fetch_sub(1, std::memory_order_seq_cst);
      }
      seen = g;
      take_tasks();
    }
  }

  std::mutex job_mutex_, sleep_mutex_;
  std::condition_variable wake_;
  std::atomic<uint64_t> ticket_{0};
  std::atomic<size_t> remaining_{0}, sleepers_{0};
  void (*task_)(const void*, size_t) = nullptr;
  const void* ctx_ = nullptr;
  static thread_local bool in_job_;
};
thread_local bool Helpers::in_job_ = false;

Helpers& helpers() {
  static Helpers* pool = new Helpers(cores() - 1);  // never destroyed: its threads outlive exit
  return *pool;
}

// body(lo, hi) over [0, n) in up to cores() chunks of at least `grain` items.
template <typename F>
void parallel_for(size_t n, size_t grain, F&& body) {
  size_t chunks = std::min(cores(), (n + grain - 1) / std::max<size_t>(grain, 1));
  if (chunks <= 1) {
    body(size_t(0), n);
    return;
  }
  struct Job {
    F* body;
    size_t n, step;
  } job{&body, n, (n + chunks - 1) / chunks};
  helpers().run(chunks, [](const void* ctx, size_t k) {
    auto& j = *static_cast<const Job*>(ctx);
    size_t lo = k * j.step, hi = std::min(j.n, lo + j.step);
    if (lo < hi) (*j.body)(lo, hi);
  }, &job);
}

// Copies of a few dozen bytes (3-channel pixels) as fixed-size moves, not memcpy calls.
inline void copy_bytes(char* d, const char* s, size_t n) {
  if (n >= 256) {
    std::memcpy(d, s, n);
    return;
  }
  for (; n >= 16; n -= 16, d += 16, s += 16) std::memcpy(d, s, 16);
  for (; n >= 4; n -= 4, d += 4, s += 4) std::memcpy(d, s, 4);
  for (; n; --n) *d++ = *s++;
}

// The primitives here have no GPU evaluation: the ops call them on the CPU device only.
class CpuPrimitive : public mx::Primitive {
 public:
  using mx::Primitive::Primitive;
  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error(std::string(name()) + ": mlxnet's CPU primitive runs on the CPU only");
  }

 protected:
  // Allocates the output and registers every array with this stream's encoder.
  mx::cpu::CommandEncoder& encoder_for(const std::vector<mx::array>& inputs, mx::array& out) {
    out.set_data(mx::allocator::malloc(out.nbytes()));
    return registered(inputs, out);
  }

  // For a primitive that writes each row only after reading it (elementwise, and row-wise
  // reductions that read a row before overwriting it): the output takes over the first input's
  // buffer when nothing else holds that input, as MLX's own elementwise ops do. A fresh output
  // would be a fresh allocation, which in a process that returns freed memory to the system
  // page-faults on every page (a 67 MB map of SAM's encoder: 16 K faults).
  mx::cpu::CommandEncoder& encoder_in_place(const std::vector<mx::array>& inputs, mx::array& out) {
    auto& x = inputs[0];
    if (x.is_donatable() && x.flags().row_contiguous && x.dtype() == out.dtype() && x.size() == out.size()) {
      out.copy_shared_buffer(x);
      return registered(inputs, out);
    }
    return encoder_for(inputs, out);
  }

  // For a primitive of several outputs: allocates each and registers every array.
  mx::cpu::CommandEncoder& encoder_for_all(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
    auto& encoder = mx::cpu::get_command_encoder(stream());
    for (auto& a : inputs) encoder.set_input_array(a);
    for (auto& o : outputs) {
      o.set_data(mx::allocator::malloc(o.nbytes()));
      encoder.set_output_array(o);
    }
    return encoder;
  }

 private:
  mx::cpu::CommandEncoder& registered(const std::vector<mx::array>& inputs, mx::array& out) {
    auto& encoder = mx::cpu::get_command_encoder(stream());
    for (auto& a : inputs) encoder.set_input_array(a);
    encoder.set_output_array(out);
    return encoder;
  }
};

struct Geometry {
  int kh, kw, sh, sw, ph, pw, dh, dw;
  bool operator==(const Geometry&) const = default;
};

int out_size(int in, int k, int s, int p, int d) {
  return (in + 2 * p - d * (k - 1) - 1) / s + 1;
}

using Pair = std::tuple<int, int>;

Geometry geometry(int kh, int kw, Pair stride, Pair padding, Pair dilation) {
  return {kh, kw, std::get<0>(stride), std::get<1>(stride), std::get<0>(padding), std::get<1>(padding),
          std::get<0>(dilation), std::get<1>(dilation)};
}

// (OH, OW) of an (N, H, W, C) input, or `op`'s error where the kernel does not fit the padded input.
std::pair<int, int> checked_out_size(const mx::array& x, const Geometry& g, const std::string& op) {
  int oh = out_size(x.shape(1), g.kh, g.sh, g.ph, g.dh), ow = out_size(x.shape(2), g.kw, g.sw, g.pw, g.dw);
  if (g.kh < 1 || g.kw < 1 || g.sh < 1 || g.sw < 1 || g.ph < 0 || g.pw < 0 || g.dh < 1 || g.dw < 1 || oh < 1 || ow < 1) {
    throw std::invalid_argument(op + ": the kernel does not fit the padded input");
  }
  return {oh, ow};
}

// A primitive defined by a convolution's geometry alone.
class GeometryPrimitive : public CpuPrimitive {
 public:
  GeometryPrimitive(mx::Stream s, Geometry g) : CpuPrimitive(s), g_(g) {}
  bool is_equivalent(const mx::Primitive& other) const override {
    return g_ == static_cast<const GeometryPrimitive&>(other).g_;
  }

 protected:
  Geometry g_;
};

class Im2Col : public GeometryPrimitive {
 public:
  using GeometryPrimitive::GeometryPrimitive;

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    auto& x = inputs[0];
    auto& out = outputs[0];
    auto& encoder = encoder_for(inputs, out);
    size_t pixel = x.shape(3) * x.itemsize();
    int batch = x.shape(0), h = x.shape(1), w = x.shape(2), oh = out.shape(1), ow = out.shape(2);
    encoder.dispatch([src = x.data<char>(), dst = out.data<char>(), g = g_, pixel, batch, h, w, oh, ow] {
      size_t run = g.kw * pixel, patch = g.kh * run;
      parallel_for(size_t(batch) * oh, 4, [&](size_t lo, size_t hi) {
        for (size_t row = lo; row < hi; ++row) {
          int b = row / oh, oy = row % oh;
          char* d = dst + row * ow * patch;
          for (int ox = 0; ox < ow; ++ox) {
            int ix0 = ox * g.sw - g.pw;
            for (int i = 0; i < g.kh; ++i, d += run) {
              int iy = oy * g.sh - g.ph + i * g.dh;
              if (iy < 0 || iy >= h) {
                std::memset(d, 0, run);
                continue;
              }
              const char* s = src + (size_t(b) * h + iy) * w * pixel;
              if (g.dw == 1 && ix0 >= 0 && ix0 + g.kw <= w) {  // the whole kernel row inside
                copy_bytes(d, s + ix0 * pixel, run);
                continue;
              }
              for (int j = 0; j < g.kw; ++j) {
                int ix = ix0 + j * g.dw;
                if (ix < 0 || ix >= w) {
                  std::memset(d + j * pixel, 0, pixel);
                } else {
                  copy_bytes(d + j * pixel, s + ix * pixel, pixel);
                }
              }
            }
          }
        }
      });
    });
  }

  // col2im: mlxnet's primitive in float32 (defined below); otherwise with MLX ops, each tap's
  // cotangent added into its strided window of the padded input, and the padding cropped.
  std::vector<mx::array> vjp(const std::vector<mx::array>& primals, const std::vector<mx::array>& cotangents,
                             const std::vector<int>&, const std::vector<mx::array>&) override;

  const char* name() const override {
    return "MlxnetIm2Col";
  }
};

mx::array col2im_of(const mx::array& cols, const mx::Shape& image, Geometry g, mx::Stream s);

std::vector<mx::array> Im2Col::vjp(const std::vector<mx::array>& primals, const std::vector<mx::array>& cotangents,
                                   const std::vector<int>&, const std::vector<mx::array>&) {
  auto& x = primals[0];
  auto& cot = cotangents[0];
  int batch = x.shape(0), h = x.shape(1), w = x.shape(2), c = x.shape(3);
  int oh = cot.shape(1), ow = cot.shape(2);
  auto s = stream();
  if (cot.dtype() == mx::float32) {
    return {col2im_of(cot, x.shape(), g_, s)};
  }
  auto grad = mx::zeros({batch, h + 2 * g_.ph, w + 2 * g_.pw, c}, cot.dtype(), s);
  auto taps = mx::reshape(cot, {batch, oh, ow, g_.kh * g_.kw, c}, s);
  for (int i = 0; i < g_.kh; ++i) {
    for (int j = 0; j < g_.kw; ++j) {
      int t = i * g_.kw + j;
      auto tap = mx::reshape(mx::slice(taps, {0, 0, 0, t, 0}, {batch, oh, ow, t + 1, c}, s),
                             {batch, oh, ow, c}, s);
      mx::Shape start{0, i * g_.dh, j * g_.dw, 0};
      mx::Shape stop{batch, i * g_.dh + g_.sh * (oh - 1) + 1, j * g_.dw + g_.sw * (ow - 1) + 1, c};
      mx::Shape strides{1, g_.sh, g_.sw, 1};
      auto window = mx::slice(grad, start, stop, strides, s);
      grad = mx::slice_update(grad, mx::add(window, tap, s), start, stop, strides, s);
    }
  }
  return {mx::slice(grad, {0, g_.ph, g_.pw, 0}, {batch, g_.ph + h, g_.pw + w, c}, s)};
}

// The adjoint of Im2Col: each input pixel gathers the patch entries that copied it (no scatter,
// so rows of the image are independent and run on every core). float32.
class Col2Im : public GeometryPrimitive {
 public:
  using GeometryPrimitive::GeometryPrimitive;

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    auto& cols = inputs[0];
    auto& out = outputs[0];
    auto& encoder = encoder_for(inputs, out);
    int batch = out.shape(0), h = out.shape(1), w = out.shape(2), c = out.shape(3);
    int oh = cols.shape(1), ow = cols.shape(2);
    encoder.dispatch([src = cols.data<float>(), dst = out.data<float>(), g = g_, batch, h, w, c, oh, ow] {
      size_t patch = size_t(g.kh) * g.kw * c;
      parallel_for(size_t(batch) * h, 1, [&](size_t lo, size_t hi) {
        for (size_t row = lo; row < hi; ++row) {
          int b = row / h, iy = row % h;
          float* d = dst + row * w * c;
          std::fill(d, d + size_t(w) * c, 0.0f);
          for (int i = 0; i < g.kh; ++i) {
            int ty = iy + g.ph - i * g.dh;
            if (ty < 0 || ty % g.sh) continue;
            int oy = ty / g.sh;
            if (oy >= oh) continue;
            const float* srow = src + (size_t(b) * oh + oy) * ow * patch;
            for (int j = 0; j < g.kw; ++j) {
              // Input column ix reads output column (ix + off) / sw where that divides evenly.
              int off = g.pw - j * g.dw, ix = std::max(0, -off);
              while (ix < w && (ix + off) % g.sw) ++ix;
              const float* tap = srow + (size_t(i) * g.kw + j) * c;
              for (; ix < w; ix += g.sw) {
                int ox = (ix + off) / g.sw;
                if (ox >= ow) break;
                float* __restrict dp = d + size_t(ix) * c;
                const float* __restrict sp = tap + ox * patch;
                for (int k = 0; k < c; ++k) dp[k] += sp[k];
              }
            }
          }
        }
      });
    });
  }

  // Its adjoint is the patch matrix again.
  std::vector<mx::array> vjp(const std::vector<mx::array>&, const std::vector<mx::array>& cotangents,
                             const std::vector<int>&, const std::vector<mx::array>&) override;

  const char* name() const override {
    return "MlxnetCol2Im";
  }
};

mx::array col2im_of(const mx::array& cols, const mx::Shape& image, Geometry g, mx::Stream s) {
  return mx::array(image, mx::float32, std::make_shared<Col2Im>(s, g), {mx::contiguous(cols, false, s)});
}

mx::array im2col_of(const mx::array& x, Geometry g, mx::Stream s) {
  int oh = out_size(x.shape(1), g.kh, g.sh, g.ph, g.dh), ow = out_size(x.shape(2), g.kw, g.sw, g.pw, g.dw);
  return mx::array({x.shape(0), oh, ow, g.kh * g.kw * x.shape(3)}, x.dtype(), std::make_shared<Im2Col>(s, g),
                   {mx::contiguous(x, false, s)});
}

std::vector<mx::array> Col2Im::vjp(const std::vector<mx::array>&, const std::vector<mx::array>& cotangents,
                                   const std::vector<int>&, const std::vector<mx::array>&) {
  return {im2col_of(cotangents[0], g_, stream())};
}

// exp(z) = p(r)·2^n, the constants and order of operations of mlxnet/ops/activations/cpu.py.
constexpr float kLog2e = 1.4426950408889634f, kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
constexpr float kC0 = 1.9875691500e-4f, kC1 = 1.3981999507e-3f, kC2 = 8.3334519073e-3f;
constexpr float kC3 = 4.1665795894e-2f, kC4 = 1.6666665459e-1f, kC5 = 5.0000001201e-1f;
constexpr float kRound = 12582912.0f;  // 1.5·2^23: (v + kRound) − kRound rounds v to an integer
constexpr float kZLimit = 1e6f;

// exp(z) for |z| ≤ kZLimit (callers clip: r stays finite, and 2^n is 0 or inf outside float32's
// range). NaN in gives NaN out (2^n is then 0, but r is NaN).
inline float exp_poly(float z) {
  float n = (z * kLog2e + kRound) - kRound;
  int bits = (std::min(std::max(static_cast<int>(n), -127), 128) + 127) << 23;
  float two = std::bit_cast<float>(bits);
  float r = (z - n * kLn2Hi) - n * kLn2Lo;
  float r2 = r * r, r4 = r2 * r2;
  float q = r4 * (kC0 * r + kC1) + (r2 * (kC2 * r + kC3) + (kC4 * r + kC5));
  return (r2 * q + (1.0f + r)) * two;
}

// exp(−x), x clipped to ±kZLimit first. std::max/min return their first argument when it is
// NaN, as MLX's maximum/minimum (mx.clip) do, so NaN propagates as in the reference.
inline float exp_negated(float x) {
  return exp_poly(-std::min(std::max(x, -kZLimit), kZLimit));
}

inline float silu(float x) {
  return x / (1.0f + exp_negated(x));
}

inline float sigmoid(float x) {
  return 1.0f / (1.0f + exp_negated(x));
}

// A per-channel bias's gradient: the cotangent summed over every axis but the last (C).
mx::array bias_gradient(const mx::array& g, mx::Stream s) {
  std::vector<int> axes(g.ndim() - 1);
  for (int a = 0; a < g.ndim() - 1; ++a) axes[a] = a;
  return mx::sum(g, axes, false, s);
}

class BiasSiLU : public CpuPrimitive {
 public:
  BiasSiLU(mx::Stream s, bool has_bias) : CpuPrimitive(s), has_bias_(has_bias) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    auto& y = inputs[0];
    auto& out = outputs[0];
    auto& encoder = encoder_in_place(inputs, out);
    const float* bias = has_bias_ ? inputs[1].data<float>() : nullptr;
    size_t c = y.ndim() ? y.shape(-1) : 1, rows = c ? y.size() / c : 0;
    encoder.dispatch([src = y.data<float>(), dst = out.data<float>(), bias, c, rows] {
      parallel_for(rows, std::max<size_t>(1, 32768 / std::max<size_t>(c, 1)), [&](size_t lo, size_t hi) {
        if (!bias) {
          for (size_t k = lo * c; k < hi * c; ++k) dst[k] = silu(src[k]);
          return;
        }
        for (size_t r = lo; r < hi; ++r) {
          const float* s = src + r * c;
          float* d = dst + r * c;
          for (size_t k = 0; k < c; ++k) d[k] = silu(s[k] + bias[k]);
        }
      });
    });
  }

  // d silu(v)/dv = s·(1 + v·(1 − s)), s = sigmoid(v); the bias gets the sum over all but C.
  std::vector<mx::array> vjp(const std::vector<mx::array>& primals, const std::vector<mx::array>& cotangents,
                             const std::vector<int>& argnums, const std::vector<mx::array>&) override {
    auto s = stream();
    auto v = has_bias_ ? mx::add(primals[0], primals[1], s) : primals[0];
    auto sig = mx::sigmoid(v, s);
    auto slope = mx::multiply(sig, mx::add(mx::array(1.0f), mx::multiply(v, mx::subtract(mx::array(1.0f), sig, s), s), s), s);
    auto g = mx::multiply(cotangents[0], slope, s);
    std::vector<mx::array> grads;
    for (int arg : argnums) {
      if (arg == 0) {
        grads.push_back(g);
      } else {
        grads.push_back(bias_gradient(g, s));
      }
    }
    return grads;
  }

  const char* name() const override {
    return "MlxnetBiasSiLU";
  }
  bool is_equivalent(const mx::Primitive& other) const override {
    return has_bias_ == static_cast<const BiasSiLU&>(other).has_bias_;
  }

 private:
  bool has_bias_;
};


// A convolution's epilogue: relu(y + bias + residual) (residual and ReLU optional) in one pass on
// every core, in y's buffer where MLX donates it; MLX's own ops take a pass each on one core.
class BiasAct : public CpuPrimitive {
 public:
  BiasAct(mx::Stream s, bool has_residual, bool relu) : CpuPrimitive(s), has_residual_(has_residual), relu_(relu) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    auto& y = inputs[0];
    auto& out = outputs[0];
    auto& encoder = encoder_in_place(inputs, out);
    const float* bias = inputs[1].data<float>();
    const float* res = has_residual_ ? inputs[2].data<float>() : nullptr;
    size_t c = y.shape(-1), rows = c ? y.size() / c : 0;
    bool relu = relu_;
    encoder.dispatch([src = y.data<float>(), dst = out.data<float>(), bias, res, c, rows, relu] {
      parallel_for(rows, std::max<size_t>(1, 32768 / std::max<size_t>(c, 1)), [&](size_t lo, size_t hi) {
        for (size_t r = lo; r < hi; ++r) {
          const float* s = src + r * c;
          float* d = dst + r * c;
          if (res) {
            const float* q = res + r * c;
            if (relu) {
              for (size_t k = 0; k < c; ++k) d[k] = std::max(s[k] + bias[k] + q[k], 0.0f);
            } else {
              for (size_t k = 0; k < c; ++k) d[k] = s[k] + bias[k] + q[k];
            }
          } else if (relu) {
            for (size_t k = 0; k < c; ++k) d[k] = std::max(s[k] + bias[k], 0.0f);
          } else {
            for (size_t k = 0; k < c; ++k) d[k] = s[k] + bias[k];
          }
        }
      });
    });
  }

  // The ReLU passes the cotangent where the output is positive; y and the residual get it, the
  // bias its sum over all but C.
  std::vector<mx::array> vjp(const std::vector<mx::array>& primals, const std::vector<mx::array>& cotangents,
                             const std::vector<int>& argnums, const std::vector<mx::array>& outputs) override {
    auto s = stream();
    auto g = relu_ ? mx::where(mx::greater(outputs[0], mx::array(0.0f), s), cotangents[0], mx::array(0.0f), s)
                   : cotangents[0];
    std::vector<mx::array> grads;
    for (int arg : argnums) {
      if (arg == 1) {
        grads.push_back(bias_gradient(g, s));
      } else {
        grads.push_back(g);
      }
    }
    return grads;
  }

  const char* name() const override {
    return "MlxnetBiasAct";
  }
  bool is_equivalent(const mx::Primitive& other) const override {
    auto& o = static_cast<const BiasAct&>(other);
    return has_residual_ == o.has_residual_ && relu_ == o.relu_;
  }

 private:
  bool has_residual_, relu_;
};


// Elements per task of the elementwise passes: a few microseconds of work, so that a small
// array runs on the calling thread alone and a large one on every core.
constexpr size_t kGrain = 16384;

class Sigmoid : public CpuPrimitive {
 public:
  using CpuPrimitive::CpuPrimitive;

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    auto& x = inputs[0];
    auto& out = outputs[0];
    auto& encoder = encoder_in_place(inputs, out);
    encoder.dispatch([src = x.data<float>(), dst = out.data<float>(), n = x.size()] {
      parallel_for(n, kGrain, [&](size_t lo, size_t hi) {
        for (size_t k = lo; k < hi; ++k) dst[k] = sigmoid(src[k]);
      });
    });
  }

  // sigmoid' = y·(1 − y) from the output, as the reference's closed-form slope (and MLX's own
  // sigmoid) do: no exp is evaluated again, and ±inf inputs get the true 0.
  std::vector<mx::array> vjp(const std::vector<mx::array>&, const std::vector<mx::array>& cotangents,
                             const std::vector<int>&, const std::vector<mx::array>& outputs) override {
    auto s = stream();
    auto& y = outputs[0];
    return {mx::multiply(cotangents[0], mx::multiply(y, mx::subtract(mx::array(1.0f), y, s), s), s)};
  }

  const char* name() const override {
    return "MlxnetSigmoid";
  }
  bool is_equivalent(const mx::Primitive&) const override {
    return true;
  }
};

// exp(a + b) for a = −(an exactly representable square)/2 and a small b: the sum is rounded only
// after the range reduction (a − n·ln2 is exact there), so that exp(−x²/2) keeps float32's
// relative accuracy where x²/2 is large (GELU's negative tail); exp_poly's own argument would
// carry x²/2's rounding, ~1e-5 relative at x ≈ −13. Same polynomial as exp_poly; a ≥ −5e5.
inline float exp_split(float a, float b) {
  float n = ((a + b) * kLog2e + kRound) - kRound;
  int bits = (std::min(std::max(static_cast<int>(n), -127), 128) + 127) << 23;
  float two = std::bit_cast<float>(bits);
  float r = ((a - n * kLn2Hi) - n * kLn2Lo) + b;
  float r2 = r * r, r4 = r2 * r2;
  float q = r4 * (kC0 * r + kC1) + (r2 * (kC2 * r + kC3) + (kC4 * r + kC5));
  return (r2 * q + (1.0f + r)) * two;
}

// Φ(−a) = erfc(a/√2)/2 for a ≥ 0 (NaN in, NaN out), the lower tail of the normal CDF, with
// float32's relative accuracy: erfc(z) = t·exp(−z² + P(t)), t = 1/(1 + z/2), P the Chebyshev
// fit of Numerical Recipes' erfcc (relative error < 1.2e-7 for every z ≥ 0, one formula: no
// branch, so the loop vectorises). z² = a²/2 is formed exactly (a split into 12-bit halves)
// and goes into exp_split. Measured against float64, GELU = x·Φ(x) built on it is within
// 4.8e-7 relative for x > −10 and 1e-6 down to where it leaves float32's normal range (x ≈ −13),
// 1.2e-7·max(|x|, 1) absolute everywhere (the definition's 1 + erf loses all digits by x ≈ −5). a is clipped to 1e3 (Φ is 0 from a ≈ 14 on) to keep a² finite.
inline float normal_tail(float a) {
  a = std::min(a, 1e3f);
  float hi = std::bit_cast<float>(std::bit_cast<uint32_t>(a) & 0xfffff000u), lo = a - hi;
  float t = 1.0f / (1.0f + 0.35355339059327373f * a);  // z/2 = a/(2√2)
  float p = -1.26551223f + t * (1.00002368f + t * (0.37409196f + t * (0.09678418f + t * (-0.18628806f +
            t * (0.27886807f + t * (-1.13520398f + t * (1.48851587f + t * (-0.82215223f + t * 0.17087277f))))))));
  return 0.5f * t * exp_split(-0.5f * (hi * hi), p - 0.5f * (lo * (a + hi)));
}

// GELU = x·Φ(x): Φ(x) = 1 − Φ(−|x|) for x ≥ 0, Φ(−|x|) below, so the negative tail is not the
// cancellation 1 + erf(x/√2) of the definition (x·Φ(x) keeps its relative accuracy there).
// NaN → NaN, +inf → inf, −inf → −inf·0 = NaN, as 0.5·x·(1 + erf(x/√2)) gives.
inline float gelu_erf(float x) {
  float h = normal_tail(std::fabs(x));
  return x * (x >= 0.0f ? 1.0f - h : h);
}

// The tanh form: 0.5·x·(1 + tanh(u)) = x·sigmoid(2u), u = √(2/π)·(c + 0.044715·c³), c = x
// clipped to ±1e4 as the definition clips it (tanh(u) is ±1 long before): x / (1 + exp(−2u)),
// with exp_negated's clip; no cancellation for negative x. NaN → NaN, +inf → inf, −inf →
// −inf/inf = NaN, as the definition's 0.5·x·(1 + tanh(u)).
inline float gelu_tanh(float x) {
  float c = std::min(std::max(x, -1e4f), 1e4f);
  float u = 0.7978845608028654f * (c + 0.044715f * c * c * c);
  return x / (1.0f + exp_negated(2.0f * u));
}

// The erf form's loop, with its multiply-adds as FMAs where the CPU has them (the build turns
// contraction off for silu's exact rounding; here it only removes roundings: the fit's error is
// measured with and without).
__attribute__((optimize("fp-contract=fast"))) void gelu_erf_run(const float* src, float* dst, size_t n) {
  for (size_t k = 0; k < n; ++k) dst[k] = gelu_erf(src[k]);
}

class Gelu : public CpuPrimitive {
 public:
  Gelu(mx::Stream s, bool tanh) : CpuPrimitive(s), tanh_(tanh) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    auto& x = inputs[0];
    auto& out = outputs[0];
    auto& encoder = encoder_in_place(inputs, out);
    encoder.dispatch([src = x.data<float>(), dst = out.data<float>(), n = x.size(), tanh = tanh_] {
      parallel_for(n, kGrain, [&](size_t lo, size_t hi) {
        if (tanh) {
          for (size_t k = lo; k < hi; ++k) dst[k] = gelu_tanh(src[k]);
        } else {
          gelu_erf_run(src + lo, dst + lo, hi - lo);
        }
      });
    });
  }

  // The derivative of the definition, in MLX ops: erf form Φ(x) + x·φ(x), Φ = ½(1 + erf(x/√2)),
  // φ = exp(−x²/2)/√(2π); tanh form ½(1 + T) + ½x·(1 − T²)·√(2/π)·(1 + 3·0.044715·c²), T =
  // tanh(u), c the clipped x. NaN at ±inf (inf·0), as autodiff of the definition gives.
  std::vector<mx::array> vjp(const std::vector<mx::array>& primals, const std::vector<mx::array>& cotangents,
                             const std::vector<int>&, const std::vector<mx::array>&) override {
    auto s = stream();
    auto& x = primals[0];
    auto half = mx::array(0.5f), one = mx::array(1.0f);
    mx::array slope = x;
    if (tanh_) {
      auto c = mx::clip(x, mx::array(-1e4f), mx::array(1e4f), s);
      auto c2 = mx::multiply(c, c, s);
      auto u = mx::multiply(mx::array(0.7978845608028654f),
                            mx::add(c, mx::multiply(mx::multiply(mx::array(0.044715f), c2, s), c, s), s), s);
      auto t = mx::tanh(u, s);
      auto du = mx::multiply(mx::array(0.7978845608028654f),
                             mx::add(one, mx::multiply(mx::array(3.0f * 0.044715f), c2, s), s), s);
      auto sech2 = mx::subtract(one, mx::multiply(t, t, s), s);
      slope = mx::add(mx::multiply(half, mx::add(one, t, s), s),
                      mx::multiply(mx::multiply(mx::multiply(half, x, s), sech2, s), du, s), s);
    } else {
      auto cdf = mx::multiply(half, mx::add(one, mx::erf(mx::multiply(x, mx::array(0.70710678118654752f), s), s), s), s);
      auto pdf = mx::multiply(mx::array(0.3989422804014327f),
                              mx::exp(mx::multiply(mx::array(-0.5f), mx::multiply(x, x, s), s), s), s);
      slope = mx::add(cdf, mx::multiply(x, pdf, s), s);
    }
    return {mx::multiply(cotangents[0], slope, s)};
  }

  const char* name() const override {
    return "MlxnetGelu";
  }
  bool is_equivalent(const mx::Primitive& other) const override {
    return tanh_ == static_cast<const Gelu&>(other).tanh_;
  }

 private:
  bool tanh_;
};

// Row reductions in 16 independent lanes (one or two vector registers), so that they vectorise
// without reassociating float adds behind the compiler's back (no -ffast-math here).
template <typename Op>
float reduce_row(const float* s, size_t c, float init, Op op) {
  float acc[16];
  for (float& a : acc) a = init;
  size_t k = 0;
  for (; k + 16 <= c; k += 16) {
    for (int j = 0; j < 16; ++j) acc[j] = op(acc[j], s[k + j]);
  }
  for (int j = 0; k < c; ++k, ++j) acc[j] = op(acc[j], s[k]);
  for (int width = 8; width; width /= 2) {
    for (int j = 0; j < width; ++j) acc[j] = op(acc[j], acc[j + width]);
  }
  return acc[0];
}

// Softmax over the last axis, row by row: m = the row's max, e = exp(max(x − m, −kZLimit)) (the
// reference's clip: a masked −inf score gives 0, and huge differences stay finite in r), then
// e / Σe. Subtracting the max keeps every e in [0, 1]: no overflow for any finite input. A row
// holding NaN, +inf, or only −inf is NaN throughout, as the definition's is (x − m is NaN there).
class Softmax : public CpuPrimitive {
 public:
  using CpuPrimitive::CpuPrimitive;

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    auto& x = inputs[0];
    auto& out = outputs[0];
    auto& encoder = encoder_in_place(inputs, out);
    size_t c = x.shape(-1), rows = c ? x.size() / c : 0;
    encoder.dispatch([src = x.data<float>(), dst = out.data<float>(), c, rows] {
      parallel_for(rows, std::max<size_t>(1, kGrain / std::max<size_t>(c, 1)), [&](size_t lo, size_t hi) {
        for (size_t row = lo; row < hi; ++row) {
          const float* s = src + row * c;
          float* d = dst + row * c;
          // std::max keeps a NaN that reached the accumulator; a NaN it skips still makes x − m
          // NaN below, so the row is NaN either way.
          float m = reduce_row(s, c, -std::numeric_limits<float>::infinity(),
                               [](float a, float b) { return std::max(a, b); });
          for (size_t k = 0; k < c; ++k) d[k] = exp_poly(std::max(s[k] - m, -kZLimit));
          float sum = reduce_row(d, c, 0.0f, [](float a, float b) { return a + b; });
          for (size_t k = 0; k < c; ++k) d[k] = d[k] / sum;
        }
      });
    });
  }

  // softmax' applied to g: y·(g − Σ g·y) over the row, from the output (no exp again).
  std::vector<mx::array> vjp(const std::vector<mx::array>&, const std::vector<mx::array>& cotangents,
                             const std::vector<int>&, const std::vector<mx::array>& outputs) override {
    auto s = stream();
    auto& y = outputs[0];
    auto& g = cotangents[0];
    auto dot = mx::sum(mx::multiply(g, y, s), std::vector<int>{-1}, true, s);
    return {mx::multiply(y, mx::subtract(g, dot, s), s)};
  }

  const char* name() const override {
    return "MlxnetSoftmax";
  }
  bool is_equivalent(const mx::Primitive&) const override {
    return true;
  }
};

// The gradient of a primitive as MLX's autodiff of its definition written in MLX ops, for the
// inputs asked for.
std::vector<mx::array> definition_vjp(const std::function<std::vector<mx::array>(const std::vector<mx::array>&)>& definition,
                                      const std::vector<mx::array>& primals, const std::vector<mx::array>& cotangents,
                                      const std::vector<int>& argnums) {
  auto grads = mx::vjp(definition, primals, cotangents).second;
  std::vector<mx::array> picked;
  for (int i : argnums) picked.push_back(grads[i]);
  return picked;
}

// Layer norm over the last axis, float32, as the definition (mlxnet/ops/norm/definition.py):
// mean, then the mean of the squared deviations (two passes over the row, so no cancellation),
// y = (x − mean)·(1/√(var + eps)), times the weight, plus the bias, each rounded in that order.
// One row per step on every core; MLX's CPU layer norm runs on one.
class LayerNorm : public CpuPrimitive {
 public:
  LayerNorm(mx::Stream s, float eps, bool has_weight, bool has_bias)
      : CpuPrimitive(s), eps_(eps), has_weight_(has_weight), has_bias_(has_bias) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    auto& x = inputs[0];
    auto& out = outputs[0];
    auto& encoder = encoder_in_place(inputs, out);
    const float* w = has_weight_ ? inputs[1].data<float>() : nullptr;
    const float* b = has_bias_ ? inputs[has_weight_ ? 2 : 1].data<float>() : nullptr;
    size_t c = x.shape(-1), rows = c ? x.size() / c : 0;
    encoder.dispatch([src = x.data<float>(), dst = out.data<float>(), w, b, c, rows, eps = eps_] {
      parallel_for(rows, std::max<size_t>(1, kGrain / std::max<size_t>(c, 1)), [&](size_t lo, size_t hi) {
        for (size_t row = lo; row < hi; ++row) {
          const float* s = src + row * c;
          float* d = dst + row * c;
          float mean = reduce_row(s, c, 0.0f, [](float a, float v) { return a + v; }) / float(c);
          for (size_t k = 0; k < c; ++k) d[k] = s[k] - mean;
          float acc[16] = {};
          size_t k = 0;
          for (; k + 16 <= c; k += 16) {
            for (int j = 0; j < 16; ++j) acc[j] += d[k + j] * d[k + j];
          }
          for (int j = 0; k < c; ++k, ++j) acc[j] += d[k] * d[k];
          float var = reduce_row(acc, 16, 0.0f, [](float a, float v) { return a + v; }) / float(c);
          float inv = 1.0f / std::sqrt(var + eps);
          for (size_t k = 0; k < c; ++k) d[k] = d[k] * inv;
          if (w) {
            for (size_t k = 0; k < c; ++k) d[k] = d[k] * w[k];
          }
          if (b) {
            for (size_t k = 0; k < c; ++k) d[k] = d[k] + b[k];
          }
        }
      });
    });
  }

  // The definition's gradient, by MLX's autodiff of the definition written in MLX ops.
  std::vector<mx::array> vjp(const std::vector<mx::array>& primals, const std::vector<mx::array>& cotangents,
                             const std::vector<int>& argnums, const std::vector<mx::array>&) override {
    auto s = stream();
    float eps = eps_;
    bool has_w = has_weight_, has_b = has_bias_;
    auto definition = [s, eps, has_w, has_b](const std::vector<mx::array>& a) {
      auto mean = mx::mean(a[0], std::vector<int>{-1}, true, s);
      auto centred = mx::subtract(a[0], mean, s);
      auto var = mx::mean(mx::square(centred, s), std::vector<int>{-1}, true, s);
      auto y = mx::multiply(centred, mx::rsqrt(mx::add(var, mx::array(eps), s), s), s);
      if (has_w) y = mx::multiply(y, a[1], s);
      if (has_b) y = mx::add(y, a[has_w ? 2 : 1], s);
      return std::vector<mx::array>{y};
    };
    return definition_vjp(definition, primals, cotangents, argnums);
  }

  const char* name() const override {
    return "MlxnetLayerNorm";
  }
  bool is_equivalent(const mx::Primitive& other) const override {
    auto& o = static_cast<const LayerNorm&>(other);
    return eps_ == o.eps_ && has_weight_ == o.has_weight_ && has_bias_ == o.has_bias_;
  }

 private:
  float eps_;
  bool has_weight_, has_bias_;
};

// Element strides of a matrix's rows and columns.
struct Strides2 {
  int64_t row, col;
};

// Scaled dot-product attention without a bias, float32: out_i = Σ_j softmax_j(scale·q_i·k_j)·v_j
// (the definition, mlxnet/ops/attention/definition.py: q scaled first, the softmax as the
// Softmax primitive's, weights normalised before the weighted sum). Written for many queries
// against a few keys (SAM's two-way transformer: 4096 image positions against 7 tokens, head
// width 16), where MLX runs one tiny BLAS product per head and separate passes for the
// softmax. Sixteen query rows at a time, one per vector lane: their scores against every key,
// the softmax across keys and the weighted sum, in registers and a small buffer. Tasks are
// blocks of rows of one leading index (head, batch); each packs that index's keys and values
// once. Inputs keep their strides (a head split is a transposed view, a shared key set a
// broadcast): no copies.
class Attention : public CpuPrimitive {
 public:
  Attention(mx::Stream s, float scale) : CpuPrimitive(s), scale_(scale) {}

  static constexpr size_t kLanes = 16;

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    auto& q = inputs[0];
    auto& k = inputs[1];
    auto& v = inputs[2];
    auto& out = outputs[0];
    auto& encoder = encoder_for(inputs, out);
    int nd = q.ndim();
    size_t lq = q.shape(-2), lk = k.shape(-2), dq = q.shape(-1), dv = v.shape(-1);
    size_t lead = lq ? q.size() / (lq * dq) : 0;
    // Element offsets of every leading index in q, k and v (broadcast axes have stride 0).
    std::vector<int64_t> offsets(3 * lead, 0);
    for (size_t i = 0; i < lead; ++i) {
      size_t rest = i;
      for (int axis = nd - 3; axis >= 0; --axis) {
        int64_t idx = int64_t(rest % q.shape(axis));
        rest /= q.shape(axis);
        offsets[3 * i] += idx * q.strides()[axis];
        offsets[3 * i + 1] += idx * k.strides()[axis];
        offsets[3 * i + 2] += idx * v.strides()[axis];
      }
    }
    Strides2 qs{q.strides()[nd - 2], q.strides()[nd - 1]}, ks{k.strides()[nd - 2], k.strides()[nd - 1]},
        vs{v.strides()[nd - 2], v.strides()[nd - 1]};
    // Rows per task: a multiple of the lanes, enough that packing the keys and values is a small
    // part of the task.
    size_t per_row = lk * (dq + dv);
    size_t want = std::max<size_t>(4 * kLanes, (kGrain * 4 + per_row - 1) / std::max<size_t>(per_row, 1));
    size_t block = std::min((lq + kLanes - 1) / kLanes, (want + kLanes - 1) / kLanes) * kLanes;
    size_t blocks = (lq + block - 1) / block;
    encoder.dispatch([qp = q.data<float>(), kp = k.data<float>(), vp = v.data<float>(), dst = out.data<float>(),
                      offsets = std::move(offsets), qs, ks, vs, lq, lk, dq, dv, block, blocks, lead,
                      scale = scale_] {
      parallel_for(lead * blocks, 1, [&](size_t lo, size_t hi) {
        // keys (lk, dq) and values (lk, dv) packed; the lanes' queries (dq, 16) and scores (lk, 16).
        std::vector<float> kpk(lk * dq), vpk(lk * dv), qt(dq * kLanes), sc(lk * kLanes);
        size_t packed = size_t(-1);
        for (size_t task = lo; task < hi; ++task) {
          size_t li = task / blocks, r0 = (task % blocks) * block, r1 = std::min(lq, r0 + block);
          if (li != packed) {
            const float* k0 = kp + offsets[3 * li + 1];
            const float* v0 = vp + offsets[3 * li + 2];
            for (size_t j = 0; j < lk; ++j) {
              for (size_t d = 0; d < dq; ++d) kpk[j * dq + d] = k0[int64_t(j) * ks.row + int64_t(d) * ks.col];
              for (size_t d = 0; d < dv; ++d) vpk[j * dv + d] = v0[int64_t(j) * vs.row + int64_t(d) * vs.col];
            }
            packed = li;
          }
          const float* q0 = qp + offsets[3 * li];
          for (size_t r = r0; r < r1; r += kLanes) {
            size_t lanes = std::min(kLanes, r1 - r);
            for (size_t d = 0; d < dq; ++d) {
              float* qd = qt.data() + d * kLanes;
              for (size_t l = 0; l < kLanes; ++l) {
                qd[l] = l < lanes ? q0[int64_t(r + l) * qs.row + int64_t(d) * qs.col] * scale : 0.0f;
              }
            }
            float m[kLanes], sum[kLanes];
            std::fill(m, m + kLanes, -std::numeric_limits<float>::infinity());
            for (size_t j = 0; j < lk; ++j) {
              float s[kLanes] = {};
              const float* kj = kpk.data() + j * dq;
              for (size_t d = 0; d < dq; ++d) {
                const float* qd = qt.data() + d * kLanes;
                for (size_t l = 0; l < kLanes; ++l) s[l] += qd[l] * kj[d];
              }
              for (size_t l = 0; l < kLanes; ++l) {
                sc[j * kLanes + l] = s[l];
                m[l] = std::max(m[l], s[l]);
              }
            }
            std::fill(sum, sum + kLanes, 0.0f);
            for (size_t j = 0; j < lk; ++j) {
              float* e = sc.data() + j * kLanes;
              for (size_t l = 0; l < kLanes; ++l) {
                e[l] = exp_poly(std::max(e[l] - m[l], -kZLimit));
                sum[l] += e[l];
              }
            }
            for (size_t l = 0; l < lanes; ++l) {
              float* o = dst + (li * lq + r + l) * dv;
              std::fill(o, o + dv, 0.0f);
              for (size_t j = 0; j < lk; ++j) {
                const float p = sc[j * kLanes + l] / sum[l];
                const float* vj = vpk.data() + j * dv;
                for (size_t d = 0; d < dv; ++d) o[d] += p * vj[d];
              }
            }
          }
        }
      });
    });
  }

  // The definition's gradient, by MLX's autodiff of the definition written in MLX ops.
  std::vector<mx::array> vjp(const std::vector<mx::array>& primals, const std::vector<mx::array>& cotangents,
                             const std::vector<int>& argnums, const std::vector<mx::array>&) override {
    auto s = stream();
    float scale = scale_;
    auto definition = [s, scale](const std::vector<mx::array>& a) {
      auto scores = mx::matmul(mx::multiply(a[0], mx::array(scale), s), mx::swapaxes(a[1], -1, -2, s), s);
      return std::vector<mx::array>{mx::matmul(mx::softmax(scores, std::vector<int>{-1}, true, s), a[2], s)};
    };
    return definition_vjp(definition, primals, cotangents, argnums);
  }

  const char* name() const override {
    return "MlxnetAttention";
  }
  bool is_equivalent(const mx::Primitive& other) const override {
    return scale_ == static_cast<const Attention&>(other).scale_;
  }

 private:
  float scale_;
};

// Direct convolution: float32, NHWC input, OHWI weight, groups 1, output channels a multiple of
// 16. A register tile of R output pixels × V·16 output channels is accumulated over the kernel
// taps and input channels (per step: one broadcast input value per pixel × V weight vectors),
// then stored with the bias added and, optionally, SiLU applied while it is still in L1. At
// YOLOv8n's channel counts (16–80) a GEMM over an im2col matrix runs well below peak, and the
// matrix itself is a pass over memory; this builds none. The weight is packed per call as
// [C_out/16][KH][KW][C][16] (a few dozen KiB at these sizes).
// A block of 16 output channels is one 512-bit vector with AVX-512 and two 256-bit vectors
// elsewhere: GCC lowers a 64-byte vector type without AVX-512 through memory (every
// multiply-add a round trip through the stack, ten times slower), so the tile is written in the
// machine's own width. ``vnu``: the same vector at any float's alignment (loads and stores).
#if defined(__AVX512F__)
typedef float vn __attribute__((vector_size(64)));
constexpr int kSub = 1;
#else
typedef float vn __attribute__((vector_size(32)));
constexpr int kSub = 2;
#endif
typedef float vnu __attribute__((vector_size(sizeof(vn)), aligned(4)));
constexpr int kSubLanes = 16 / kSub;

// The input may come in channel parts (the concatenation a conv reads, never built).
constexpr int kMaxParts = 8;

struct ConvShape {
  int kw, c, parts;                    // kernel width, input channels, channel parts
  int part_c[kMaxParts];               // each part's channels (they sum to c)
  ptrdiff_t pixel[kMaxParts], col[kMaxParts], row[kMaxParts];  // each part's offsets of the next
                                       // output pixel, kernel column and kernel row
  size_t block;                        // packed-weight offset of the next 16 output channels
};

// The build turns contraction off (for silu's exact rounding); the tile's multiply-adds should
// be FMAs.
template <int R, int V>
__attribute__((optimize("fp-contract=fast"))) void conv_tile(const float* const* x, const float* w, const ConvShape& s,
                                                             int i0, int i1, int j0, int j1, const float* bias,
                                                             float* out, size_t out_pixel) {
  constexpr int Q = V * kSub;  // machine vectors across the tile's V·16 channels
  vn acc[R][Q];
  for (int q = 0; q < Q; ++q) {
    vn b = bias ? *reinterpret_cast<const vnu*>(bias + kSubLanes * q) : vn{};
    for (int r = 0; r < R; ++r) acc[r][q] = b;
  }
  for (int i = i0; i < i1; ++i) {
    for (int j = j0; j < j1; ++j) {
      const float* wp = w + size_t(i * s.kw + j) * s.c * 16;
      for (int p = 0; p < s.parts; ++p) {
        const float* xp = x[p] + i * s.row[p] + j * s.col[p];
        ptrdiff_t pixel = s.pixel[p];
        for (int k = 0; k < s.part_c[p]; ++k, wp += 16) {
          vn wv[Q];
          for (int v = 0; v < V; ++v) {
            for (int u = 0; u < kSub; ++u) wv[v * kSub + u] = *reinterpret_cast<const vnu*>(wp + v * s.block + u * kSubLanes);
          }
          for (int r = 0; r < R; ++r) {
            float xs = xp[r * pixel + k];
            for (int q = 0; q < Q; ++q) acc[r][q] += xs * wv[q];
          }
        }
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int q = 0; q < Q; ++q) *reinterpret_cast<vnu*>(out + r * out_pixel + kSubLanes * q) = acc[r][q];
  }
}

template <int V, size_t... R>
constexpr auto tile_table(std::index_sequence<R...>) {
  using Fn = void (*)(const float* const*, const float*, const ConvShape&, int, int, int, int, const float*, float*,
                      size_t);
  return std::array<Fn, sizeof...(R)>{&conv_tile<int(R) + 1, V>...};
}

// Pixels per tile for V = 1, 2, 3, 4 blocks of 16 output channels, and the most blocks a tile
// takes. AVX-512 (32 registers of 16 floats; measured on an AVX-512 EPYC): up to 4. AVX2 (16
// registers of 8 floats): one block × 6 pixels, 12 accumulators and 2 weight registers (on a
// 2-core AVX2 EPYC, 110–146 GFLOP/s over YOLO's 3×3 shapes; 2 blocks × 3 pixels measured
// 0–17% slower, 5 pixels the same).
#if defined(__AVX512F__)
constexpr int kTile[] = {0, 8, 6, 8, 6};
constexpr int kMaxVectors = 4;
#else
constexpr int kTile[] = {0, 6, 1, 1, 1};
constexpr int kMaxVectors = 1;
#endif

// Packed weight bytes a group of output-channel blocks may take (DirectConv's task order): about
// half of a small L2 (Intel's client cores have 256 KiB-2 MiB, AMD's 512 KiB-1 MiB).
constexpr size_t kGroupWeightBytes = 384 * 1024;

void silu_in_place(float* d, size_t n) {
  for (size_t k = 0; k < n; ++k) d[k] = silu(d[k]);
}

class DirectConv : public CpuPrimitive {
 public:
  DirectConv(mx::Stream s, Geometry g, int parts, bool has_bias, bool act)
      : CpuPrimitive(s), g_(g), parts_(parts), has_bias_(has_bias), act_(act) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    auto& x = inputs[0];
    auto& w = inputs[parts_];
    auto& out = outputs[0];
    auto& encoder = encoder_for(inputs, out);
    int c_out = w.shape(0), c = w.shape(3);
    auto packed = std::make_shared<std::vector<float>>(w.size());
    int h = x.shape(1), wd = x.shape(2);
    ConvShape s{g_.kw, c, parts_, {}, {}, {}, {}, size_t(g_.kh) * g_.kw * c * 16};
    std::array<const float*, kMaxParts> src{};
    for (int p = 0; p < parts_; ++p) {
      int cp = s.part_c[p] = inputs[p].shape(3);
      s.pixel[p] = ptrdiff_t(g_.sw) * cp, s.col[p] = ptrdiff_t(g_.dw) * cp, s.row[p] = ptrdiff_t(g_.dh) * wd * cp;
      src[p] = inputs[p].data<float>();
    }
    encoder.dispatch([src, s, wsrc = w.data<float>(), bias = has_bias_ ? inputs[parts_ + 1].data<float>() : nullptr,
                      dst = out.data<float>(), packed, g = g_, act = act_, batch = x.shape(0), h, wd,
                      oh = out.shape(1), ow = out.shape(2), c, c_out] {
      size_t taps = size_t(g.kh) * g.kw * c;
      float* wp = packed->data();
      parallel_for(c_out, 16, [&](size_t first, size_t last) {
        for (size_t o = first; o < last; ++o) {
          for (size_t t = 0; t < taps; ++t) wp[((o / 16) * taps + t) * 16 + o % 16] = wsrc[o * taps + t];
        }
      });
      static constexpr auto tiles1 = tile_table<1>(std::make_index_sequence<kTile[1]>());
      static constexpr auto tiles2 = tile_table<2>(std::make_index_sequence<kTile[2]>());
      static constexpr auto tiles3 = tile_table<3>(std::make_index_sequence<kTile[3]>());
      static constexpr auto tiles4 = tile_table<4>(std::make_index_sequence<kTile[4]>());
      static constexpr decltype(tiles1)::const_pointer tiles[] = {nullptr, tiles1.data(), tiles2.data(),
                                                                  tiles3.data(), tiles4.data()};
      // Output columns whose taps all fall inside the row, in [lo, hi).
      int lo = std::min(ow, (g.pw + g.sw - 1) / g.sw);
      int hi = std::max(lo, std::min(ow, (wd - 1 + g.pw - (g.kw - 1) * g.dw) / g.sw + 1));
      // Blocks of 64, 48, 32 or 16 output channels, a 16-channel block only where nothing else
      // fits (its tile reads a broadcast per multiply-add, so 80 channels run as 48 + 32, not
      // 64 + 16). The tasks run block by block (each block's packed weight stays in cache
      // over the rows), a block's rows split between the cores.
      std::vector<std::pair<int, int>> blocks;  // (first channel, vectors)
      for (int co = 0; co < c_out; co += 16 * blocks.back().second) {
        int left = (c_out - co) / 16;
        blocks.emplace_back(co, kMaxVectors == 4 && (left == 5 || left == 3) ? 3 : std::min(left, kMaxVectors));
      }
      // The tasks go group by group of blocks whose packed weights fit in L2 together, and
      // within a group row by row, every block of a row in turn: an input row is then read
      // from memory once per group and from cache for the group's other blocks (block by
      // block, a large input was read from memory once per block: 1.5x the time at 160²×64).
      size_t rows = size_t(batch) * oh, nblocks = blocks.size();
      size_t group = std::max<size_t>(1, kGroupWeightBytes / (taps * 16 * kMaxVectors * sizeof(float)));
      parallel_for(nblocks * rows, 1, [&](size_t first, size_t last) {
        for (size_t task = first; task < last; ++task) {
          size_t gi = task / (group * rows), rem = task % (group * rows);
          size_t members = std::min(group, nblocks - gi * group);
          auto [co, v] = blocks[gi * group + rem % members];
          size_t row = rem / members;
          int b = row / oh, oy = row % oh, iy = oy * g.sh - g.ph;
          int i0 = std::max(0, (-iy + g.dh - 1) / g.dh), i1 = std::max(i0, std::min(g.kh, (h - 1 - iy) / g.dh + 1));
          float* orow = dst + row * ow * c_out + co;
          const float* wblock = wp + (co / 16) * taps * 16;
          const float* bblock = bias ? bias + co : nullptr;
          auto run = [&](int ox, int n, int j0, int j1) {
            auto tile = tiles[v][n - 1];
            std::array<const float*, kMaxParts> at;
            for (int p = 0; p < s.parts; ++p) {
              at[p] = src[p] + (size_t(b) * h * wd + ptrdiff_t(iy) * wd + ox * g.sw - g.pw) * s.part_c[p];
            }
            tile(at.data(), wblock, s, i0, i1, j0, j1, bblock, orow + size_t(ox) * c_out, c_out);
          };
          auto edge = [&](int ox) {  // one pixel, its taps cut to the row
            int ix = ox * g.sw - g.pw;
            int j0 = std::max(0, (-ix + g.dw - 1) / g.dw), j1 = std::min(g.kw, (wd - 1 - ix) / g.dw + 1);
            run(ox, 1, j0, std::max(j0, j1));
          };
          int step = kTile[v];
          for (int ox = 0; ox < lo; ++ox) edge(ox);
          for (int ox = lo; ox < hi; ox += step) run(ox, std::min(step, hi - ox), 0, g.kw);
          for (int ox = hi; ox < ow; ++ox) edge(ox);
          if (act) {
            for (int ox = 0; ox < ow; ++ox) silu_in_place(orow + size_t(ox) * c_out, 16 * v);
          }
        }
      });
    });
  }

  // The gradients of silu(conv(x, w) + bias) (or of conv + bias), through MLX's own ops.
  std::vector<mx::array> vjp(const std::vector<mx::array>& primals, const std::vector<mx::array>& cotangents,
                             const std::vector<int>& argnums, const std::vector<mx::array>&) override {
    auto s = stream();
    auto g = g_;
    int parts = parts_;
    bool has_bias = has_bias_, act = act_;
    auto f = [g, parts, has_bias, act, s](const std::vector<mx::array>& in) {
      auto x = parts == 1 ? in[0] : mx::concatenate(std::vector<mx::array>(in.begin(), in.begin() + parts), -1, s);
      auto y = mx::conv_general(x, in[parts], {g.sh, g.sw}, {g.ph, g.pw}, {g.ph, g.pw}, {g.dh, g.dw}, {1, 1}, 1, false, s);
      if (has_bias) y = mx::add(y, in[parts + 1], s);
      if (act) y = mx::multiply(y, mx::sigmoid(y, s), s);
      return std::vector<mx::array>{y};
    };
    auto grads = mx::vjp(f, primals, cotangents).second;
    std::vector<mx::array> picked;
    for (int arg : argnums) picked.push_back(grads[arg]);
    return picked;
  }

  const char* name() const override {
    return "MlxnetDirectConv";
  }
  bool is_equivalent(const mx::Primitive& other) const override {
    auto& o = static_cast<const DirectConv&>(other);
    return g_ == o.g_ && parts_ == o.parts_ && has_bias_ == o.has_bias_ && act_ == o.act_;
  }

 private:
  Geometry g_;
  int parts_;
  bool has_bias_, act_;
};

// Per-channel sums over the rows of an (rows, C) map, in fixed blocks of rows summed in block
// order: the result does not depend on the number of cores. add(row, acc) adds one row.
constexpr size_t kStatRows = 64;

template <typename AddRow>
void channel_sums(size_t rows, size_t c, size_t sums, float* out, AddRow&& add) {
  size_t blocks = (rows + kStatRows - 1) / kStatRows;
  std::vector<float> part(blocks * sums * c, 0.0f);
  parallel_for(blocks, std::max<size_t>(1, kGrain / std::max<size_t>(kStatRows * c, 1)), [&](size_t lo, size_t hi) {
    for (size_t blk = lo; blk < hi; ++blk) {
      float* acc = part.data() + blk * sums * c;
      for (size_t row = blk * kStatRows; row < std::min(rows, (blk + 1) * kStatRows); ++row) add(row, acc);
    }
  });
  std::fill(out, out + sums * c, 0.0f);
  for (size_t blk = 0; blk < blocks; ++blk) {
    for (size_t k = 0; k < sums * c; ++k) out[k] += part[blk * sums * c + k];
  }
}

// The derivative of SiLU at z, applied to g: g·s·(1 + z·(1 − s)), s = sigmoid(z).
inline float silu_grad(float z, float g) {
  float s = sigmoid(z);
  return g * s * (1.0f + z * (1.0f - s));
}

// Training-mode BatchNorm over the rows of (..., C), float32, as the definition
// (mlxnet/ops/norm/definition.py): the mean, the biased variance from a second pass over the
// deviations, y = (x − mean)·(1/√(var + eps))·w + b, then SiLU if asked. Outputs y, mean, var.
// MLX runs the definition as a dozen passes, its exp one scalar at a time; this is three
// passes on every core, and its gradient (BatchNormTrainGrad) two more.
// What the BatchNorm primitives share: their epsilon and whether a SiLU follows.
class BatchNormPrimitive : public CpuPrimitive {
 public:
  BatchNormPrimitive(mx::Stream s, float eps, bool silu) : CpuPrimitive(s), eps_(eps), silu_(silu) {}
  bool is_equivalent(const mx::Primitive& other) const override {
    auto& o = static_cast<const BatchNormPrimitive&>(other);
    return eps_ == o.eps_ && silu_ == o.silu_;
  }

 protected:
  float eps_;
  bool silu_;
};

class BatchNormTrain : public BatchNormPrimitive {
 public:
  using BatchNormPrimitive::BatchNormPrimitive;

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    auto& encoder = encoder_for_all(inputs, outputs);
    auto& x = inputs[0];
    size_t c = x.shape(-1), rows = c ? x.size() / c : 0;
    encoder.dispatch([src = x.data<float>(), w = inputs[1].data<float>(), b = inputs[2].data<float>(),
                      y = outputs[0].data<float>(), mean = outputs[1].data<float>(),
                      var = outputs[2].data<float>(), c, rows, eps = eps_, act = silu_] {
      float n = float(rows);
      channel_sums(rows, c, 1, mean, [&](size_t row, float* acc) {
        const float* s = src + row * c;
        for (size_t k = 0; k < c; ++k) acc[k] += s[k];
      });
      for (size_t k = 0; k < c; ++k) mean[k] /= n;
      channel_sums(rows, c, 1, var, [&](size_t row, float* acc) {
        const float* s = src + row * c;
        for (size_t k = 0; k < c; ++k) acc[k] += (s[k] - mean[k]) * (s[k] - mean[k]);
      });
      std::vector<float> inv(c);
      for (size_t k = 0; k < c; ++k) {
        var[k] /= n;
        inv[k] = 1.0f / std::sqrt(var[k] + eps);
      }
      parallel_for(rows, std::max<size_t>(1, kGrain / std::max<size_t>(c, 1)), [&](size_t lo, size_t hi) {
        for (size_t row = lo; row < hi; ++row) {
          const float* s = src + row * c;
          float* d = y + row * c;
          for (size_t k = 0; k < c; ++k) d[k] = (s[k] - mean[k]) * inv[k] * w[k] + b[k];
          if (act) {
            for (size_t k = 0; k < c; ++k) d[k] = silu(d[k]);
          }
        }
      });
    });
  }

  std::vector<mx::array> vjp(const std::vector<mx::array>& primals, const std::vector<mx::array>& cotangents,
                             const std::vector<int>& argnums, const std::vector<mx::array>& outputs) override;

  const char* name() const override {
    return "MlxnetBatchNormTrain";
  }
};

// BatchNormTrain's gradient from (x, w, b, mean, var, dy, d_mean, d_var): with dz the
// cotangent through the SiLU (recomputed from x, not kept) and x̂ = (x − mean)/√(var + eps),
// db = Σdz, dw = Σdz·x̂ over the rows, and dx = (w/√(var + eps))·(dz − db/n − x̂·dw/n) plus
// the statistics' own cotangents (d_mean/n + (x − mean)·2·d_var/n). Outputs dx, dw, db.
class BatchNormTrainGrad : public BatchNormPrimitive {
 public:
  using BatchNormPrimitive::BatchNormPrimitive;

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    auto& encoder = encoder_for_all(inputs, outputs);
    auto& x = inputs[0];
    size_t c = x.shape(-1), rows = c ? x.size() / c : 0;
    encoder.dispatch([src = x.data<float>(), w = inputs[1].data<float>(), b = inputs[2].data<float>(),
                      mean = inputs[3].data<float>(), var = inputs[4].data<float>(), dy = inputs[5].data<float>(),
                      d_mean = inputs[6].data<float>(), d_var = inputs[7].data<float>(),
                      dx = outputs[0].data<float>(), dw = outputs[1].data<float>(), db = outputs[2].data<float>(),
                      c, rows, eps = eps_, act = silu_] {
      float n = float(rows);
      std::vector<float> inv(c), scale(c), shift(c), extra(c);
      for (size_t k = 0; k < c; ++k) inv[k] = 1.0f / std::sqrt(var[k] + eps);
      // One row's x̂ and dz into the caller's buffers (plain loops, so that they vectorise).
      auto row_terms = [&](size_t row, float* __restrict xhat, float* __restrict dz) {
        const float* __restrict s = src + row * c;
        const float* __restrict g = dy + row * c;
        for (size_t k = 0; k < c; ++k) xhat[k] = (s[k] - mean[k]) * inv[k];
        if (act) {
          for (size_t k = 0; k < c; ++k) dz[k] = silu_grad(xhat[k] * w[k] + b[k], g[k]);
        } else {
          for (size_t k = 0; k < c; ++k) dz[k] = g[k];
        }
      };
      std::vector<float> sums(2 * c);
      channel_sums(rows, c, 2, sums.data(), [&](size_t row, float* acc) {
        thread_local std::vector<float> xhat, dz;
        xhat.resize(c), dz.resize(c);
        row_terms(row, xhat.data(), dz.data());
        float* __restrict a = acc;
        for (size_t k = 0; k < c; ++k) a[k] += dz[k];
        for (size_t k = 0; k < c; ++k) a[c + k] += dz[k] * xhat[k];
      });
      for (size_t k = 0; k < c; ++k) {
        db[k] = sums[k];
        dw[k] = sums[c + k];
        scale[k] = w[k] * inv[k];
        shift[k] = d_mean[k] / n;
        extra[k] = 2.0f * d_var[k] / n;
      }
      parallel_for(rows, std::max<size_t>(1, kGrain / std::max<size_t>(c, 1)), [&](size_t lo, size_t hi) {
        std::vector<float> xhat(c), dz(c);
        for (size_t row = lo; row < hi; ++row) {
          row_terms(row, xhat.data(), dz.data());
          const float* __restrict s = src + row * c;
          float* __restrict d = dx + row * c;
          for (size_t k = 0; k < c; ++k) {
            d[k] = scale[k] * (dz[k] - db[k] / n - xhat[k] * (dw[k] / n)) + shift[k] + (s[k] - mean[k]) * extra[k];
          }
        }
      });
    });
  }

  const char* name() const override {
    return "MlxnetBatchNormTrainGrad";
  }
};

std::vector<mx::array> BatchNormTrain::vjp(const std::vector<mx::array>& primals,
                                           const std::vector<mx::array>& cotangents, const std::vector<int>& argnums,
                                           const std::vector<mx::array>& outputs) {
  auto s = stream();
  auto c = primals[0].shape(-1);
  std::vector<mx::array> inputs{primals[0], primals[1], primals[2], outputs[1], outputs[2]};
  for (auto& g : cotangents) inputs.push_back(mx::contiguous(mx::astype(g, mx::float32, s), false, s));
  auto grads = mx::array::make_arrays({primals[0].shape(), {c}, {c}}, {mx::float32, mx::float32, mx::float32},
                                      std::make_shared<BatchNormTrainGrad>(s, eps_, silu_), inputs);
  std::vector<mx::array> picked;
  for (int i : argnums) picked.push_back(grads[i]);
  return picked;
}

mx::Stream cpu_stream() {
  return mx::default_stream(mx::Device::cpu);
}

}  // namespace

mx::array im2col(const mx::array& x, Pair kernel, Pair stride, Pair padding, Pair dilation) {
  auto g = geometry(std::get<0>(kernel), std::get<1>(kernel), stride, padding, dilation);
  if (x.ndim() != 4) {
    throw std::invalid_argument("im2col expects an (N, H, W, C) array");
  }
  auto [oh, ow] = checked_out_size(x, g, "im2col");
  auto s = cpu_stream();
  return mx::array({x.shape(0), oh, ow, g.kh * g.kw * x.shape(3)}, x.dtype(), std::make_shared<Im2Col>(s, g),
                   {mx::contiguous(x, false, s)});
}

mx::array bias_silu(const mx::array& y, std::optional<mx::array> bias) {
  if (y.dtype() != mx::float32 || (bias && (bias->dtype() != mx::float32 || bias->ndim() != 1 || y.ndim() < 1 ||
                                            bias->shape(0) != y.shape(-1)))) {
    throw std::invalid_argument("bias_silu expects float32 (..., C) and an optional float32 (C,) bias");
  }
  auto s = cpu_stream();
  std::vector<mx::array> inputs{mx::contiguous(y, false, s)};
  if (bias) {
    inputs.push_back(mx::contiguous(*bias, false, s));
  }
  return mx::array(y.shape(), mx::float32, std::make_shared<BiasSiLU>(s, bias.has_value()), inputs);
}


mx::array bias_act(const mx::array& y, const mx::array& bias, std::optional<mx::array> residual, bool relu) {
  if (y.dtype() != mx::float32 || y.ndim() < 1 || bias.dtype() != mx::float32 || bias.ndim() != 1 ||
      bias.shape(0) != y.shape(-1) || (residual && (residual->dtype() != mx::float32 || residual->shape() != y.shape()))) {
    throw std::invalid_argument("bias_act expects float32 (..., C), a float32 (C,) bias and an optional residual of y's shape");
  }
  auto s = cpu_stream();
  std::vector<mx::array> inputs{mx::contiguous(y, false, s), mx::contiguous(bias, false, s)};
  if (residual) {
    inputs.push_back(mx::contiguous(*residual, false, s));
  }
  return mx::array(y.shape(), mx::float32, std::make_shared<BiasAct>(s, residual.has_value(), relu), inputs);
}


mx::array sigmoid_f32(const mx::array& x) {
  if (x.dtype() != mx::float32) {
    throw std::invalid_argument("sigmoid expects a float32 array");
  }
  auto s = cpu_stream();
  return mx::array(x.shape(), mx::float32, std::make_shared<Sigmoid>(s), {mx::contiguous(x, false, s)});
}

mx::array gelu_f32(const mx::array& x, bool tanh) {
  if (x.dtype() != mx::float32) {
    throw std::invalid_argument("gelu expects a float32 array");
  }
  auto s = cpu_stream();
  return mx::array(x.shape(), mx::float32, std::make_shared<Gelu>(s, tanh), {mx::contiguous(x, false, s)});
}

mx::array softmax_last(const mx::array& x) {
  if (x.dtype() != mx::float32 || x.ndim() < 1) {
    throw std::invalid_argument("softmax expects a float32 array of at least one axis (the softmax's, the last)");
  }
  auto s = cpu_stream();
  return mx::array(x.shape(), mx::float32, std::make_shared<Softmax>(s), {mx::contiguous(x, false, s)});
}


mx::array layer_norm_f32(const mx::array& x, std::optional<mx::array> weight, std::optional<mx::array> bias,
                         float eps) {
  auto fits = [&](const std::optional<mx::array>& a) {
    return !a || (a->dtype() == mx::float32 && a->ndim() == 1 && a->shape(0) == x.shape(-1));
  };
  if (x.dtype() != mx::float32 || x.ndim() < 1 || !fits(weight) || !fits(bias)) {
    throw std::invalid_argument("layer_norm expects float32 (..., C) and optional float32 (C,) weight and bias");
  }
  auto s = cpu_stream();
  std::vector<mx::array> inputs{mx::contiguous(x, false, s)};
  for (auto& a : {weight, bias}) {
    if (a) inputs.push_back(mx::contiguous(*a, false, s));
  }
  return mx::array(x.shape(), mx::float32,
                   std::make_shared<LayerNorm>(s, eps, weight.has_value(), bias.has_value()), inputs);
}

mx::array attention_f32(const mx::array& q, const mx::array& k, const mx::array& v, float scale) {
  bool fits = q.dtype() == mx::float32 && k.dtype() == mx::float32 && v.dtype() == mx::float32 &&
              q.ndim() >= 2 && k.ndim() >= 2 && v.ndim() >= 2 && q.shape(-1) == k.shape(-1) &&
              k.shape(-2) == v.shape(-2) && q.shape(-2) > 0 && k.shape(-2) > 0;
  if (!fits) {
    throw std::invalid_argument(
        "attention expects float32 q (..., Lq, D), k (..., Lk, D), v (..., Lk, Dv) with Lq, Lk > 0 "
        "and broadcastable leading axes");
  }
  auto lead_of = [](const mx::array& a) { return mx::Shape(a.shape().begin(), a.shape().end() - 2); };
  auto lead = mx::broadcast_shapes(mx::broadcast_shapes(lead_of(q), lead_of(k)), lead_of(v));
  auto full = [&](const mx::array& a) {
    auto shape = lead;
    shape.push_back(a.shape(-2));
    shape.push_back(a.shape(-1));
    return shape;
  };
  auto s = cpu_stream();
  auto out_shape = lead;
  out_shape.push_back(q.shape(-2));
  out_shape.push_back(v.shape(-1));
  return mx::array(out_shape, mx::float32, std::make_shared<Attention>(s, scale),
                   {mx::broadcast_to(q, full(q), s), mx::broadcast_to(k, full(k), s), mx::broadcast_to(v, full(v), s)});
}

mx::array direct_conv2d(std::variant<mx::array, std::vector<mx::array>> input, const mx::array& w,
                        std::optional<mx::array> bias, Pair stride, Pair padding, Pair dilation, bool silu) {
  auto parts = std::holds_alternative<mx::array>(input) ? std::vector<mx::array>{std::get<mx::array>(input)}
                                                        : std::get<std::vector<mx::array>>(input);
  bool fits = !parts.empty() && parts.size() <= kMaxParts && w.ndim() == 4 && w.dtype() == mx::float32 &&
              w.shape(0) % 16 == 0;
  int c = 0;
  for (auto& x : parts) {
    fits = fits && x.ndim() == 4 && x.dtype() == mx::float32 && x.shape(0) == parts[0].shape(0) &&
           x.shape(1) == parts[0].shape(1) && x.shape(2) == parts[0].shape(2);
    c += x.ndim() == 4 ? x.shape(3) : 0;
  }
  if (!fits || w.shape(3) != c ||
      (bias && (bias->dtype() != mx::float32 || bias->ndim() != 1 || bias->shape(0) != w.shape(0)))) {
    throw std::invalid_argument(
        "direct_conv2d expects float32 (N, H, W, C) input (or up to 8 parts of the same N, H, W whose channels "
        "sum to C), a (C_out, KH, KW, C) weight with C_out a multiple of 16, and an optional (C_out,) bias");
  }
  auto& x = parts[0];
  auto g = geometry(w.shape(1), w.shape(2), stride, padding, dilation);
  auto [oh, ow] = checked_out_size(x, g, "direct_conv2d");
  if (g.ph >= g.kh || g.pw >= g.kw) {  // output pixels with no tap inside: not exercised, so refused
    throw std::invalid_argument("direct_conv2d: the kernel does not fit the padded input (padding >= kernel)");
  }
  auto s = cpu_stream();
  std::vector<mx::array> inputs;
  for (auto& p : parts) inputs.push_back(mx::contiguous(p, false, s));
  inputs.push_back(mx::contiguous(w, false, s));
  if (bias) inputs.push_back(mx::contiguous(*bias, false, s));
  return mx::array({x.shape(0), oh, ow, w.shape(0)}, mx::float32,
                   std::make_shared<DirectConv>(s, g, int(parts.size()), bias.has_value(), silu), inputs);
}

mx::array col2im(const mx::array& cols, Pair image, Pair kernel, Pair stride, Pair padding, Pair dilation) {
  auto g = geometry(std::get<0>(kernel), std::get<1>(kernel), stride, padding, dilation);
  if (cols.ndim() != 4 || cols.dtype() != mx::float32 || g.kh < 1 || g.kw < 1 || cols.shape(3) % (g.kh * g.kw)) {
    throw std::invalid_argument("col2im expects float32 (N, OH, OW, KH*KW*C) patches");
  }
  mx::Shape shape{cols.shape(0), std::get<0>(image), std::get<1>(image), cols.shape(3) / (g.kh * g.kw)};
  int oh = out_size(shape[1], g.kh, g.sh, g.ph, g.dh), ow = out_size(shape[2], g.kw, g.sw, g.pw, g.dw);
  if (g.sh < 1 || g.sw < 1 || g.ph < 0 || g.pw < 0 || g.dh < 1 || g.dw < 1 || oh != cols.shape(1) ||
      ow != cols.shape(2)) {
    throw std::invalid_argument("col2im: the patches' (OH, OW) do not match the image and the geometry");
  }
  return col2im_of(cols, shape, g, cpu_stream());
}

std::vector<mx::array> batch_norm_train(const mx::array& x, const mx::array& weight, const mx::array& bias, float eps,
                                        bool silu) {
  auto fits = [&](const mx::array& a) { return a.dtype() == mx::float32 && a.ndim() == 1 && a.shape(0) == x.shape(-1); };
  if (x.dtype() != mx::float32 || x.ndim() < 1 || !fits(weight) || !fits(bias)) {
    throw std::invalid_argument("batch_norm_train expects float32 (..., C) and float32 (C,) weight and bias");
  }
  auto s = cpu_stream();
  int c = x.shape(-1);
  return mx::array::make_arrays({x.shape(), {c}, {c}}, {mx::float32, mx::float32, mx::float32},
                                std::make_shared<BatchNormTrain>(s, eps, silu),
                                {mx::contiguous(x, false, s), mx::contiguous(weight, false, s),
                                 mx::contiguous(bias, false, s)});
}

NB_MODULE(mlxnet_cpu_ops, m) {
  m.doc() = "mlxnet's CPU primitives (custom_kernels/cpu_ops.cpp)";
  m.def("im2col", &im2col, nb::arg("x"), nb::arg("kernel"), nb::arg("stride"), nb::arg("padding"),
        nb::arg("dilation"), "(N, H, W, C) -> (N, OH, OW, KH*KW*C) patches, zero padding implicit");
  m.def("col2im", &col2im, nb::arg("cols"), nb::arg("image"), nb::arg("kernel"), nb::arg("stride"),
        nb::arg("padding"), nb::arg("dilation"),
        "(N, OH, OW, KH*KW*C) patches -> the (N, H, W, C) image summing them (im2col's adjoint), float32");
  m.def("batch_norm_train", &batch_norm_train, nb::arg("x"), nb::arg("weight"), nb::arg("bias"), nb::arg("eps"),
        nb::arg("silu") = false,
        "training-mode batch norm over the rows of (..., C) (+ SiLU): [y, mean, biased var], float32, with its "
        "gradient");
  m.def("bias_silu", &bias_silu, nb::arg("y"), nb::arg("bias") = nb::none(), "silu(y + bias), float32");
  m.def("bias_act", &bias_act, nb::arg("y"), nb::arg("bias"), nb::arg("residual") = nb::none(), nb::arg("relu") = true,
        "relu(y + bias + residual) (residual and relu optional), float32");
  m.def("sigmoid", &sigmoid_f32, nb::arg("x"), "1 / (1 + exp(-x)), float32");
  m.def("gelu", &gelu_f32, nb::arg("x"), nb::arg("tanh") = false,
        "x·Φ(x) (erf form), or with tanh=True 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))), float32");
  m.def("softmax", &softmax_last, nb::arg("x"), "softmax over the last axis (max subtracted first), float32");
  m.def("layer_norm", &layer_norm_f32, nb::arg("x"), nb::arg("weight") = nb::none(), nb::arg("bias") = nb::none(),
        nb::arg("eps") = 1e-5f, "layer norm over the last axis (float32 statistics, two passes), float32");
  m.def("attention", &attention_f32, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("scale"),
        "softmax(scale·q·kᵀ)·v over (..., L, D) float32 arrays (leading axes broadcast), no bias");
  m.attr("max_parts") = kMaxParts;
  m.def("direct_conv2d", &direct_conv2d, nb::arg("x"), nb::arg("weight"), nb::arg("bias") = nb::none(),
        nb::arg("stride"), nb::arg("padding"), nb::arg("dilation"), nb::arg("silu") = false,
        "conv2d (+ bias, + SiLU) as a direct register-tiled convolution, float32, C_out % 16 == 0; x may be "
        "a list of up to 8 channel parts (their concatenation, never built)");
}
