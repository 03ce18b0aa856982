// The attention variants real models use, each a template switch of a kernel's traits (off: the
// kernel is the plain one): a logit softcap (Gemma 2), a sliding window (Mistral, Gemma, gpt-oss),
// a learned sink logit per query head in every softmax (gpt-oss), ALiBi's linear biases (BLOOM,
// MPT). Their values are launch
// parameters (params.h, decode/params.h).
#pragma once

namespace flashtune {

// A type, not a struct value: a class-type template parameter needs C++20, and torch before 2.14
// builds extensions as C++17.
template <bool kSoftcap = false, bool kWindow = false, bool kSinks = false, bool kAlibi = false>
struct Variants {
  static constexpr bool softcap = kSoftcap;  // scaled scores S -> cap * tanh(S / cap)
  static constexpr bool window = kWindow;    // key j visible to query i iff i' - left <= j <= i' + right (i' = i + shift)
  static constexpr bool sinks = kSinks;      // exp(sink of the head) joins every row's sum, with no value
  static constexpr bool alibi = kAlibi;      // S += -slope * |i' - j|, a slope per head (or per sequence and head)
};

}  // namespace flashtune
