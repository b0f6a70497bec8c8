// The CUDA Backend behind backend.h: uploads an a2d::Model into a DeviceModel and runs the decode
// loop's forwards on it. The leading commit rows of a forward, up to its first logits row, run as prefill
// forwards (DeviceModel::prefill, many-row kernels) where they number at least kPrefillFromRows; the rest as
// forwards of at most kMaxRows rows (the captured graphs).
// At temperature 0 a denoising step brings back two numbers per candidate (argmax token and its
// probability, computed on the GPU); sampling at temperature > 0 brings back the needed logits rows and
// applies the shared host rule, so every backend makes the same choices from the same logits.
#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend.h"
#include "model.cuh"
#include "reveal.h"

namespace a2d {
namespace {

cuda::SourceType source_type(DType dtype) {
  switch (dtype) {
    case DType::bf16: return cuda::SourceType::bf16;
    case DType::f16: return cuda::SourceType::f16;
    case DType::f32: return cuda::SourceType::f32;
    case DType::f8_e4m3: return cuda::SourceType::f8_e4m3;
    case DType::i32: break;  // rejected at load
  }
  throw std::runtime_error("unsupported weight dtype");
}

cuda::ModelShape shape_of(const ModelConfig& config, int64_t max_context) {
  cuda::ModelShape s;
  s.hidden = config.hidden_size;
  s.intermediate = config.intermediate_size;
  s.layers = config.num_layers;
  s.heads = config.num_heads;
  s.kv_heads = config.num_kv_heads;
  s.head_dim = config.head_dim;
  s.vocab = config.vocab_size;
  s.rms_eps = static_cast<float>(config.rms_norm_eps);
  s.rope_theta = config.rope_theta;
  s.tied_embeddings = config.tie_word_embeddings;
  s.qkv_bias = config.qkv_bias;
  s.o_bias = config.o_bias;
  s.qk_norm = config.qk_norm;
  s.mask_token_id = config.mask_token_id;
  s.max_context = static_cast<int>(max_context);
  s.adapter_rank = config.adapter_rank;
  s.adapter_on_window = config.adapter_rule == AdapterRule::window;
  s.fp8 = config.precision == WeightPrecision::fp8_e4m3;
  for (int i = 0; i < 7; ++i) {
    if (config.has_adapter(kAdapterTargets[i])) s.adapter_targets |= 1u << i;
  }
  return s;
}

void upload_model(cuda::DeviceModel& device, const Model& model) {
  using W = cuda::WeightName;
  auto put = [&](W name, int layer, const Tensor& tensor) {
    if (!tensor.present()) return;
    device.upload(name, layer, cuda::WeightSource{tensor.data, source_type(tensor.dtype), false, tensor.scale});
  };
  const ModelWeights& w = model.weights;
  put(W::embed, 0, w.embed);
  if (!model.config.tie_word_embeddings) put(W::lm_head, 0, w.lm_head);
  put(W::final_norm, 0, w.final_norm);
  for (int l = 0; l < static_cast<int>(w.layers.size()); ++l) {
    const LayerWeights& L = w.layers[l];
    put(W::input_norm, l, L.input_norm);
    put(W::post_norm, l, L.post_norm);
    put(W::q, l, L.q);
    put(W::k, l, L.k);
    put(W::v, l, L.v);
    put(W::o, l, L.o);
    put(W::q_bias, l, L.q_bias);
    put(W::k_bias, l, L.k_bias);
    put(W::v_bias, l, L.v_bias);
    put(W::o_bias, l, L.o_bias);
    put(W::q_norm, l, L.q_norm);
    put(W::k_norm, l, L.k_norm);
    put(W::gate, l, L.gate);
    put(W::up, l, L.up);
    put(W::down, l, L.down);
    using T = cuda::AdapterTarget;
    const std::pair<T, const LowRank*> adapters[] = {{T::q, &L.q_ad},       {T::k, &L.k_ad},   {T::v, &L.v_ad},
                                                     {T::o, &L.o_ad},       {T::gate, &L.gate_ad}, {T::up, &L.up_ad},
                                                     {T::down, &L.down_ad}};
    for (const auto& [target, ad] : adapters) {
      if (!ad->present()) continue;
      device.upload_adapter(target, l, cuda::WeightSource{ad->a.data, source_type(ad->a.dtype), false},
                                 cuda::WeightSource{ad->b.data, source_type(ad->b.dtype), false});
    }
  }
  device.finish_upload();
}

// Commit rows from which a forward's leading rows take the prefill kernels. Measured on the H200, 2B shape,
// after 1024 cached (bench/NOTES.md, "CUDA prefill, first run"): a prefill call costs about 15 ms plus 24 us a
// row (its weight blocks of 128 rows leave most SMs idle when the tokens are few), the 64-row decode forwards
// about 98 us a row; the prefill call wins from 256 rows (21 against 25 ms) and loses at 128 (18 against 13).
constexpr int kPrefillFromRows = 256;

class CudaBackend final : public Backend {
 public:
  CudaBackend(const Model& model, int64_t max_context)
      : Backend(model.config, max_context), device_(shape_of(model.config, max_context), cuda::ModelOptions{}) {
    upload_model(device_, model);
    warm_up();
  }

