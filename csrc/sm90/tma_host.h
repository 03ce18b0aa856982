// Host side of TMA: encode a tensor map through the driver entry point that the CUDA
// runtime hands out, so nothing links against libcuda.
#pragma once
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace flashtune {
namespace sm90 {

// cuTensorMapEncodeTiled from the driver, found once through the runtime (null if absent).
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    cudaDriverEntryPointQueryResult found;
    void* fn = nullptr;
    const bool ok = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                                     &found) == cudaSuccess &&
                    found == cudaDriverEntryPointSuccess;
    return ok ? reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn) : nullptr;
  }();
  return encode;
}

// A row-major [rows][cols] bf16 matrix with row stride `row_stride_elems`, read in boxes of
// box_rows x box_cols (box_cols * 2 <= 128 bytes for the 128B swizzle). Returns a CUresult.
inline int encode_bf16_2d(CUtensorMap* map, const void* base, uint64_t rows, uint64_t cols,
                          uint64_t row_stride_elems, uint32_t box_rows, uint32_t box_cols) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr) return CUDA_ERROR_NOT_FOUND;
  const cuuint64_t dims[2] = {cols, rows};
  const cuuint64_t strides[1] = {row_stride_elems * 2};
  const cuuint32_t box[2] = {box_cols, box_rows};
  const cuuint32_t elem_strides[2] = {1, 1};
  return int(encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(base), dims, strides, box,
                    elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                    CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
}

// A (batch, rows, heads, dim) tensor with arbitrary strides (in elements; 16-byte multiples),
// read in boxes of box_cols columns x box_rows rows of one head and batch entry, swizzled for
// wgmma: 128B when a box row is 128 bytes, 64B when it is 64. 16-bit (`type` BFLOAT16 or
// FLOAT16), 1-byte (UINT8: FP8 e4m3) or 4-byte (FLOAT32: the backward's dQ sum) elements.
// Returns a CUresult.
inline int encode_4d(CUtensorMap* map, const void* base, CUtensorMapDataType type, uint64_t batch, uint64_t rows,
                     uint64_t heads, uint64_t dim, uint64_t batch_stride, uint64_t row_stride, uint64_t head_stride,
                     uint32_t box_cols, uint32_t box_rows) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr) return CUDA_ERROR_NOT_FOUND;
  // A dimension may not be empty (seqlen_k = 0: no block is ever loaded, any size will do), and
  // a size-1 dimension's stride (0 for varlen's batch) is never stepped over: make it dense.
  const uint64_t elem = type == CU_TENSOR_MAP_DATA_TYPE_UINT8 ? 1 : (type == CU_TENSOR_MAP_DATA_TYPE_FLOAT32 ? 4 : 2);
  const cuuint64_t dims[4] = {dim, rows ? rows : 1, heads, batch};
  const cuuint64_t strides[3] = {row_stride * elem, (heads == 1 ? dim : head_stride) * elem,
                                 (batch == 1 ? dim : batch_stride) * elem};
  const cuuint32_t box[4] = {box_cols, box_rows, 1, 1};
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  const CUtensorMapSwizzle swizzle = box_cols * elem == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B;
  return int(encode(map, type, 4, const_cast<void*>(base), dims, strides, box, elem_strides,
                    CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                    CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
}

// A KV-cache kernel's Q, (batch, positions, heads_kv x head_ratio, dim), as 5-D (dim, head in group,
// KV head, position, batch), read in boxes of box_cols columns x head_ratio heads x 1 KV head x
// box_positions positions: box_positions x head_ratio rows of 128B-swizzled shared memory, the
// packed rows of one KV head (position x head_ratio + head in group) as the prefill tiles' rows.
// 16-bit elements. Returns a CUresult.
inline int encode_q_packed(CUtensorMap* map, const void* base, CUtensorMapDataType type, uint64_t batch,
                           uint64_t positions, uint64_t heads_kv, uint64_t head_ratio, uint64_t dim,
                           uint64_t batch_stride, uint64_t row_stride, uint64_t head_stride, uint32_t box_cols,
                           uint32_t box_positions) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr) return CUDA_ERROR_NOT_FOUND;
  const cuuint64_t dims[5] = {dim, head_ratio, heads_kv, positions, batch};
  const cuuint64_t strides[4] = {head_stride * 2, head_ratio * head_stride * 2, row_stride * 2,
                                 (batch == 1 ? positions * row_stride : batch_stride) * 2};
  const cuuint32_t box[5] = {box_cols, uint32_t(head_ratio), 1, box_positions, 1};
  const cuuint32_t elem_strides[5] = {1, 1, 1, 1, 1};
  return int(encode(map, type, 5, const_cast<void*>(base), dims, strides, box, elem_strides,
                    CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                    CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
}

}  // namespace sm90
}  // namespace flashtune
