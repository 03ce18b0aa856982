// The only translation unit that includes torch headers: it turns tensors into FwdParams and
// calls a kernel library's launcher on the current stream. Registered as the torch op
// flashtune_C::fwd; flashtune/runtime/ops.py wraps it in the public custom op.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <torch/library.h>

#include <cmath>
#include <map>
#include <mutex>
#include <utility>

#include "backward/params.h"
#include "common/params.h"
#include "decode/params.h"

namespace {

// The stride of dimension d, or the dense one when the dimension has size 1: such a stride is
// never stepped over, may be anything PyTorch chose, and the TMA needs multiples of 16 bytes.
int64_t stride_of(const at::Tensor& t, int d) {
  if (t.size(d) != 1) return t.stride(d);
  int64_t dense = 1;
  for (int64_t i = d + 1; i < t.dim(); ++i) dense *= t.size(i);
  return dense;
}

// Whether every row (the last dimension) of t starts 16-byte aligned, strides of size-1 dimensions
// aside: the backward's passes and epilogues move 8 or 16 bytes a lane.
bool rows_16b_aligned(const at::Tensor& t) {
  if (reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 != 0) return false;
  for (int64_t d = 0; d + 1 < t.dim(); ++d)
    if (stride_of(t, d) * t.element_size() % 16 != 0) return false;
  return true;
}

// The tile counter of the kernels that hand out tiles from one (FwdParams::tile_counter): two
// int32 per (device, stream), zeroed once, which every kernel that uses them leaves at 0 when it
// ends. Kernels on one stream run one after another, so no two share a count, and a call needs no
// memset (a kernel of its own, 1-2 us of a 130 us call). Under CUDA graph capture a replay may run
// on another stream: then a fresh pair, zeroed on the stream as part of the graph.
// Returns the tensor and whether it is already zero.
std::pair<at::Tensor, bool> tile_counter_for(const at::Tensor& like, cudaStream_t stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  TORCH_CHECK(cudaStreamIsCapturing(stream, &capture) == cudaSuccess, "flashtune: cudaStreamIsCapturing failed");
  const auto options = like.options().dtype(at::kInt);
  if (capture != cudaStreamCaptureStatusNone) return {at::empty({2}, options), false};
  static std::mutex mutex;
  // Never destroyed: freeing CUDA memory during static destruction can outlive the driver.
  static auto* counters = new std::map<std::pair<int, uintptr_t>, at::Tensor>();
  const std::lock_guard<std::mutex> lock(mutex);
  at::Tensor& counter = (*counters)[{like.get_device(), reinterpret_cast<uintptr_t>(stream)}];
  if (!counter.defined()) counter = at::zeros({2}, options);  // on the current stream: before any use
  return {counter, true};
}

// Python validates every input with a clear message first; these checks only keep a bad
// internal call from becoming an out-of-bounds kernel.
// The variants' values (common/variants.h), for FwdParams and DecodeParams alike; a kernel built
// without a variant never reads its.
template <class Params>
void set_variants(Params& p, double softmax_scale, double softcap, int64_t window_left, int64_t window_right,
                  const std::optional<at::Tensor>& sinks, const std::optional<at::Tensor>& alibi_slopes) {
  if (softcap > 0) {
    p.softcap_in = float(softmax_scale / softcap);
    p.softcap_out = float(softcap / softmax_scale);
  }
  p.window_left = int32_t(window_left), p.window_right = int32_t(window_right);
  if (sinks.has_value()) {
    TORCH_CHECK(sinks->scalar_type() == at::kFloat && sinks->is_cuda() && sinks->is_contiguous() &&
                    sinks->numel() == p.heads_q,
                "flashtune: sinks must be a contiguous CUDA float32 tensor of (heads_q,)");
    p.sinks = sinks->data_ptr<float>();
  }
  if (alibi_slopes.has_value()) {
    const at::Tensor& a = *alibi_slopes;
    TORCH_CHECK(a.scalar_type() == at::kFloat && a.is_cuda() && a.is_contiguous() && a.size(-1) == p.heads_q &&
                    (a.dim() == 1 || (a.dim() == 2 && a.size(0) == p.batch)),
                "flashtune: alibi_slopes must be a contiguous CUDA float32 tensor of (heads,) or (batch, heads)");
    p.alibi_slopes = a.data_ptr<float>();
    p.alibi_batch_stride = a.dim() == 2 ? p.heads_q : 0;
  }
}

// The FwdParams of q, k, v, out and lse (a forward's outputs, or a backward's inputs): pointers,
// strides, heads, lengths and scales.
flashtune::FwdParams fwd_params(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
                                const std::optional<at::Tensor>& lse, const std::optional<at::Tensor>& cu_seqlens_q,
                                const std::optional<at::Tensor>& cu_seqlens_k, int64_t max_seqlen_q,
                                int64_t max_seqlen_k, double softmax_scale) {
  TORCH_CHECK(q.is_cuda() && k.is_cuda() && v.is_cuda() && out.is_cuda(), "flashtune: CUDA tensors");
  TORCH_CHECK(q.stride(-1) == 1 && k.stride(-1) == 1 && v.stride(-1) == 1 && out.stride(-1) == 1,
              "flashtune: last dimension must be contiguous");
  for (const at::Tensor* t : {&q, &k, &v, &out}) {
    TORCH_CHECK(reinterpret_cast<uintptr_t>(t->data_ptr()) % 16 == 0,
                "flashtune: q, k, v must start at a 16-byte aligned address (a view at an odd "
                "offset is not); call .contiguous()");
  }
  const bool varlen = cu_seqlens_q.has_value();
  TORCH_CHECK(varlen == cu_seqlens_k.has_value(), "flashtune: cu_seqlens_q and cu_seqlens_k together");
  TORCH_CHECK(q.dim() == (varlen ? 3 : 4), "flashtune: q has the wrong rank");

  flashtune::FwdParams p{};
  p.q = q.data_ptr();
  p.k = k.data_ptr();
  p.v = v.data_ptr();
  p.o = out.data_ptr();
  p.lse = lse.has_value() ? lse->data_ptr<float>() : nullptr;
  const int r = varlen ? 0 : 1;  // index of the sequence dimension
  p.q_batch_stride = varlen ? 0 : stride_of(q, 0);
  p.k_batch_stride = varlen ? 0 : stride_of(k, 0);
  p.v_batch_stride = varlen ? 0 : stride_of(v, 0);
  p.o_batch_stride = varlen ? 0 : stride_of(out, 0);
  p.q_row_stride = stride_of(q, r), p.q_head_stride = stride_of(q, r + 1);
  p.k_row_stride = stride_of(k, r), p.k_head_stride = stride_of(k, r + 1);
  p.v_row_stride = stride_of(v, r), p.v_head_stride = stride_of(v, r + 1);
  p.o_row_stride = stride_of(out, r), p.o_head_stride = stride_of(out, r + 1);
  p.heads_q = int32_t(q.size(r + 1));
  p.heads_kv = int32_t(k.size(r + 1));
  TORCH_CHECK(p.heads_kv > 0 && p.heads_q % p.heads_kv == 0, "flashtune: heads_q % heads_kv");
  p.head_ratio = p.heads_q / p.heads_kv;
  if (varlen) {
    p.cu_seqlens_q = cu_seqlens_q->data_ptr<int32_t>();
    p.cu_seqlens_k = cu_seqlens_k->data_ptr<int32_t>();
    p.batch = int32_t(cu_seqlens_q->numel() - 1);
    p.seqlen_q = int32_t(max_seqlen_q);
    p.seqlen_k = int32_t(max_seqlen_k);
    p.total_q = int32_t(q.size(0));
    p.total_k = int32_t(k.size(0));
    if (lse.has_value()) {  // (heads, total_q)
      p.lse_batch_stride = 0;
      p.lse_head_stride = lse->stride(0);
    }
  } else {
    p.batch = int32_t(q.size(0));
    p.seqlen_q = int32_t(q.size(1));
    p.seqlen_k = int32_t(k.size(1));
    if (lse.has_value()) {  // (batch, heads, seqlen_q)
      p.lse_batch_stride = lse->stride(0);
      p.lse_head_stride = lse->stride(1);
    }
  }
  p.softmax_scale = float(softmax_scale);
  p.softmax_scale_log2 = float(softmax_scale * M_LOG2E);
  p.head_dim_qk = int32_t(q.size(-1));  // the sm90 family checks them (its narrow kernels read them)
  p.head_dim_v = int32_t(v.size(-1));
  return p;
}

void fwd(int64_t launcher, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
         const at::Tensor& out, const std::optional<at::Tensor>& lse,
         const std::optional<at::Tensor>& cu_seqlens_q, const std::optional<at::Tensor>& cu_seqlens_k,
         int64_t max_seqlen_q, int64_t max_seqlen_k, double softmax_scale,
         const std::optional<at::Tensor>& q_descale, const std::optional<at::Tensor>& k_descale, double softcap,
         int64_t window_left, int64_t window_right, const std::optional<at::Tensor>& sinks,
         const std::optional<at::Tensor>& alibi_slopes, const std::optional<at::Tensor>& v_descale,
         const std::optional<at::Tensor>& v_transposed) {
  TORCH_CHECK(launcher != 0, "flashtune: no kernel launcher");
  flashtune::FwdParams p =
      fwd_params(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale);
  if (q.scalar_type() == at::kFloat8_e4m3fn) {  // FP8 Q/K (and V): (batch, heads_kv) float32 descales
    const bool fp8_v = v.scalar_type() == at::kFloat8_e4m3fn;
    TORCH_CHECK(k.scalar_type() == at::kFloat8_e4m3fn && q_descale.has_value() && k_descale.has_value() &&
                    fp8_v == v_descale.has_value(),
                "flashtune: FP8 q and k come with q_descale and k_descale, an FP8 v with v_descale");
    for (const std::optional<at::Tensor>* d : {&q_descale, &k_descale, &v_descale}) {
      if (!d->has_value()) continue;
      const at::Tensor& t = **d;
      TORCH_CHECK(t.scalar_type() == at::kFloat && t.is_contiguous() && t.dim() == 2 && t.size(0) == p.batch &&
                      t.size(1) == p.heads_kv && t.device() == q.device(),
                  "flashtune: descales must be contiguous float32 (batch, heads_kv) on q's device");
    }
    p.q_descale = q_descale->data_ptr<float>();
    p.k_descale = k_descale->data_ptr<float>();
    p.descale_batch_stride = p.heads_kv;
    if (fp8_v) {  // the all-FP8 kernel: V^T is laid out in this scratch first (sm90/v_transpose.cuh)
      TORCH_CHECK(!cu_seqlens_q.has_value() && v_transposed.has_value() && v_transposed->is_contiguous() &&
                      v_transposed->device() == q.device() &&
                      v_transposed->nbytes() >= size_t(p.batch) * p.heads_kv * v.size(-1) * ((p.seqlen_k + 31) / 32 * 32),
                  "flashtune: an FP8 v takes a fixed-length call and V^T scratch of (batch, heads_kv, head_dim, "
                  "seqlen_k rounded up to 32) bytes");
      p.v_descale = v_descale->data_ptr<float>();
      p.v_transposed = v_transposed->data_ptr();
    }
  }
  set_variants(p, softmax_scale, softcap, window_left, window_right, sinks, alibi_slopes);
  if (p.batch == 0 || p.seqlen_q == 0) return;

  const c10::cuda::CUDAGuard guard(q.device());
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream(q.device().index()).stream();
  const auto [tile_counter, zeroed] = tile_counter_for(q, stream);
  p.tile_counter = tile_counter.data_ptr<int32_t>();
  p.tile_counter_zeroed = zeroed ? 1 : 0;
  auto fn = reinterpret_cast<flashtune::FwdLaunchFn>(launcher);
  const int err = fn(&p, stream);
  TORCH_CHECK(err == 0, "flashtune: kernel launch failed: ",
              cudaGetErrorString(static_cast<cudaError_t>(err)));
}

// A backward launch (csrc/backward/): the forward's q, k, v, out and lse, dout, dlse (the LSE's
// gradient, lse's layout, or none), dsum (fp32 scratch in lse's layout), dq_accum (fp32 scratch in
// q's shape), dq (q's shape and dtype, dq_accum's strides), dk and dv (k's shape with q's heads),
// and with GQA dk_kv and dv_kv (k's shape: each KV head's sum). The launcher runs the prep pass,
// the kernel, the finish pass and the group pass. Python checks every input first.
void bwd(int64_t launcher, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
         const at::Tensor& dout, const at::Tensor& lse, const std::optional<at::Tensor>& dlse, const at::Tensor& dsum,
         const at::Tensor& dq_accum, const at::Tensor& dq, const at::Tensor& dk, const at::Tensor& dv,
         const std::optional<at::Tensor>& dk_kv, const std::optional<at::Tensor>& dv_kv,
         const std::optional<at::Tensor>& cu_seqlens_q, const std::optional<at::Tensor>& cu_seqlens_k,
         int64_t max_seqlen_q, int64_t max_seqlen_k, double softmax_scale) {
  TORCH_CHECK(launcher != 0, "flashtune: no kernel launcher");
  flashtune::BwdParams p{};
  p.fwd = fwd_params(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale);
  const bool varlen = cu_seqlens_q.has_value();
  const int r = varlen ? 0 : 1;
  TORCH_CHECK(dout.sizes() == q.sizes() && dq_accum.sizes() == q.sizes() && dk.sizes() == dv.sizes() &&
                  dk.strides() == dv.strides() && dk.size(r + 1) == q.size(r + 1) && dk.size(r) == k.size(r),
              "flashtune: gradient shapes");
  TORCH_CHECK(dout.stride(-1) == 1 && dq_accum.stride(-1) == 1 && dk.stride(-1) == 1,
              "flashtune: gradients with a contiguous last dimension");
  for (const at::Tensor* t : {&dout, &out, &dq_accum, &dq, &dk, &dv})
    TORCH_CHECK(rows_16b_aligned(*t), "flashtune: dout, out and the gradients with 16-byte aligned rows");
  TORCH_CHECK(dq_accum.scalar_type() == at::kFloat && dq_accum.is_contiguous() && dsum.scalar_type() == at::kFloat &&
                  dsum.strides() == lse.strides() && dsum.sizes() == lse.sizes(),
              "flashtune: dq_accum float32 and contiguous (the prep pass zeroes it whole), dsum float32 in lse's layout");
  TORCH_CHECK(dq.scalar_type() == q.scalar_type() && dq.sizes() == q.sizes() && dq.strides() == dq_accum.strides(),
              "flashtune: dq in q's dtype and shape, dq_accum's strides");
  TORCH_CHECK(!dlse.has_value() || (dlse->scalar_type() == at::kFloat && dlse->strides() == lse.strides() &&
                                     dlse->sizes() == lse.sizes()),
              "flashtune: dlse float32 in lse's layout");
  p.dout = dout.data_ptr();
  p.do_batch_stride = varlen ? 0 : stride_of(dout, 0);
  p.do_row_stride = stride_of(dout, r), p.do_head_stride = stride_of(dout, r + 1);
  p.dsum = dsum.data_ptr<float>();
  p.dlse = dlse.has_value() ? dlse->data_ptr<float>() : nullptr;
  p.dq_accum = dq_accum.data_ptr<float>();
  p.dq = dq.data_ptr();
  p.dq_batch_stride = varlen ? 0 : dq_accum.stride(0);
  p.dq_row_stride = dq_accum.stride(r), p.dq_head_stride = dq_accum.stride(r + 1);
  p.dk = dk.data_ptr();
  p.dv = dv.data_ptr();
  p.dkv_batch_stride = varlen ? 0 : dk.stride(0);
  p.dkv_row_stride = dk.stride(r), p.dkv_head_stride = dk.stride(r + 1);
  TORCH_CHECK(dk_kv.has_value() == (p.fwd.head_ratio > 1) && dv_kv.has_value() == dk_kv.has_value(),
              "flashtune: dk_kv and dv_kv exactly with GQA");
  if (dk_kv.has_value()) {
    TORCH_CHECK(dk_kv->sizes() == k.sizes() && dv_kv->sizes() == k.sizes() && dk_kv->strides() == dv_kv->strides() &&
                    dk_kv->stride(-1) == 1 && dk_kv->scalar_type() == dk.scalar_type() &&
                    dv_kv->scalar_type() == dv.scalar_type() && rows_16b_aligned(*dk_kv) && rows_16b_aligned(*dv_kv),
                "flashtune: dk_kv and dv_kv in k's shape and dtype, one layout, a contiguous last dimension, "
                "16-byte aligned rows");
    p.dk_kv = dk_kv->data_ptr();
    p.dv_kv = dv_kv->data_ptr();
    p.dkv_kv_batch_stride = varlen ? 0 : dk_kv->stride(0);
    p.dkv_kv_row_stride = dk_kv->stride(r), p.dkv_kv_head_stride = dk_kv->stride(r + 1);
  }

  const c10::cuda::CUDAGuard guard(q.device());  // the launcher's passes write dq even without keys
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream(q.device().index()).stream();
  const auto [tile_counter, zeroed] = tile_counter_for(q, stream);  // the wgmma kernel's, causal or varlen
  p.fwd.tile_counter = tile_counter.data_ptr<int32_t>();
  p.fwd.tile_counter_zeroed = zeroed ? 1 : 0;
  auto fn = reinterpret_cast<flashtune::BwdLaunchFn>(launcher);
  const int err = fn(&p, stream);
  TORCH_CHECK(err == 0, "flashtune: backward kernel launch failed: ",
              cudaGetErrorString(static_cast<cudaError_t>(err)));
}

const int32_t* optional_int32(const std::optional<at::Tensor>& t, const char* name) {
  if (!t.has_value()) return nullptr;
  TORCH_CHECK(t->scalar_type() == at::kInt && t->is_cuda() && t->stride(-1) == 1, "flashtune: ", name,
              " must be a CUDA int32 tensor with a contiguous last dimension");
  return t->data_ptr<int32_t>();
}

// A decode launch (csrc/decode/): q (batch, seqlen_q, heads, hdim) or varlen (total_q, heads, hdim)
// against a KV cache, contiguous (batch_cache, capacity, heads_kv, hdim) or paged (pages,
// page_size, heads_kv, hdim) through block_table. Python checks every input first.
void decode(int64_t launcher, const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
            const at::Tensor& out, const std::optional<at::Tensor>& lse,
            const std::optional<at::Tensor>& cu_seqlens_q, const std::optional<at::Tensor>& seqused_k,
            const std::optional<at::Tensor>& cache_batch_idx, const std::optional<at::Tensor>& leftpad_k,
            const std::optional<at::Tensor>& block_table, int64_t max_seqlen_q, int64_t seqlen_k,
            double softmax_scale, int64_t num_splits, const std::optional<at::Tensor>& o_partial,
            const std::optional<at::Tensor>& lse_partial, const std::optional<at::Tensor>& k_descale,
            const std::optional<at::Tensor>& v_descale, double softcap, int64_t window_left, int64_t window_right,
            const std::optional<at::Tensor>& sinks, const std::optional<at::Tensor>& alibi_slopes,
            bool cluster_merge) {
  TORCH_CHECK(launcher != 0, "flashtune: no kernel launcher");
  TORCH_CHECK(q.is_cuda() && k_cache.is_cuda() && v_cache.is_cuda() && out.is_cuda(), "flashtune: CUDA tensors");
  for (const at::Tensor* t : {&q, &k_cache, &v_cache, &out}) {
    TORCH_CHECK(t->stride(-1) == 1 && reinterpret_cast<uintptr_t>(t->data_ptr()) % 16 == 0,
                "flashtune: contiguous last dimension and 16-byte aligned start");
  }
  const bool varlen = cu_seqlens_q.has_value();
  TORCH_CHECK(q.dim() == (varlen ? 3 : 4) && k_cache.dim() == 4 && v_cache.dim() == 4, "flashtune: ranks");
  flashtune::DecodeParams p{};
  p.q = q.data_ptr();
  p.k = k_cache.data_ptr();
  p.v = v_cache.data_ptr();
  p.o = out.data_ptr();
  p.lse = lse.has_value() ? lse->data_ptr<float>() : nullptr;
  const int r = varlen ? 0 : 1;
  p.q_batch_stride = varlen ? 0 : stride_of(q, 0);
  p.o_batch_stride = varlen ? 0 : stride_of(out, 0);
  p.q_row_stride = stride_of(q, r), p.q_head_stride = stride_of(q, r + 1);
  p.o_row_stride = stride_of(out, r), p.o_head_stride = stride_of(out, r + 1);
  p.k_batch_stride = stride_of(k_cache, 0), p.k_row_stride = stride_of(k_cache, 1), p.k_head_stride = stride_of(k_cache, 2);
  p.v_batch_stride = stride_of(v_cache, 0), p.v_row_stride = stride_of(v_cache, 1), p.v_head_stride = stride_of(v_cache, 2);
  p.heads_q = int32_t(q.size(r + 1));
  p.heads_kv = int32_t(k_cache.size(2));
  TORCH_CHECK(p.heads_kv > 0 && p.heads_q % p.heads_kv == 0, "flashtune: heads_q % heads_kv");
  p.head_ratio = p.heads_q / p.heads_kv;
  p.cu_seqlens_q = optional_int32(cu_seqlens_q, "cu_seqlens_q");
  p.seqused_k = optional_int32(seqused_k, "cache_seqlens");
  p.cache_batch_idx = optional_int32(cache_batch_idx, "cache_batch_idx");
  p.leftpad_k = optional_int32(leftpad_k, "cache_leftpad");
  p.block_table = optional_int32(block_table, "block_table");
  if (block_table.has_value()) {
    p.block_table_batch_stride = block_table->stride(0);
    p.page_size = int32_t(k_cache.size(1));
  }
  if (varlen) {
    p.batch = int32_t(cu_seqlens_q->numel() - 1);
    p.seqlen_q = int32_t(max_seqlen_q);
    p.total_q = int32_t(q.size(0));
    if (lse.has_value()) p.lse_batch_stride = 0, p.lse_head_stride = lse->stride(0);
  } else {
    p.batch = int32_t(q.size(0));
    p.seqlen_q = int32_t(q.size(1));
    p.total_q = p.batch * p.seqlen_q;
    if (lse.has_value()) p.lse_batch_stride = lse->stride(0), p.lse_head_stride = lse->stride(1);
  }
  p.seqlen_k = int32_t(seqlen_k);
  p.k_entries = int32_t(k_cache.size(0)), p.k_rows = int32_t(k_cache.size(1));
  p.softmax_scale = float(softmax_scale);
  p.softmax_scale_log2 = float(softmax_scale * M_LOG2E);
  // An e4m3 cache: the descales (batch, heads_kv), fp32 and contiguous (the FP8 kernels read them).
  const bool kv_fp8 = k_cache.scalar_type() == at::kFloat8_e4m3fn;
  TORCH_CHECK(kv_fp8 == (v_cache.scalar_type() == at::kFloat8_e4m3fn) &&
                  kv_fp8 == (k_descale.has_value() && v_descale.has_value()),
              "flashtune: an e4m3 k_cache and v_cache go with k_descale and v_descale");
  if (kv_fp8) {
    for (const at::Tensor* t : {&*k_descale, &*v_descale}) {
      TORCH_CHECK(t->scalar_type() == at::kFloat && t->is_cuda() && t->is_contiguous() &&
                      t->numel() == int64_t(p.batch) * p.heads_kv,
                  "flashtune: descales must be contiguous CUDA float32 tensors of (batch, heads_kv)");
    }
    p.k_descale = k_descale->data_ptr<float>();
    p.v_descale = v_descale->data_ptr<float>();
  }
  set_variants(p, softmax_scale, softcap, window_left, window_right, sinks, alibi_slopes);
  p.num_splits = int32_t(num_splits);
  p.cluster_merge = cluster_merge ? 1 : 0;  // the launcher checks the kernel can
  if (num_splits > 1 && !cluster_merge) {
    TORCH_CHECK(o_partial.has_value() && lse_partial.has_value(), "flashtune: split buffers");
    p.o_partial = o_partial->data_ptr<float>();
    p.lse_partial = lse_partial->data_ptr<float>();
  }
  if (p.batch == 0 || p.seqlen_q == 0) return;
  const c10::cuda::CUDAGuard guard(q.device());
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream(q.device().index()).stream();
  const int err = reinterpret_cast<flashtune::DecodeLaunchFn>(launcher)(&p, stream);
  TORCH_CHECK(err == 0, "flashtune: decode launch failed: ", cudaGetErrorString(static_cast<cudaError_t>(err)));
}

}  // namespace