  void forward(const ForwardArgs& args, float* logits) override { run(args, logits); }

  int64_t cached_len() const override { return cached_; }
  int32_t max_window() const override { return cuda::kMaxRows; }
  // FP8 models have no prefill kernels (prefill_rows() 0): their prompts go through the graphs' largest forwards.
  int32_t prefill_chunk() const override { return device_.prefill_rows() > 0 ? device_.prefill_rows() : cuda::kMaxRows; }
  void reset_cache() override { cached_ = 0; }

  StepResult step(const ForwardArgs& args, const RevealArgs* reveal) override {
    const bool sampling = reveal != nullptr && reveal->temperature > 0.0;
    const int32_t vocab = config().vocab_size;
    if (sampling) host_logits_.resize(args.logit_rows.size() * static_cast<size_t>(vocab));
    run(args, sampling ? host_logits_.data() : nullptr);
    if (args.anchor_row >= 0) {
      const auto it = std::find(args.logit_rows.begin(), args.logit_rows.end(), args.anchor_row);
      if (it == args.logit_rows.end()) throw std::logic_error("anchor_row must be one of logit_rows");
      anchor_choice_ = choices_[it - args.logit_rows.begin()];
      anchor_on_host_ = false;
    }
    if (reveal == nullptr) return {};

    const int32_t n = static_cast<int32_t>(reveal->candidates.size());
    std::vector<Choice> picked(n);
    std::vector<double> confidences(n);
    for (int32_t c = 0; c < n; ++c) {
      const int32_t source = reveal->candidate_rows[c];
      if (!sampling) {
        const cuda::TokenChoice choice = source == kAnchorLogits ? anchor_choice_ : choices_.at(source);
        picked[c] = {choice.token, static_cast<double>(choice.confidence)};
      } else {
        const float* row = source == kAnchorLogits ? anchor_logits() : host_logits_.data() + size_t(source) * vocab;
        picked[c] = choose_token(row, vocab, reveal->mask_token_id, reveal->temperature, reveal->top_p,
                                 reveal->sample_draws.at(c));
      }
      confidences[c] = picked[c].confidence;
    }
    const std::vector<double>& priorities = reveal->priority_draws.empty() ? confidences : reveal->priority_draws;
    StepResult result;
    for (int32_t c : select_reveals(confidences, priorities, reveal->threshold, reveal->min_reveal)) {
      result.revealed.push_back({reveal->candidates[c], picked[c].token, picked[c].confidence});
    }
    return result;
  }

 private:
  // Every graph runs once before the engine reports ready, so no first-launch cost lands on a request.
  void warm_up() {
    std::vector<int32_t> tokens(cuda::kMaxRows, 0);
    std::vector<int32_t> rows(cuda::kMaxRows);
    for (int i = 0; i < cuda::kMaxRows; ++i) rows[i] = i;
    const int64_t limit = std::min<int64_t>(cuda::kMaxRows, max_context());
    for (int bucket = 8; bucket <= limit; bucket += 8) {
      cuda::ForwardInputs in;
      in.tokens = tokens.data();
      in.rows = bucket;
      in.logit_rows = rows.data();
      in.logit_count = bucket;
      in.write_logits = true;
      device_.forward(in);
    }
    // And the prefill kernels once (their first launch loads them); the cache stays empty (cached_ is 0).
    const int prefill = static_cast<int>(std::min<int64_t>(device_.prefill_rows(), kPrefillFromRows));
    if (prefill > 0) device_.prefill(0, tokens.data(), std::min<int>(prefill, static_cast<int>(tokens.size())));
    device_.synchronize();
  }

