// The prefill path's check and timings on a GPU (bench/device-prefill.sh runs it), in one process:
//  1. parity of DeviceModel::prefill against the decode forwards (64-row graphs) on random models of every
//     supported switch (GQA, head_dim 32/48/64/128, QKV and O bias, QK-norm, tied embeddings) and on the 2B
//     shape: a prompt prefilled in chunks, then its last row by a decode forward, against the whole prompt in
//     64-row forwards: the last row's logits and every layer's K and V cache rows;
//  2. the CUDA backend against the CPU backend on a tiny model folder: a long commit (routed through the
//     prefill kernels) and the same prompt in chunks, the last row's logits;
//  3. prompt tokens/s on the 2B shape for 1k, 4k and 16k-token prompts (chunks of prefill_rows(), the last row
//     through a decode forward, as the backend does), the decode forwards alone for comparison, and both
//     paths per chunk size (where the backend's kPrefillFromRows comes from);
//  4. unless --decode-prefill-gemm 0: decode forwards of 64 and 40 rows on the prefill GEMMs against the same
//     forwards on the decode GEMMs (every random shape and the 2B one), and their time beside the decode GEMMs';
//  5. with --forward-rows N above 64 (ModelOptions::max_forward_rows): a prompt in forwards of N rows against
//     forwards of 64, and one forward of many sequences (continuous batching past 64 rows: 32 x 5 rows, 48 x 5, 20 x
//     12) against each sequence's part alone, every window row's logits; on the 2B shape the time of such forwards
//     of 8-48 sequences at block 4 against the same sequences in forwards of at most 64 rows.
// Any mismatch beyond the tolerances prints FAIL and makes the exit status 1. A short table comes last.
//   prefill_check [--skip-2b] [--quick] [--split N] [--shapes 0|1] [--wgmma 0|1] [--wgmma-cluster 0|1] [--wgmma-stream 0|1]
//                 [--wgmma-stream-min-blocks N]
//                 [--split-attention 0|1] [--decode-prefill-gemm ROWS] [--forward-rows N [--forward-rows-only]]
//                 [--attention-typical-blocks 0|1] [--attention-warp-combine 0|1] [--attention-prefetch 0|1]
//                 [--forward-kv N] [--profile-sequences N]
//                 [--profile-prompt N] [--wgmma-tokens N]     (--probe:
//   exit 0 at once, to see that the binary loads; --split N: the GEMMs' K split towards N blocks per SM, g_split
//   below; --shapes: their block shape by the call's rows, g_shapes below; --wgmma: the warpgroup kernel for every
//   call, g_wgmma below; --wgmma-cluster: its K splits as clusters, g_wgmma_cluster; --wgmma-stream: stream-K where
//   it ends sooner, g_wgmma_stream; --wgmma-tokens: its block
//   tokens, g_wgmma_tokens; --split-attention: chunks of up to 64 rows through the decode attention, g_split_attention;
//   --profile-sequences N: nothing else but one forward of N sequences at block 4 on the 2B shape between
//   cudaProfilerStart and cudaProfilerStop, for `ncu --profile-from-start off`; --profile-prompt N: the same for one
//   N-token prompt on the 2B shape as the backend runs it, its prefill calls and the last row's decode forward)
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <cuda_profiler_api.h>

#include "backend.h"
#include "model.cuh"
#include "model.h"
#include "test_util.h"

using namespace a2d::cuda;

namespace {

int failures = 0;
// --split N: the prefill GEMMs split K towards N blocks per SM (GemmTuning::prefill_split_blocks_per_sm; the
// engine's default unless given, 0: off) in every random model's parity check, and the 2B timings per chunk size
// add that path beside the unsplit one.
int g_split = GemmTuning{}.prefill_split_blocks_per_sm;
// --shapes 0|1: the prefill GEMMs' block shape by the call's rows (GemmTuning::prefill_shape_by_rows; the engine's
// default unless given) everywhere.
bool g_shapes = GemmTuning{}.prefill_shape_by_rows;
// --wgmma 0|1: the prefill GEMMs of at least GemmTuning::prefill_wgmma_min_rows rows (every call) on the warpgroup kernel
// (GemmTuning::prefill_wgmma; the engine's default unless given).
bool g_wgmma = GemmTuning{}.prefill_wgmma;
// --wgmma-cluster 0|1: the warpgroup kernel's K splits as clusters that share the sums and the epilogue
// (GemmTuning::prefill_wgmma_cluster; the engine's default unless given).
bool g_wgmma_cluster = GemmTuning{}.prefill_wgmma_cluster;
// --wgmma-stream 0|1: the warpgroup kernel's 64-token calls as stream-K where that ends sooner than their split
// (GemmTuning::prefill_wgmma_stream; the engine's default unless given).
bool g_wgmma_stream = GemmTuning{}.prefill_wgmma_stream;
// --wgmma-stream-min-blocks N: the fewest 64-token blocks a call takes stream-K at
// (GemmTuning::prefill_wgmma_stream_min_blocks; 1: calls of one token block too).
int g_wgmma_stream_min_blocks = GemmTuning{}.prefill_wgmma_stream_min_blocks;
// --wgmma-tokens N: the warpgroup kernel's token rows a block for every call (GemmTuning::prefill_wgmma_tokens; 0,
// the engine's default: by the call's rows).
int g_wgmma_tokens = GemmTuning{}.prefill_wgmma_tokens;
// --split-attention 0|1: chunks of at most 64 rows attend through the decode forwards' kernels
// (ModelOptions::prefill_split_attention; the engine's default unless given).
bool g_split_attention = ModelOptions{}.prefill_split_attention;
// --decode-prefill-gemm ROWS: decode forwards of at least ROWS rows on the prefill GEMMs
// (ModelOptions::decode_prefill_gemm_rows; the engine's default unless given, 0 never): held to the decode GEMMs'
// forwards, and timed beside them.
int g_decode_prefill_gemm = ModelOptions{}.decode_prefill_gemm_rows;
// --forward-rows N: forwards of up to N rows (ModelOptions::max_forward_rows; the engine's default unless given); above
// 64, the checks and timings of item 5.
int g_forward_rows = ModelOptions{}.max_forward_rows;
// --attention-typical-blocks 0|1: ModelOptions::attention_typical_blocks (the engine's default unless given).
bool g_attention_typical_blocks = ModelOptions{}.attention_typical_blocks;
// --attention-warp-combine 0|1: ModelOptions::attention_warp_combine (the engine's default unless given).
bool g_attention_warp_combine = ModelOptions{}.attention_warp_combine;
// --attention-prefetch 0|1: ModelOptions::attention_prefetch (the engine's default unless given).
bool g_attention_prefetch = ModelOptions{}.attention_prefetch;
// --forward-kv N: the cached tokens of every sequence in item 5's timings and --profile-sequences (1,024 unless given).
int g_forward_kv = 1024;
// --profile-sequences N: only profile_forward below (N sequences of forward_rows_timings' kind in one forward).
int g_profile_sequences = 0;
// --profile-prompt N: only profile_prompt below (one N-token prompt on the prefill path).
int g_profile_prompt = 0;

void check(bool ok, const std::string& what) {
  std::printf("%s %s\n", ok ? "ok  " : "FAIL", what.c_str());
  std::fflush(stdout);
  if (!ok) ++failures;
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Uniform in [-scale, scale) + offset, from a SplitMix64 of (seed, index).
__global__ void fill_kernel(bf16* data, int64_t count, uint64_t seed, float scale, float offset) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x) {
    uint64_t z = seed + 0x9E3779B97F4A7C15ull * uint64_t(i + 1);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    data[i] = __float2bfloat16(offset + scale * (float(z >> 40) * (2.0f / 16777216.0f) - 1.0f));
  }
}