TORCH_LIBRARY(flashtune_C, m) {
  m.def(
      "fwd(int launcher, Tensor q, Tensor k, Tensor v, Tensor(a!) out, Tensor(b!)? lse, "
      "Tensor? cu_seqlens_q, Tensor? cu_seqlens_k, int max_seqlen_q, int max_seqlen_k, "
      "float softmax_scale, Tensor? q_descale, Tensor? k_descale, float softcap=0., int window_left=-1, "
      "int window_right=-1, Tensor? sinks=None, Tensor? alibi_slopes=None, Tensor? v_descale=None, "
      "Tensor(c!)? v_transposed=None) -> ()");
  m.def(
      "bwd(int launcher, Tensor q, Tensor k, Tensor v, Tensor out, Tensor dout, Tensor lse, Tensor? dlse, "
      "Tensor(a!) dsum, Tensor(b!) dq_accum, Tensor(c!) dq, Tensor(d!) dk, Tensor(e!) dv, Tensor(f!)? dk_kv, "
      "Tensor(g!)? dv_kv, Tensor? cu_seqlens_q, Tensor? cu_seqlens_k, int max_seqlen_q, int max_seqlen_k, "
      "float softmax_scale) -> ()");
  m.def(
      "decode(int launcher, Tensor q, Tensor k_cache, Tensor v_cache, Tensor(a!) out, Tensor(b!)? lse, "
      "Tensor? cu_seqlens_q, Tensor? seqused_k, Tensor? cache_batch_idx, Tensor? leftpad_k, Tensor? block_table, "
      "int max_seqlen_q, int seqlen_k, float softmax_scale, int num_splits, Tensor(c!)? o_partial, "
      "Tensor(d!)? lse_partial, Tensor? k_descale=None, Tensor? v_descale=None, float softcap=0., "
      "int window_left=-1, int window_right=-1, Tensor? sinks=None, Tensor? alibi_slopes=None, "
      "bool cluster_merge=False) -> ()");
}

TORCH_LIBRARY_IMPL(flashtune_C, CUDA, m) {
  m.impl("fwd", &fwd);
  m.impl("bwd", &bwd);
  m.impl("decode", &decode);
}
