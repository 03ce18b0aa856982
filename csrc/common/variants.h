// The attention variants real models use, each a template switch of a kernel's traits (off: the
// kernel is the plain one): a logit softcap (Gemma 2), a sliding window (Mistral, Gemma, gpt-oss),
// a learned sink logit per query head in every softmax (gpt-oss), ALiBi's linear biases (BLOOM,
// MPT). Their values are launch
// parameters (params.h, decode/params.h).
#pragma once

namespace flashtune {

struct Variants {
  bool softcap = false;  // scaled scores S -> cap * tanh(S / cap)
  bool window = false;   // key j visible to query i iff i' - left <= j <= i' + right (i' = i + shift)
  bool sinks = false;    // exp(sink of the head) joins every row's sum, with no value
  bool alibi = false;    // S += -slope * |i' - j|, a slope per head (or per sequence and head)
};

}  // namespace flashtune