float bf16_value(uint16_t bits) {
  const uint32_t word = uint32_t(bits) << 16;
  float v;
  std::memcpy(&v, &word, 4);
  return v;
}

struct Case {
  std::string name;
  ModelShape shape;
  int prompt;  // tokens
  int chunk;   // prefill rows per call
};

ModelShape make_shape(int hidden, int inter, int layers, int heads, int kv_heads, int head_dim, int vocab) {
  ModelShape s;
  s.hidden = hidden;
  s.intermediate = inter;
  s.layers = layers;
  s.heads = heads;
  s.kv_heads = kv_heads;
  s.head_dim = head_dim;
  s.vocab = vocab;
  s.rms_eps = 1e-6f;
  s.rope_theta = 10000.0;
  s.mask_token_id = vocab - 1;
  return s;
}

// A DeviceModel of `shape` with random weights made on the device: matrices uniform with standard deviation
// about 0.6 / sqrt(fan-in), norms around 1, biases small, the embedding of unit scale.
std::unique_ptr<DeviceModel> random_model(const ModelShape& shape, uint64_t seed, int decode_prefill_gemm = -1) {
  ModelOptions options;
  options.decode_prefill_gemm_rows = decode_prefill_gemm >= 0 ? decode_prefill_gemm : g_decode_prefill_gemm;
  options.max_forward_rows = g_forward_rows;
  options.attention_typical_blocks = g_attention_typical_blocks;
  options.attention_warp_combine = g_attention_warp_combine;
  options.attention_prefetch = g_attention_prefetch;
  options.gemm.prefill_split_blocks_per_sm = g_split;
  options.gemm.prefill_shape_by_rows = g_shapes;
  options.gemm.prefill_wgmma = g_wgmma;
  options.gemm.prefill_wgmma_cluster = g_wgmma_cluster;
  options.gemm.prefill_wgmma_stream = g_wgmma_stream;
  options.gemm.prefill_wgmma_stream_min_blocks = g_wgmma_stream_min_blocks;
  options.gemm.prefill_wgmma_tokens = g_wgmma_tokens;
  options.prefill_split_attention = g_split_attention;
  auto model = std::make_unique<DeviceModel>(shape, options);
  const ModelShape& s = shape;
  const int64_t largest = std::max<int64_t>({int64_t(s.vocab) * s.hidden, int64_t(s.intermediate) * s.hidden,
                                             int64_t(s.heads) * s.head_dim * s.hidden});
  bf16* scratch = nullptr;
  A2D_CUDA_CHECK(cudaMalloc(&scratch, largest * sizeof(bf16)));
  uint64_t next = seed;
  auto put = [&](WeightName name, int layer, int64_t rows, int64_t cols, float scale, float offset) {
    fill_kernel<<<1024, 256, 0, model->stream()>>>(scratch, rows * cols, ++next * 0x2545F4914F6CDD1Dull, scale, offset);
    A2D_CUDA_CHECK_LAUNCH();
    model->upload(name, layer, WeightSource{scratch, SourceType::bf16, true});
    model->synchronize();  // the scratch is refilled next
  };
  const int64_t H = s.hidden, D = s.head_dim, Q = int64_t(s.heads) * D, KV = int64_t(s.kv_heads) * D;
  auto matrix = [](int64_t fan_in) { return 0.6f * std::sqrt(3.0f / float(fan_in)); };
  put(WeightName::embed, 0, s.vocab, H, 1.7f, 0.f);
  if (!s.tied_embeddings) put(WeightName::lm_head, 0, s.vocab, H, matrix(H), 0.f);
  put(WeightName::final_norm, 0, 1, H, 0.2f, 1.f);
  for (int l = 0; l < s.layers; ++l) {
    put(WeightName::input_norm, l, 1, H, 0.2f, 1.f);
    put(WeightName::post_norm, l, 1, H, 0.2f, 1.f);
    put(WeightName::q, l, Q, H, 2.f * matrix(H), 0.f);  // peaked attention: larger q and k
    put(WeightName::k, l, KV, H, 2.f * matrix(H), 0.f);
    put(WeightName::v, l, KV, H, matrix(H), 0.f);
    put(WeightName::o, l, H, Q, matrix(Q), 0.f);
    put(WeightName::gate, l, s.intermediate, H, matrix(H), 0.f);
    put(WeightName::up, l, s.intermediate, H, matrix(H), 0.f);
    put(WeightName::down, l, H, s.intermediate, matrix(s.intermediate), 0.f);
    if (s.qkv_bias) {
      put(WeightName::q_bias, l, Q, 1, 0.2f, 0.f);
      put(WeightName::k_bias, l, KV, 1, 0.2f, 0.f);
      put(WeightName::v_bias, l, KV, 1, 0.2f, 0.f);
    }
    if (s.o_bias) put(WeightName::o_bias, l, H, 1, 0.2f, 0.f);
    if (s.qk_norm) {
      put(WeightName::q_norm, l, 1, D, 0.2f, 1.f);
      put(WeightName::k_norm, l, 1, D, 0.2f, 1.f);
    }
  }
  model->finish_upload();
  A2D_CUDA_CHECK(cudaFree(scratch));
  return model;
}

