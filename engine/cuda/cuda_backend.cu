// The CUDA Backend behind backend.h: uploads an a2d::Model into a DeviceModel and runs the decode
// loop's forwards on it, one sequence or several at once (continuous batching: a KV cache slot each). The leading
// commit rows of a sequence's forward, up to its first logits row, run as prefill forwards (DeviceModel::prefill,
// many-row kernels) where they number at least kPrefillFromRows; the rest as forwards of at most kMaxRows rows (the
// captured graphs), the last part of every sequence of a batch packed together.
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

cuda::ModelShape shape_of(const ModelConfig& config, int64_t max_context, int32_t slots) {
  cuda::ModelShape s;
  s.kv_slots = std::max<int32_t>(1, slots);
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
// after 1024 cached (bench/NOTES.md, run 111): with its GEMMs' K split a prefill call costs about 9.6 ms at 64
// rows and 10.3 at 128, the 64-row decode forwards about 97 us a row (6.2 and 12.4 ms); the prefill call wins
// from 128 rows and loses at 64.
constexpr int kPrefillFromRows = 128;

// Continuous batching (docs/decoding.md, "Several sequences at once"): each sequence has a KV cache slot of the
// DeviceModel's. A batch's sequences run their long prompt parts alone (the prefill kernels, then commit-only
// forwards of kMaxRows rows), and their last parts, each at most kMaxRows rows with the window, packed together into
// forwards of up to DeviceModel::max_forward_rows() rows: one stream of the weights for every sequence in it.
class CudaBackend final : public Backend {
 public:
  CudaBackend(const Model& model, int64_t max_context, int32_t max_batch)
      : Backend(model.config, max_context),
        device_(shape_of(model.config, max_context, std::min<int32_t>(max_batch, cuda::kMaxRows)), cuda::ModelOptions{}),
        slots_(device_.slots()) {
    if (max_batch < 1) throw std::runtime_error("maxBatch must be at least 1");
    upload_model(device_, model);
    warm_up();
  }

  void forward(const ForwardArgs& args, float* logits) override { forward_batch({SlotForward{0, &args, nullptr}}, logits); }

  int64_t cached_len() const override { return slots_[0].cached; }
  int32_t max_window() const override { return cuda::kMaxRows; }
  // FP8 models have no prefill kernels (prefill_rows() 0): their prompts go through the graphs' largest forwards.
  int32_t prefill_chunk() const override { return device_.prefill_rows() > 0 ? device_.prefill_rows() : cuda::kMaxRows; }
  // A part of more than kMaxRows rows runs its leading rows alone (run below).
  int32_t alone_prompt_rows() const override { return cuda::kMaxRows + 1; }
  void reset_cache() override { reset_slot(0); }

  int32_t max_batch() const override { return static_cast<int32_t>(slots_.size()); }
  int64_t slot_len(int32_t slot) const override { return slots_.at(slot).cached; }
  void reset_slot(int32_t slot) override { slots_.at(slot) = Slot{}; }

  StepResult step(const ForwardArgs& args, const RevealArgs* reveal) override {
    return step_batch({SlotForward{0, &args, reveal}}).front();
  }

  void forward_batch(const std::vector<SlotForward>& batch, float* logits) override {
    const int32_t vocab = config().vocab_size;
    std::vector<float*> destinations;
    size_t first = 0;
    for (const SlotForward& entry : batch) {
      destinations.push_back(logits == nullptr ? nullptr : logits + first * vocab);
      first += entry.args->logit_rows.size();
    }
    run(batch, destinations);
  }

  // At temperature 0 a candidate's token and confidence are the GPU's argmax and probability (two numbers a row);
  // a sampling entry brings its logits rows to the host and applies the shared host rule, so every backend makes
  // the same choices from the same logits.
  std::vector<StepResult> step_batch(const std::vector<SlotForward>& batch) override {
    const int32_t vocab = config().vocab_size;
    std::vector<float*> destinations(batch.size(), nullptr);
    for (size_t e = 0; e < batch.size(); ++e) {
      const RevealArgs* reveal = batch[e].reveal;
      if (reveal == nullptr || reveal->temperature <= 0.0) continue;
      std::vector<float>& buffer = slots_.at(batch[e].slot).host_logits;
      buffer.resize(batch[e].args->logit_rows.size() * static_cast<size_t>(vocab));
      destinations[e] = buffer.data();
    }
    run(batch, destinations);
    std::vector<StepResult> results(batch.size());
    for (size_t e = 0; e < batch.size(); ++e) {
      const RevealArgs* reveal = batch[e].reveal;
      if (reveal != nullptr) results[e] = reveal_entry(slots_[batch[e].slot], *reveal, destinations[e] != nullptr);
    }
    return results;
  }

 private:
  // One KV cache slot: its tokens cached, the last forward's choices of its logits rows, and its anchor.
  struct Slot {
    int64_t cached = 0;
    std::vector<cuda::TokenChoice> choices;  // per logits row of its last forward
    std::vector<float> host_logits;          // its logits rows, when it samples
    cuda::TokenChoice anchor_choice{-1, 0.f};
    std::vector<float> host_anchor;
    bool anchor_on_host = false;
  };

  StepResult reveal_entry(Slot& slot, const RevealArgs& reveal, bool sampling) {
    const int32_t vocab = config().vocab_size;
    const int32_t n = static_cast<int32_t>(reveal.candidates.size());
    std::vector<Choice> picked(n);
    for (int32_t c = 0; c < n; ++c) {
      const int32_t source = reveal.candidate_rows[c];
      if (!sampling) {
        const cuda::TokenChoice choice = source == kAnchorLogits ? slot.anchor_choice : slot.choices.at(source);
        picked[c] = {choice.token, static_cast<double>(choice.confidence)};
      } else {
        const float* row = source == kAnchorLogits ? anchor_logits(slot) : slot.host_logits.data() + size_t(source) * vocab;
        picked[c] = choose_token(row, vocab, reveal.mask_token_id, reveal.temperature, reveal.top_p, reveal.sample_draws.at(c));
      }
    }
    return reveal_choices(reveal, picked);
  }

  // Every graph runs once before the engine reports ready, so no first-launch cost lands on a request: each row
  // bucket alone, and with as many sequences as each of its captured sequence counts holds (window rows on empty
  // slots, which the next sequence of a slot overwrites).
  void warm_up() {
    const int most = device_.max_forward_rows();
    std::vector<int32_t> tokens(most, 0);
    std::vector<int32_t> rows(most);
    for (int i = 0; i < most; ++i) rows[i] = i;
    const int64_t limit = std::min<int64_t>(most, max_context());
    const int slots = device_.slots();
    for (int b = 1; b <= cuda::kRowBuckets && cuda::bucket_rows(b) <= limit; ++b) {
      const int bucket = cuda::bucket_rows(b);
      cuda::ForwardInputs in;
      in.tokens = tokens.data();
      in.rows = bucket;
      in.logit_rows = rows.data();
      in.logit_count = bucket;
      in.write_logits = true;
      device_.forward(in);
      for (int e = 1; e < cuda::kEntryBuckets; ++e) {
        const int count = std::min({1 << e, slots, bucket});
        if (count <= (1 << (e - 1))) break;
        if (bucket > count * cuda::kMaxRows) continue;  // a sequence's part holds at most kMaxRows rows
        std::vector<cuda::ForwardEntry> entries(count);
        for (int i = 0; i < count; ++i) entries[i] = {i, 0, 0, bucket / count + (i < bucket % count ? 1 : 0)};
        in.entries = entries.data();
        in.entry_count = count;
        device_.forward(in);
      }
    }
    // And the prefill kernels once (their first launch loads them); the cache stays empty (cached is 0).
    const int prefill = static_cast<int>(std::min<int64_t>(device_.prefill_rows(), kPrefillFromRows));
    if (prefill > 0) device_.prefill(0, 0, tokens.data(), std::min<int>(prefill, static_cast<int>(tokens.size())));
    device_.synchronize();
  }

  const float* anchor_logits(Slot& slot) {
    if (!slot.anchor_on_host) {
      slot.host_anchor.resize(config().vocab_size);
      device_.copy_anchor_logits(static_cast<int>(&slot - slots_.data()), slot.host_anchor.data());
      slot.anchor_on_host = true;
    }
    return slot.host_anchor.data();
  }

  // The part of one sequence's rows that one device forward runs: rows [start, start + rows) of its commit ++ window
  // tokens, the first `commit` of them committed, and its logits rows among them (indices into its logit_rows).
  struct Part {
    size_t entry;
    int start;
    int rows;
    int commit;
    size_t first_logit;
    size_t logits;
  };

  // Every entry checked first (check_batch, and the window's bound); then the leading parts of each sequence alone
  // (the prefill kernels for long commits before its first logits row, then commit-only forwards of kMaxRows rows),
  // then the last parts of all, packed into forwards of at most max_forward_rows() rows in the batch's order. Collects every
  // logits row's choice into its slot, and the fp32 logits of an entry whose destination is set.
  void run(const std::vector<SlotForward>& batch, const std::vector<float*>& destinations) {
    check_batch(batch);
    for (const SlotForward& entry : batch) {
      if (entry.args->window.size() > static_cast<size_t>(cuda::kMaxRows)) {
        throw std::runtime_error("the CUDA backend runs blocks of up to " + std::to_string(cuda::kMaxRows) +
                                 " tokens; got a window of " + std::to_string(entry.args->window.size()));
      }
    }
    std::vector<std::vector<int32_t>> tokens(batch.size());
    std::vector<Part> last_parts;
    for (size_t e = 0; e < batch.size(); ++e) {
      const int32_t slot_index = batch[e].slot;
      const ForwardArgs& args = *batch[e].args;
      Slot& slot = slots_[slot_index];
      const int C = static_cast<int>(args.commit.size());
      const int W = static_cast<int>(args.window.size());
      tokens[e] = args.commit;
      tokens[e].insert(tokens[e].end(), args.window.begin(), args.window.end());
      slot.choices.assign(args.logit_rows.size(), cuda::TokenChoice{-1, 0.f});

      // The commit rows before the first logits row, through the prefill kernels when they are many.
      const int first_logit = args.logit_rows.empty() ? C : std::min(C, args.logit_rows.front());
      const int prefilled = device_.prefill_rows() > 0 && first_logit >= kPrefillFromRows ? first_logit : 0;
      for (int start = 0; start < prefilled;) {
        const int rows = std::min(device_.prefill_rows(), prefilled - start);
        device_.prefill(slot_index, static_cast<int>(slot.cached), tokens[e].data() + start, rows);
        slot.cached += rows;
        start += rows;
      }
      size_t next_logit = 0;
      for (int start = prefilled; start < C + W;) {
        const int commit_left = C - start;
        const bool last = commit_left + W <= cuda::kMaxRows;
        const int rows = last ? C + W - start : std::min(cuda::kMaxRows, commit_left);
        Part part{e, start, rows, last ? commit_left : rows, next_logit, 0};
        while (next_logit < args.logit_rows.size() && args.logit_rows[next_logit] < start + rows) ++next_logit;
        part.logits = next_logit - part.first_logit;
        if (last) {
          last_parts.push_back(part);
        } else {
          run_forward(batch, destinations, tokens, {part});
        }
        start += rows;
      }
    }
    std::vector<Part> group;
    int group_rows = 0;
    const int forward_rows = device_.max_forward_rows();
    for (const Part& part : last_parts) {
      if (group_rows + part.rows > forward_rows) {
        run_forward(batch, destinations, tokens, group);
        group.clear();
        group_rows = 0;
      }
      group.push_back(part);
      group_rows += part.rows;
    }
    if (!group.empty()) run_forward(batch, destinations, tokens, group);
  }

  // One device forward of parts of different sequences (one part: the sequence alone, on its slot).
  void run_forward(const std::vector<SlotForward>& batch, const std::vector<float*>& destinations,
                   const std::vector<std::vector<int32_t>>& tokens, const std::vector<Part>& parts) {
    const int32_t vocab = config().vocab_size;
    std::vector<int32_t> rows_tokens, logit_rows;
    std::vector<cuda::ForwardEntry> entries;
    std::vector<std::pair<int32_t, int>> anchors;  // (slot, index in this forward's logits rows)
    bool write_logits = false;
    for (const Part& part : parts) {
      const ForwardArgs& args = *batch[part.entry].args;
      const int32_t slot = batch[part.entry].slot;
      const int row0 = static_cast<int>(rows_tokens.size());
      rows_tokens.insert(rows_tokens.end(), tokens[part.entry].begin() + part.start,
                         tokens[part.entry].begin() + part.start + part.rows);
      for (size_t i = part.first_logit; i < part.first_logit + part.logits; ++i) {
        if (args.logit_rows[i] == args.anchor_row) anchors.emplace_back(slot, static_cast<int>(logit_rows.size()));
        logit_rows.push_back(row0 + args.logit_rows[i] - part.start);
      }
      entries.push_back({slot, static_cast<int>(slots_[slot].cached), part.commit, part.rows});
      write_logits = write_logits || (destinations[part.entry] != nullptr && part.logits > 0);
    }
    device_.forward(cuda::forward_inputs(rows_tokens, logit_rows, entries, write_logits || !anchors.empty()));
    for (const auto& [slot, index] : anchors) device_.keep_anchor(slot, index);
    if (!logit_rows.empty()) {
      choices_.resize(logit_rows.size());
      device_.copy_choices(choices_.data(), static_cast<int>(logit_rows.size()));
    }
    size_t first = 0;  // the part's first row among this forward's logits rows
    for (const Part& part : parts) {
      Slot& slot = slots_[batch[part.entry].slot];
      std::copy_n(choices_.begin() + first, part.logits, slot.choices.begin() + part.first_logit);
      if (destinations[part.entry] != nullptr && part.logits > 0) {
        device_.copy_logits(destinations[part.entry] + part.first_logit * vocab, static_cast<int>(first),
                            static_cast<int>(part.logits));
      }
      first += part.logits;
      slot.cached += part.commit;
    }
    for (const auto& anchor : anchors) {
      Slot& slot = slots_[anchor.first];
      slot.anchor_choice = choices_[anchor.second];
      slot.anchor_on_host = false;
    }
  }

  cuda::DeviceModel device_;
  std::vector<Slot> slots_;
  std::vector<cuda::TokenChoice> choices_;  // the last device forward's logits rows
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(const Model& model, const BackendOptions& options) {
  return std::make_unique<CudaBackend>(model, resolve_max_context(model.config, options.max_context), options.max_batch);
}

}  // namespace a2d