  const float* anchor_logits() {
    if (!anchor_on_host_) {
      host_anchor_.resize(config().vocab_size);
      device_.copy_anchor_logits(host_anchor_.data());
      anchor_on_host_ = true;
    }
    return host_anchor_.data();
  }

  // Runs the forward in chunks of at most kMaxRows rows: commit-only chunks first, then the rest of the
  // commit with the whole window. Collects the choices of every logits row and, when `logits` is set,
  // their fp32 logits.
  void run(const ForwardArgs& args, float* logits) {
    const int C = static_cast<int>(args.commit.size());
    const int W = static_cast<int>(args.window.size());
    if (W > cuda::kMaxRows) {
      throw std::runtime_error("the CUDA backend runs blocks of up to " + std::to_string(cuda::kMaxRows) +
                               " tokens; got a window of " + std::to_string(W));
    }
    if (cached_ + C + W > max_context()) {
      throw std::runtime_error("forward needs " + std::to_string(cached_ + C + W) +
                               " positions, more than the engine's context of " + std::to_string(max_context()));
    }
    std::vector<int32_t> tokens(args.commit);
    tokens.insert(tokens.end(), args.window.begin(), args.window.end());
    const int32_t vocab = config().vocab_size;
    choices_.assign(args.logit_rows.size(), cuda::TokenChoice{-1, 0.f});

    // The commit rows before the first logits row, through the prefill kernels when they are many.
    const int first_logit = args.logit_rows.empty() ? C : std::min(C, args.logit_rows.front());
    const int prefilled = device_.prefill_rows() > 0 && first_logit >= kPrefillFromRows ? first_logit : 0;
    for (int start = 0; start < prefilled;) {
      const int rows = std::min(device_.prefill_rows(), prefilled - start);
      device_.prefill(static_cast<int>(cached_), tokens.data() + start, rows);
      cached_ += rows;
      start += rows;
    }

    size_t next_logit = 0;
    for (int start = prefilled; start < C + W;) {
      const int commit_left = C - start;
      const bool last = commit_left + W <= cuda::kMaxRows;
      const int rows = last ? C + W - start : std::min(cuda::kMaxRows, commit_left);
      std::vector<int32_t> local;
      int anchor_index = -1;
      const size_t first_logit = next_logit;
      while (next_logit < args.logit_rows.size() && args.logit_rows[next_logit] < start + rows) {
        if (args.logit_rows[next_logit] == args.anchor_row) anchor_index = static_cast<int>(local.size());
        local.push_back(args.logit_rows[next_logit] - start);
        ++next_logit;
      }
      cuda::ForwardInputs in;
      in.cached = static_cast<int>(cached_);
      in.commit = last ? commit_left : rows;
      in.tokens = tokens.data() + start;
      in.rows = rows;
      in.logit_rows = local.data();
      in.logit_count = static_cast<int>(local.size());
      in.write_logits = logits != nullptr || anchor_index >= 0;
      device_.forward(in);
      if (anchor_index >= 0) device_.keep_anchor(anchor_index);
      if (!local.empty()) {
        device_.copy_choices(choices_.data() + first_logit, static_cast<int>(local.size()));
        if (logits != nullptr) device_.copy_logits(logits + first_logit * vocab, static_cast<int>(local.size()));
      }
      cached_ += in.commit;
      start += rows;
    }
    if (next_logit != args.logit_rows.size()) throw std::runtime_error("logit_rows must be ascending row indices");
  }

  cuda::DeviceModel device_;
  int64_t cached_ = 0;
  std::vector<cuda::TokenChoice> choices_;  // per logits row of the last forward
  std::vector<float> host_logits_;
  cuda::TokenChoice anchor_choice_{-1, 0.f};
  std::vector<float> host_anchor_;
  bool anchor_on_host_ = false;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(const Model& model, const BackendOptions& options) {
  return std::make_unique<CudaBackend>(model, resolve_max_context(model.config, options.max_context));
}

}  // namespace a2d