std::vector<int32_t> prompt_tokens(int n, int vocab, int salt) {
  std::vector<int32_t> tokens(n);
  for (int i = 0; i < n; ++i) tokens[i] = int32_t((int64_t(i) * 7919 + 13 + salt * 104729) % (vocab - 1));
  return tokens;
}

// One decode forward of `rows` commit tokens after `cached` ones; logits of its last row when asked.
void decode_forward(DeviceModel& model, int cached, const int32_t* tokens, int rows, bool last_logits) {
  const int32_t last = rows - 1;
  ForwardInputs in;
  in.cached = cached;
  in.commit = rows;
  in.tokens = tokens;
  in.rows = rows;
  in.logit_rows = &last;
  in.logit_count = last_logits ? 1 : 0;
  in.write_logits = last_logits;
  model.forward(in);
}

// The prompt as the backend sends it on the prefill path: chunks of `chunk` rows, the last row by a decode forward.
void prefill_prompt(DeviceModel& model, const std::vector<int32_t>& tokens, int chunk) {
  const int n = static_cast<int>(tokens.size());
  for (int start = 0; start < n - 1; start += chunk) model.prefill(0, start, tokens.data() + start, std::min(chunk, n - 1 - start));
  decode_forward(model, n - 1, tokens.data() + n - 1, 1, true);
}

// The same on the decode forwards alone: forwards of `chunk` rows (64 by default), the last with the logits of its
// last row.
void decode_prompt(DeviceModel& model, const std::vector<int32_t>& tokens, int chunk = kMaxRows) {
  const int n = static_cast<int>(tokens.size());
  for (int start = 0; start < n; start += chunk) {
    const int rows = std::min(chunk, n - start);
    decode_forward(model, start, tokens.data() + start, rows, start + rows == n);
  }
}

struct Snapshot {
  std::vector<float> logits;
  std::vector<uint16_t> kv;
  TokenChoice choice;
};

Snapshot snapshot(DeviceModel& model) {
  Snapshot s;
  s.logits.resize(model.shape().vocab);
  model.copy_logits(s.logits.data(), 0, 1);
  model.copy_choices(&s.choice, 1);
  s.kv.resize(model.kv_storage_elements());
  A2D_CUDA_CHECK(cudaMemcpy(s.kv.data(), model.kv_storage(), s.kv.size() * 2, cudaMemcpyDeviceToHost));
  return s;
}

double rel_error(const float* a, const float* b, int64_t n) {
  double err = 0, norm = 0;
  for (int64_t i = 0; i < n; ++i) {
    err += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    norm += double(b[i]) * b[i];
  }
  return norm > 0 ? std::sqrt(err / norm) : std::sqrt(err);
}

// Logits and KV rows of two runs of the same prompt (`got` against `want`), as a line and a table row.
void compare(const std::string& name, const std::string& what, const ModelShape& s, int prompt, const Snapshot& got,
             const Snapshot& want, std::vector<std::string>& table) {
  const double logits_err = rel_error(got.logits.data(), want.logits.data(), s.vocab);
  // KV: [K, V][layer][kv_head][max_context][head_dim_padded]; rows 0..prompt-1 of each (kind, layer, head).
  const int hdp = s.head_dim <= 32 ? 32 : (s.head_dim <= 64 ? 64 : 128);
  double worst = 0, first_layer = 0;
  int worst_layer = 0;
  std::vector<float> a, b;
  for (int kind = 0; kind < 2; ++kind) {
    for (int l = 0; l < s.layers; ++l) {
      a.clear();
      b.clear();
      for (int h = 0; h < s.kv_heads; ++h) {
        const size_t base = ((size_t(kind) * s.layers + l) * s.kv_heads + h) * size_t(s.max_context) * hdp;
        for (size_t i = base; i < base + size_t(prompt) * hdp; ++i) {
          a.push_back(bf16_value(got.kv[i]));
          b.push_back(bf16_value(want.kv[i]));
        }
      }
      const double e = rel_error(a.data(), b.data(), int64_t(a.size()));
      if (l == 0) first_layer = std::max(first_layer, e);
      if (e > worst) {
        worst = e;
        worst_layer = l;
      }
    }
  }
  char line[512];
  std::snprintf(line, sizeof line, "%s: %s: logits rel err %.2e, argmax %d vs %d, KV rel err layer 0 %.2e, worst %.2e (layer %d)",
                name.c_str(), what.c_str(), logits_err, got.choice.token, want.choice.token, first_layer, worst, worst_layer);
  // Both paths round to bf16 at the same points; fp32 sums in another order flip a few roundings, which the
  // layers carry on. An indexing fault shows as errors of order 1.
  check(logits_err < 3e-2 && first_layer < 5e-3 && worst < 3e-2, line);
  table.push_back(std::string("| ") + name + " | " + (logits_err < 3e-2 && worst < 3e-2 ? "ok" : "FAIL") + " |");
}

