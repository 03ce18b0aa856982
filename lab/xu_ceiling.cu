// Issue 36's all-FP8 bar (1.5x own bf16 at hdim 128) against the throughput of the instructions the
// softmax adds per score: an exp (MUFU.EX2) and half a pack of two floats into e4m3 (F2FP) or bf16.
// One block per SM, every thread a chain of independent instructions; clock64 counts the SM's cycles,
// so the figure is instructions per cycle per SM, whatever the clock. HMMA: issue 35's sm80 family
// (mma.sync m16n8k16, bf16 in, fp32 accumulators, as FlashAttention-2 and flashtune's sm80 kernels
// use it) in FLOPs per cycle per SM, its operands in registers (no loads). Usage (on the GPU):
//   nvcc -O3 -arch=sm_90a -o /tmp/xu_ceiling lab/xu_ceiling.cu && /tmp/xu_ceiling
// prints one JSON object (lab/xu_ceiling.py turns it into the ceiling).
#include <cstdio>
#include <cuda_bf16.h>
#include <cuda_fp8.h>

constexpr int kThreads = 1024;
constexpr int kIters = 4096;
constexpr int kChains = 8;  // independent chains a thread: enough to hide each pipe's latency

enum Op { EX2, E4M3X2, BF16X2, FFMA, EX2_E4M3, EX2_BF16, HMMA, EX2_F16X2 };

template <Op op>
__global__ void __launch_bounds__(kThreads) run(float* sink, long long* cycles) {
  float x[kChains];
  float acc[kChains][4] = {};
  unsigned packed = 0;
  for (int c = 0; c < kChains; ++c) x[c] = 1e-3f * (threadIdx.x + c);
  const unsigned a0 = threadIdx.x * 0x00010001u, a1 = a0 ^ 0x3c003c00u, b0 = a0 + 1u;  // any bf16 bits
  __syncthreads();
  const long long start = clock64();
#pragma unroll 4
  for (int i = 0; i < kIters; ++i) {
#pragma unroll
    for (int c = 0; c < kChains; ++c) {
      if constexpr (op == EX2 || op == EX2_E4M3 || op == EX2_BF16) {
        asm volatile("ex2.approx.ftz.f32 %0, %0;" : "+f"(x[c]));
      }
      if constexpr (op == HMMA) {  // independent accumulators: the chains hide the HMMA latency
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                     "{%8, %9}, {%0, %1, %2, %3};"
                     : "+f"(acc[c][0]), "+f"(acc[c][1]), "+f"(acc[c][2]), "+f"(acc[c][3])
                     : "r"(a0), "r"(a1), "r"(a0 + c), "r"(a1 + c), "r"(b0), "r"(b0 ^ c));
      }
      if constexpr (op == EX2_F16X2) {  // two half exps an instruction in PTX; SASS: MUFU.EX2.F16 per half
        unsigned h = __float_as_uint(x[c]);
        asm volatile("ex2.approx.f16x2 %0, %0;" : "+r"(h));
        x[c] = __uint_as_float(h);
      }
      if constexpr (op == FFMA) {
        asm volatile("fma.rn.f32 %0, %0, 0f3F7FF000, 0f3A83126F;" : "+f"(x[c]));
      }
      // a pack per two elements, as P is packed (the exp-and-pack ops: one pack per two exps)
      if (op == E4M3X2 || (op == EX2_E4M3 && c % 2 == 1)) {  // c is a constant once unrolled
        unsigned short p;
        asm volatile("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(p) : "f"(x[c]), "f"(x[c ^ 1]));
        packed += p;
        if (op == E4M3X2) x[c] = __int_as_float(__float_as_int(x[c]) ^ p);  // a chain through it
      }
      if (op == BF16X2 || (op == EX2_BF16 && c % 2 == 1)) {
        unsigned p;
        asm volatile("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(p) : "f"(x[c]), "f"(x[c ^ 1]));
        packed += p;
        if (op == BF16X2) x[c] = __int_as_float(__float_as_int(x[c]) ^ (p & 0xffff));
      }
    }
  }
  __syncthreads();
  const long long end = clock64();
  float total = 0.f;
  for (int c = 0; c < kChains; ++c) total += x[c] + acc[c][0] + acc[c][1] + acc[c][2] + acc[c][3];
  sink[blockIdx.x * kThreads + threadIdx.x] = total + float(packed);
  if (threadIdx.x == 0) cycles[blockIdx.x] = end - start;
}

double g_clock_mhz = 0;  // the SMs' clock during the last run: its cycles over its time

template <Op op>
double per_cycle(int sms, float* sink, long long* cycles, long long* host, double per_iter) {
  run<op><<<sms, kThreads>>>(sink, cycles);  // warm-up
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  cudaEventRecord(start);
  run<op><<<sms, kThreads>>>(sink, cycles);
  cudaEventRecord(stop);
  cudaEventSynchronize(stop);
  float ms = 0;
  cudaEventElapsedTime(&ms, start, stop);
  cudaMemcpy(host, cycles, sms * sizeof(long long), cudaMemcpyDeviceToHost);
  long long worst = 0;
  for (int i = 0; i < sms; ++i) worst = host[i] > worst ? host[i] : worst;
  g_clock_mhz = double(worst) / (ms * 1e3);
  return double(kThreads) * kIters * per_iter / double(worst);  // instructions per cycle per SM
}

int main() {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, 0);
  float* sink;
  long long *cycles, host[1024];
  cudaMalloc(&sink, size_t(sms) * kThreads * sizeof(float));
  cudaMalloc(&cycles, sms * sizeof(long long));
  const double ex2 = per_cycle<EX2>(sms, sink, cycles, host, kChains);
  const double e4m3 = per_cycle<E4M3X2>(sms, sink, cycles, host, kChains);
  const double bf16 = per_cycle<BF16X2>(sms, sink, cycles, host, kChains);
  const double ffma = per_cycle<FFMA>(sms, sink, cycles, host, kChains);
  // exps per cycle when each two come with one pack (P's exps, packed for the P V GEMM)
  const double ex2_e4m3 = per_cycle<EX2_E4M3>(sms, sink, cycles, host, kChains);
  const double ex2_bf16 = per_cycle<EX2_BF16>(sms, sink, cycles, host, kChains);
  // a warp's m16n8k16 is 2 x 16 x 8 x 16 FLOPs: per thread, a 32nd of it per chain
  const double hmma = per_cycle<HMMA>(sms, sink, cycles, host, kChains * 4096.0 / 32);
  // exps per cycle in halves (2 a chain step): were MUFU's half exps faster, P's exps could be halves
  const double ex2_f16 = per_cycle<EX2_F16X2>(sms, sink, cycles, host, 2.0 * kChains);
  const cudaError_t err = cudaGetLastError();
  printf("{\"gpu\": \"%s\", \"sms\": %d, \"clock_mhz\": %.0f, \"error\": \"%s\", "
         "\"per_cycle_per_sm\": {\"ex2\": %.2f, \"cvt_e4m3x2\": %.2f, \"cvt_bf16x2\": %.2f, \"ffma\": %.2f, "
         "\"ex2_with_e4m3_pack_per_2\": %.2f, "
         "\"ex2_with_bf16_pack_per_2\": %.2f, \"hmma_bf16_flops\": %.1f, \"ex2_f16_halves\": %.2f}}\n",
         prop.name, sms, g_clock_mhz, cudaGetErrorString(err), ex2, e4m3, bf16, ffma, ex2_e4m3, ex2_bf16, hmma,
         ex2_f16);
  return err == cudaSuccess ? 0 : 1;
}