// Logits and KV rows of the prefill path against the decode path.
void parity(const Case& c, std::vector<std::string>& table) {
  ModelShape s = c.shape;
  s.max_context = c.prompt + 64;
  auto model = random_model(s, 7);
  const std::vector<int32_t> tokens = prompt_tokens(c.prompt, s.vocab, 1);
  A2D_CUDA_CHECK(cudaMemset(model->kv_storage(), 0, model->kv_storage_elements() * 2));
  decode_prompt(*model, tokens);
  const Snapshot want = snapshot(*model);
  A2D_CUDA_CHECK(cudaMemset(model->kv_storage(), 0, model->kv_storage_elements() * 2));
  prefill_prompt(*model, tokens, c.chunk);
  const Snapshot got = snapshot(*model);
  compare("parity " + c.name, std::to_string(c.prompt) + " tokens in chunks of " + std::to_string(c.chunk), s, c.prompt, got,
          want, table);
}

// Decode forwards of `chunk` rows on the prefill GEMMs (--decode-prefill-gemm) against the same forwards on the
// decode GEMMs, two models of the same weights.
void decode_gemm_parity(const Case& c, std::vector<std::string>& table) {
  ModelShape s = c.shape;
  s.max_context = c.prompt + 64;
  const std::vector<int32_t> tokens = prompt_tokens(c.prompt, s.vocab, 2);
  Snapshot runs[2];
  for (int on = 0; on < 2; ++on) {
    auto model = random_model(s, 7, on ? g_decode_prefill_gemm : 0);
    A2D_CUDA_CHECK(cudaMemset(model->kv_storage(), 0, model->kv_storage_elements() * 2));
    decode_prompt(*model, tokens, c.chunk);
    runs[on] = snapshot(*model);
  }
  compare("decode on prefill GEMMs " + c.name, std::to_string(c.prompt) + " tokens in forwards of " + std::to_string(c.chunk),
          s, c.prompt, runs[1], runs[0], table);
}

// A prompt in forwards of g_forward_rows rows (one sequence, more than 64 rows a forward) against forwards of 64, on
// one model.
void long_forward_parity(const Case& c, std::vector<std::string>& table) {
  ModelShape s = c.shape;
  s.max_context = c.prompt + 64;
  auto model = random_model(s, 7);
  const int rows = model->max_forward_rows();
  if (rows <= kMaxRows) {
    std::printf("%s: forwards stay at %d rows on this shape (no prefill GEMMs for its decode forwards)\n", c.name.c_str(), rows);
    return;
  }
  const std::vector<int32_t> tokens = prompt_tokens(c.prompt, s.vocab, 3);
  A2D_CUDA_CHECK(cudaMemset(model->kv_storage(), 0, model->kv_storage_elements() * 2));
  decode_prompt(*model, tokens, kMaxRows);
  const Snapshot want = snapshot(*model);
  A2D_CUDA_CHECK(cudaMemset(model->kv_storage(), 0, model->kv_storage_elements() * 2));
  decode_prompt(*model, tokens, rows);
  const Snapshot got = snapshot(*model);
  compare("forwards of " + std::to_string(rows) + " rows " + c.name,
          std::to_string(c.prompt) + " tokens against forwards of " + std::to_string(kMaxRows), s, c.prompt, got, want, table);
}

// Parts of sequences packed into one forward as CudaBackend packs them: each part's commit rows, then its window rows
// with logits. A single part runs as its sequence alone (cached, commit and slot).
struct Packed {
  std::vector<int32_t> tokens, logit_rows;
  std::vector<ForwardEntry> entries;
  void add(int slot, int cached, int commit, const std::vector<int32_t>& part) {
    for (int j = commit; j < static_cast<int>(part.size()); ++j) logit_rows.push_back(static_cast<int32_t>(tokens.size()) + j);
    tokens.insert(tokens.end(), part.begin(), part.end());
    entries.push_back({slot, cached, commit, static_cast<int>(part.size())});
  }
  ForwardInputs inputs(bool write_logits) const { return forward_inputs(tokens, logit_rows, entries, write_logits); }
};

// One forward of `sequences` sequences, each a prompt in its own slot then `commit` committed and `window` window
// rows (every other one the mask token) with logits at the window rows, against each sequence's rows as a forward of
// its own: every window row's logits, and the argmax of each.
void batch_parity(const std::string& name, ModelShape s, int sequences, int commit, int window, std::vector<std::string>& table) {
  s.kv_slots = sequences;
  s.max_context = 512;
  auto model = random_model(s, 9);
  const int rows = sequences * (commit + window);
  const std::string what = std::to_string(sequences) + " sequences x (" + std::to_string(commit) + " + " +
                           std::to_string(window) + ") rows";
  if (model->slots() < sequences || rows > model->max_forward_rows()) {
    check(false, "batch " + name + ": " + what + " do not fit one forward (" + std::to_string(model->slots()) + " slots, " +
                     std::to_string(model->max_forward_rows()) + " rows)");
    return;
  }
  std::vector<std::vector<int32_t>> prompts, parts;
  for (int e = 0; e < sequences; ++e) {
    prompts.push_back(prompt_tokens(40 + 9 * e, s.vocab, 10 + e));
    std::vector<int32_t> part = prompt_tokens(commit + window, s.vocab, 100 + e);
    for (int j = 0; j < window; j += 2) part[commit + j] = s.mask_token_id;
    parts.push_back(part);
  }
  auto fill_prompts = [&] {
    A2D_CUDA_CHECK(cudaMemset(model->kv_storage(), 0, model->kv_storage_elements() * 2));
    for (int e = 0; e < sequences; ++e) model->prefill(e, 0, prompts[e].data(), static_cast<int>(prompts[e].size()));
  };
  const int logits = sequences * window;
  std::vector<float> together(size_t(logits) * s.vocab), alone(size_t(logits) * s.vocab);
  std::vector<TokenChoice> together_choice(logits), alone_choice(logits);
  fill_prompts();
  Packed all;
  for (int e = 0; e < sequences; ++e) all.add(e, static_cast<int>(prompts[e].size()), commit, parts[e]);
  model->forward(all.inputs(true));
  model->copy_logits(together.data(), 0, logits);
  model->copy_choices(together_choice.data(), logits);
  fill_prompts();
  for (int e = 0; e < sequences; ++e) {
    Packed one;
    one.add(e, static_cast<int>(prompts[e].size()), commit, parts[e]);
    model->forward(one.inputs(true));
    model->copy_logits(alone.data() + size_t(e) * window * s.vocab, 0, window);
    model->copy_choices(alone_choice.data() + e * window, window);
  }
  double worst = 0;
  int worst_sequence = 0, agree = 0, choice_mismatch = 0;
  for (int e = 0; e < sequences; ++e) {
    const size_t first = size_t(e) * window * s.vocab;
    const double err = rel_error(together.data() + first, alone.data() + first, int64_t(window) * s.vocab);
    if (err > worst) {
      worst = err;
      worst_sequence = e;
    }
  }
  for (int i = 0; i < logits; ++i) {
    agree += together_choice[i].token == alone_choice[i].token;
    // The device argmax of each row against the host's own reading of the same forward's logits.
    const float* row = together.data() + size_t(i) * s.vocab;
    int best = -1;
    for (int v = 0; v < s.vocab; ++v) {
      if (v != s.mask_token_id && (best < 0 || row[v] > row[best])) best = v;
    }
    choice_mismatch += together_choice[i].token != best;
  }
  char line[512];
  std::snprintf(line, sizeof line, "batch %s: %s in one forward of %d rows against each alone: logits rel err worst %.2e "
                "(sequence %d), argmax agree %d/%d, device argmax vs its logits %d off",
                name.c_str(), what.c_str(), rows, worst, worst_sequence, agree, logits, choice_mismatch);
  // Ties in random weights may flip an argmax between the two GEMM paths; the logits bound the error.
  check(worst < 3e-2 && choice_mismatch == 0, line);
  table.push_back("| batch " + name + ", " + what + " | " + (worst < 3e-2 && choice_mismatch == 0 ? "ok" : "FAIL") + " |");
}

// The CUDA backend against the CPU backend through the Backend interface on a tiny model folder.
void backend_parity(std::vector<std::string>& table) {
  a2d::test::TinyShape shape;
  shape.hidden = 128;
  shape.intermediate = 256;
  shape.layers = 2;
  shape.heads = 4;
  shape.kv_heads = 2;
  shape.head_dim = 32;
  shape.vocab = 300;
  shape.max_positions = 2048;
  shape.weight_scale = 0.15f;
  const std::string dir = a2d::test::write_tiny_model("prefill_check_backend", shape, 5);
  auto model = a2d::load_model(dir);
  a2d::BackendOptions options;
  options.max_context = 1024;
  auto cpu = a2d::make_cpu_backend(*model, options);
  auto cuda = a2d::make_cuda_backend(*model, options);
  const std::vector<int32_t> prompt = prompt_tokens(700, shape.vocab, 2);
  auto run = [&](a2d::Backend& backend, size_t chunk) {
    backend.reset_cache();
    std::vector<float> logits(shape.vocab);
    for (size_t begin = 0; begin < prompt.size(); begin += chunk) {
      const size_t end = std::min(prompt.size(), begin + chunk);
      a2d::ForwardArgs args;
      args.commit.assign(prompt.begin() + begin, prompt.begin() + end);
      if (end == prompt.size()) args.logit_rows = {static_cast<int32_t>(end - begin - 1)};
      backend.forward(args, logits.data());
    }
    return logits;
  };
  const std::vector<float> want = run(*cpu, prompt.size());
  bool all = true;
  for (const size_t chunk : {prompt.size(), size_t(250), size_t(cuda->prefill_chunk())}) {
    const std::vector<float> got = run(*cuda, chunk);
    const double e = rel_error(got.data(), want.data(), shape.vocab);
    char line[256];
    std::snprintf(line, sizeof line, "backend: CUDA vs CPU, a 700-token prompt in commits of %zu: logits rel err %.2e",
                  chunk, e);
    check(e < 2e-2, line);
    all = all && e < 2e-2;
  }
  table.push_back(std::string("| parity backend CUDA vs CPU | ") + (all ? "ok" : "FAIL") + " |");
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void timings(bool quick, std::vector<std::string>& table) {
  ModelShape s = make_shape(2048, 6144, 42, 16, 2, 128, 130560);
  s.rope_theta = 5e6;
  const int longest = quick ? 4096 : 16384;
  s.max_context = longest + 64;
  const double t0 = now_s();
  auto model = random_model(s, 11);
  std::printf("2B shape: random weights made and uploaded in %.1f s; prefill rows per call %d\n", now_s() - t0,
              model->prefill_rows());
  char line[256];
  auto time_it = [&](auto&& body, int repeats) {
    std::vector<double> seconds;
    for (int r = 0; r < repeats; ++r) {
      model->synchronize();
      const double start = now_s();
      body();
      model->synchronize();
      seconds.push_back(now_s() - start);
    }
    return median(seconds);
  };
  const std::vector<int32_t> warm = prompt_tokens(512, s.vocab, 3);
  prefill_prompt(*model, warm, model->prefill_rows());
  decode_prompt(*model, warm);

  table.push_back("");
  table.push_back("| 2B prompt tokens | prefill path tokens/s | decode forwards tokens/s | speed-up |");
  table.push_back("|---|---|---|---|");
  for (const int n : {1024, 4096, 16384}) {
    if (n > longest) continue;
    const std::vector<int32_t> tokens = prompt_tokens(n, s.vocab, 4);
    const double fast = time_it([&] { prefill_prompt(*model, tokens, model->prefill_rows()); }, 3);
    const double slow = time_it([&] { decode_prompt(*model, tokens); }, n > 4096 ? 1 : 2);
    std::snprintf(line, sizeof line, "| %d | %.0f | %.0f | %.2fx |", n, n / fast, n / slow, slow / fast);
    std::printf("2B %s\n", line);
    table.push_back(line);
  }
  // Per chunk along a 16k prompt: the cost per token grows only with attention's keys.
  if (!quick) {
    const std::vector<int32_t> tokens = prompt_tokens(longest, s.vocab, 5);
    std::printf("2B, 2048-row prefill chunks along a %d-token prompt (ms):", longest);
    for (int start = 0; start + 2048 <= longest - 1; start += 2048) {
      const double ms = 1e3 * time_it([&] { model->prefill(0, start, tokens.data() + start, 2048); }, 1);
      std::printf(" %.1f", ms);
    }
    std::printf("\n");
  }
  // Both paths per chunk size at KV 1024 (kPrefillFromRows in cuda_backend.cu).
  table.push_back("");
  // Unless --decode-prefill-gemm 0, the decode forwards are timed on the decode GEMMs and again on the prefill GEMMs.
  const bool both_decodes = g_decode_prefill_gemm > 0;
  table.push_back(std::string("| 2B rows after 1024 cached | prefill call ms") + (g_split > 0 ? " unsplit | split K" : "") +
                  " | decode forwards ms |" + (both_decodes ? " decode forwards on prefill GEMMs ms |" : ""));
  table.push_back(std::string(g_split > 0 ? "|---|---|---|---|" : "|---|---|---|") + (both_decodes ? "---|" : ""));
  const std::vector<int32_t> tokens = prompt_tokens(2048, s.vocab, 6);
  for (const int rows : {32, 64, 128, 256, 512, 2048}) {
    if (1024 + rows > s.max_context) continue;
    // With --split, the model was made with the split on: the unsplit call is timed with it off for a moment.
    ModelOptions unsplit = model->options();
    unsplit.gemm.prefill_split_blocks_per_sm = 0;
    const ModelOptions split = model->options();
    if (g_split > 0) model->reconfigure(unsplit);
    const double fast = time_it([&] { model->prefill(0, 1024, tokens.data(), rows); }, 3);
    if (g_split > 0) model->reconfigure(split);
    const double split_ms = g_split > 0 ? 1e3 * time_it([&] { model->prefill(0, 1024, tokens.data(), rows); }, 3) : 0.0;
    auto decode_forwards = [&] {
      return time_it(
          [&] {
            for (int start = 0; start < rows; start += kMaxRows) {
              decode_forward(*model, 1024 + start, tokens.data() + start, std::min(kMaxRows, rows - start), false);
            }
          },
          3);
    };
    ModelOptions decode_gemms = model->options();
    decode_gemms.decode_prefill_gemm_rows = 0;
    if (both_decodes) model->reconfigure(decode_gemms);
    const double slow = decode_forwards();
    if (both_decodes) model->reconfigure(split);
    const double on_prefill = both_decodes ? decode_forwards() : 0.0;
    if (g_split > 0) std::snprintf(line, sizeof line, "| %d | %.2f | %.2f | %.2f |", rows, 1e3 * fast, split_ms, 1e3 * slow);
    else std::snprintf(line, sizeof line, "| %d | %.2f | %.2f |", rows, 1e3 * fast, 1e3 * slow);
    std::string row = line;
    if (both_decodes) {
      std::snprintf(line, sizeof line, " %.2f |", 1e3 * on_prefill);
      row += line;
    }
    std::printf("2B %s\n", row.c_str());
    table.push_back(row);
  }
  // Where a prefill call's time goes, by kernel kind (each kernel between an event pair, so the sum exceeds the call a
  // little): the decode-sized calls (a few dozen rows) beside the long chunks.
  table.push_back("");
  table.push_back("| 2B rows after 1024 cached | embed + norms ms | qkv | attention | o | gate_up | down | sum |");
  table.push_back("|---|---|---|---|---|---|---|---|");
  for (const int rows : {32, 64, 160, 512, 2048}) {
    if (1024 + rows > s.max_context) continue;
    model->prefill(0, 1024, tokens.data(), rows);  // warm: the split's scratch grown before timing
    model->time_prefill(true);
    for (int r = 0; r < 3; ++r) model->prefill(0, 1024, tokens.data(), rows);
    const PrefillTimes times = model->prefill_times();
    model->time_prefill(false);
    std::string row = "| " + std::to_string(rows) + " |";
    double sum = 0;
    for (const double ms : times.ms) {
      std::snprintf(line, sizeof line, " %.2f |", ms / times.calls);
      row += line;
      sum += ms / times.calls;
    }
    std::snprintf(line, sizeof line, " %.2f |", sum);
    row += line;
    std::printf("2B %s\n", row.c_str());
    table.push_back(row);
  }
}

// Continuous batching past 64 rows on the 2B shape: E sequences after 1,024 cached tokens each, one commit row and a
// window of 4 (block 4, one token a step) with logits at the window rows; one forward of all 5E rows against the
// same sequences in forwards of at most 64 rows (12 a forward, as CudaBackend packs them), and one sequence alone.
// Tokens a second count one token a sequence a forward.
struct BatchForwards {
  static constexpr int kWindow = 4;
  const int cached = g_forward_kv;
  ModelShape s;
  std::unique_ptr<DeviceModel> model;
  explicit BatchForwards(ModelShape shape) : s(shape) {
    s.kv_slots = 48;
    s.max_context = cached + 1024;
    model = random_model(s, 13);
    A2D_CUDA_CHECK(cudaMemset(model->kv_storage(), 0, model->kv_storage_elements() * 2));
  }
  // One forward of sequences first .. first + count - 1: a commit row and a window of kWindow masks each.
  void run(int first, int count) {
    Packed packed;
    for (int e = first; e < first + count; ++e) {
      std::vector<int32_t> part = prompt_tokens(1 + kWindow, s.vocab, e);
      for (int j = 0; j < kWindow; ++j) part[1 + j] = s.mask_token_id;
      packed.add(e, cached, 1, part);
    }
    model->forward(packed.inputs(false));
  }
};

// One forward of `sequences` sequences (forward_rows_timings' kind), after three warm ones, alone between
// cudaProfilerStart and cudaProfilerStop: `ncu --profile-from-start off` lists its kernels and nothing else.
void profile_forward(ModelShape s, int sequences) {
  BatchForwards batch(s);
  if (sequences * (1 + BatchForwards::kWindow) > batch.model->max_forward_rows()) {
    check(false, "profile: " + std::to_string(sequences) + " sequences do not fit one forward of " +
                     std::to_string(batch.model->max_forward_rows()) + " rows (--forward-rows)");
    return;
  }
  for (int i = 0; i < 3; ++i) batch.run(0, sequences);
  batch.model->synchronize();
  A2D_CUDA_CHECK(cudaProfilerStart());
  batch.run(0, sequences);
  batch.model->synchronize();
  A2D_CUDA_CHECK(cudaProfilerStop());
  std::printf("profiled one forward of %d sequences (%d rows)\n", sequences, sequences * (1 + BatchForwards::kWindow));
}

// One prompt of `tokens` tokens on the prefill path (prefill_prompt, as the backend sends it), after one warm
// prompt, alone between cudaProfilerStart and cudaProfilerStop: where a prompt's time goes, kernel by kernel.
void profile_prompt(ModelShape s, int tokens) {
  s.max_context = tokens + 64;
  auto model = random_model(s, 11);
  const std::vector<int32_t> prompt = prompt_tokens(tokens, s.vocab, 4);
  prefill_prompt(*model, prompt, model->prefill_rows());
  model->synchronize();
  A2D_CUDA_CHECK(cudaProfilerStart());
  const double start = now_s();
  prefill_prompt(*model, prompt, model->prefill_rows());
  model->synchronize();
  const double seconds = now_s() - start;
  A2D_CUDA_CHECK(cudaProfilerStop());
  std::printf("profiled one %d-token prompt (prefill calls of up to %d rows, then the last row's forward): %.2f ms\n",
              tokens, model->prefill_rows(), 1e3 * seconds);
}

void forward_rows_timings(ModelShape s, std::vector<std::string>& table) {
  BatchForwards batch(s);
  DeviceModel* model = batch.model.get();
  const int max_rows = model->max_forward_rows();
  const int window = BatchForwards::kWindow, cached = batch.cached;
  auto ms_of = [&](auto&& body) {
    body();  // warm
    std::vector<double> seconds;
    for (int r = 0; r < 5; ++r) {
      model->synchronize();
      const double start = now_s();
      for (int i = 0; i < 10; ++i) body();
      model->synchronize();
      seconds.push_back((now_s() - start) / 10);
    }
    return 1e3 * median(seconds);
  };
  const double single = ms_of([&] { batch.run(0, 1); });
  char line[256];
  std::printf("2B, one sequence after %d cached, block 4: %.3f ms a forward (%.0f tokens/s)\n", cached, single, 1e3 / single);
  table.push_back("");
  table.push_back("| 2B sequences at block 4 (KV " + std::to_string(cached) + ") | rows | one forward ms | forwards of <= 64 rows ms | tokens/s, one forward | "
                  "tokens/s, <= 64 rows | x one sequence (" + std::to_string(int(1e3 / single)) + " tokens/s) |");
  table.push_back("|---|---|---|---|---|---|---|");
  const int per_forward = kMaxRows / (1 + window);
  for (const int sequences : {8, 12, 13, 16, 24, 32, 40, 48}) {
    const int rows = sequences * (1 + window);
    const double split = ms_of([&] {
      for (int first = 0; first < sequences; first += per_forward) batch.run(first, std::min(per_forward, sequences - first));
    });
    const double one = rows <= max_rows ? ms_of([&] { batch.run(0, sequences); }) : NAN;
    const double best = std::isnan(one) ? split : std::min(one, split);
    std::snprintf(line, sizeof line, "| %d | %d | %.3f | %.3f | %.0f | %.0f | %.2f |", sequences, rows, one, split,
                  1e3 * sequences / one, 1e3 * sequences / split, (1e3 * sequences / best) / (1e3 / single));
    std::printf("2B %s\n", line);
    table.push_back(line);
  }
}

}  // namespace

int main(int argc, char** argv) {
  bool skip_2b = false, quick = false, forward_rows_only = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--probe") return 0;
    if (arg == "--skip-2b") skip_2b = true;
    else if (arg == "--quick") quick = true;
    else if (arg == "--split" && i + 1 < argc) g_split = std::atoi(argv[++i]);
    else if (arg == "--shapes" && i + 1 < argc) g_shapes = std::atoi(argv[++i]) != 0;
    else if (arg == "--wgmma" && i + 1 < argc) g_wgmma = std::atoi(argv[++i]) != 0;
    else if (arg == "--wgmma-cluster" && i + 1 < argc) g_wgmma_cluster = std::atoi(argv[++i]) != 0;
    else if (arg == "--wgmma-stream" && i + 1 < argc) g_wgmma_stream = std::atoi(argv[++i]) != 0;
    else if (arg == "--wgmma-stream-min-blocks" && i + 1 < argc) g_wgmma_stream_min_blocks = std::atoi(argv[++i]);
    else if (arg == "--wgmma-tokens" && i + 1 < argc) g_wgmma_tokens = std::atoi(argv[++i]);
    else if (arg == "--split-attention" && i + 1 < argc) g_split_attention = std::atoi(argv[++i]) != 0;
    else if (arg == "--decode-prefill-gemm" && i + 1 < argc) g_decode_prefill_gemm = std::atoi(argv[++i]);
    else if (arg == "--forward-rows" && i + 1 < argc) g_forward_rows = std::atoi(argv[++i]);
    else if (arg == "--forward-rows-only") forward_rows_only = true;  // item 5 alone
    else if (arg == "--attention-typical-blocks" && i + 1 < argc) g_attention_typical_blocks = std::atoi(argv[++i]) != 0;
    else if (arg == "--attention-warp-combine" && i + 1 < argc) g_attention_warp_combine = std::atoi(argv[++i]) != 0;
    else if (arg == "--attention-prefetch" && i + 1 < argc) g_attention_prefetch = std::atoi(argv[++i]) != 0;
    else if (arg == "--forward-kv" && i + 1 < argc) g_forward_kv = std::atoi(argv[++i]);
    else if (arg == "--profile-sequences" && i + 1 < argc) g_profile_sequences = std::atoi(argv[++i]);
    else if (arg == "--profile-prompt" && i + 1 < argc) g_profile_prompt = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: prefill_check [--skip-2b] [--quick] [--split BLOCKS_PER_SM] [--shapes 0|1] [--wgmma 0|1] "
                           "[--wgmma-cluster 0|1] [--wgmma-stream 0|1] [--wgmma-stream-min-blocks N] [--split-attention 0|1] [--decode-prefill-gemm ROWS] "
                           "[--forward-rows N [--forward-rows-only]] [--attention-typical-blocks 0|1] "
                           "[--attention-warp-combine 0|1] [--attention-prefetch 0|1] [--forward-kv N] "
                           "[--profile-sequences N] [--profile-prompt N] "
                           "[--wgmma-tokens 0|64|128|256]\n");
      return 2;
    }
  }
  if (g_forward_kv < 0 || g_forward_kv > (1 << 20)) {
    std::fprintf(stderr, "prefill_check: --forward-kv takes 0 to %d cached tokens, got %d\n", 1 << 20, g_forward_kv);
    return 2;
  }
  std::vector<std::string> table = {"| check | result |", "|---|---|"};
  ModelShape big = make_shape(2048, 6144, 42, 16, 2, 128, 130560);
  big.rope_theta = 5e6;
  if (g_profile_sequences > 0 || g_profile_prompt > 0) {
    try {
      if (g_profile_sequences > 0) profile_forward(big, g_profile_sequences);
      if (g_profile_prompt > 0) profile_prompt(big, g_profile_prompt);
    } catch (const std::exception& e) {
      std::printf("FAIL error: %s\n", e.what());
      ++failures;
    }
    return failures == 0 ? 0 : 1;
  }
  try {
    std::vector<Case> cases;
    ModelShape gqa = make_shape(256, 512, 2, 4, 2, 128, 512);  // RoPE in the QKV epilogue, head_dim 128
    cases.push_back({"gqa hd128", gqa, 700, 256});
    cases.push_back({"gqa hd128, short chunks", gqa, 300, 30});  // the 32-token block shape with --shapes 1
    ModelShape bias = make_shape(256, 384, 2, 8, 2, 64, 400);
    bias.qkv_bias = bias.o_bias = bias.tied_embeddings = true;
    cases.push_back({"qkv+o bias, tied, hd64", bias, 600, 300});
    ModelShape qk = make_shape(256, 512, 2, 4, 4, 64, 300);  // QK-norm: the rope kernel after a plain QKV GEMM
    qk.qk_norm = true;
    cases.push_back({"qk-norm hd64", qk, 500, 200});
    ModelShape padded = make_shape(192, 320, 2, 6, 3, 48, 300);  // head_dim 48, padded to 64
    cases.push_back({"padded hd48", padded, 450, 129});
    ModelShape small = make_shape(256, 512, 3, 8, 8, 32, 300);
    cases.push_back({"mha hd32", small, 333, 2048});
    if (!forward_rows_only) for (const Case& c : cases) parity(c, table);
    if (g_decode_prefill_gemm > 0 && !forward_rows_only) {
      // Forwards of 64 rows and of 40 (the 40-row bucket, a 20-row tail); the shapes whose RoPE the QKV epilogue
      // does (the others keep the decode GEMMs, which this then checks too).
      for (const Case& c : cases) {
        decode_gemm_parity(Case{c.name, c.shape, c.prompt, kMaxRows}, table);
        decode_gemm_parity(Case{c.name + ", 40-row forwards", c.shape, c.prompt, 40}, table);
      }
    }
    if (g_forward_rows > kMaxRows) {
      for (const Case& c : cases) long_forward_parity(c, table);
      batch_parity(cases[0].name, cases[0].shape, 32, 1, 4, table);   // 160 rows, 128 logits rows: two lm_head passes
      batch_parity(cases[0].name, cases[0].shape, 48, 1, 4, table);   // 240 rows, 192: three
      batch_parity(cases[2].name, cases[2].shape, 20, 4, 8, table);   // 240 rows, bias, tied, hd64
    }
    if (!forward_rows_only) backend_parity(table);
    if (!skip_2b) {
      if (!forward_rows_only) {
        parity(Case{"2B shape", big, 2100, 2048}, table);
        parity(Case{"2B shape, short chunks", big, 300, 40}, table);  // 40 rows and a 19-row tail: both small shapes
        if (g_decode_prefill_gemm > 0) decode_gemm_parity(Case{"2B shape", big, 300, kMaxRows}, table);
      }
      if (g_forward_rows > kMaxRows) {
        batch_parity("2B shape", big, 32, 1, 4, table);
        forward_rows_timings(big, table);
      }
      if (!forward_rows_only) timings(quick, table);
    }
  } catch (const std::exception& e) {
    std::printf("FAIL error: %s\n", e.what());
    ++failures;
  }
  std::printf("\n==== prefill summary ====\n");
  for (const std::string& row : table) std::printf("%s\n", row.c_str());
  std::printf("failures: %d\n", failures);
  return failures == 0 ? 0 : 1;
}
