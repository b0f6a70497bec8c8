// The CPU backend: the reference precision of docs/model-format.md (weights as stored, converted to
// fp32 in the inner loops; fp32 activations and KV cache), spread over a small thread pool.
#include <algorithm>
#include <stdexcept>
#include <string>
#include <thread>

#include "backend.h"
#include "cpu_kernels.h"

namespace a2d {

namespace {

struct LayerVectors {
  std::vector<float> input_norm, post_norm, q_norm, k_norm, q_bias, k_bias, v_bias, o_bias;
};

const float* data_or_null(const std::vector<float>& v) { return v.empty() ? nullptr : v.data(); }

// One KV cache slot: per layer [positions, kv_heads * head_dim], grown as the sequence needs.
struct KvSlot {
  std::vector<std::vector<float>> k, v;
  int64_t cached = 0;
};

class CpuBackend final : public Backend {
 public:
  CpuBackend(const Model& model, const BackendOptions& options)
      : Backend(model.config, resolve_max_context(model.config, options.max_context)),
        weights_(model.weights),
        pool_(options.threads > 0 ? options.threads
                                  : std::max(1, static_cast<int>(std::thread::hardware_concurrency()))) {
    if (options.max_batch < 1) throw std::runtime_error("maxBatch must be at least 1");
    // The kernels read the weights in place from the mapped files: read them in now, so that a loaded
    // engine is ready (the first forward would otherwise wait on the disk for every weight).
    for (const auto& file : model.files) file->read_through();
    for (const LayerWeights& L : weights_.layers) {
      layers_.push_back({cpu::to_fp32(L.input_norm), cpu::to_fp32(L.post_norm), cpu::to_fp32(L.q_norm),
                         cpu::to_fp32(L.k_norm), cpu::to_fp32(L.q_bias), cpu::to_fp32(L.k_bias),
                         cpu::to_fp32(L.v_bias), cpu::to_fp32(L.o_bias)});
    }
    final_norm_ = cpu::to_fp32(weights_.final_norm);
    slots_.resize(options.max_batch);
    for (KvSlot& slot : slots_) {
      slot.k.resize(layers_.size());
      slot.v.resize(layers_.size());
    }
  }

  int64_t cached_len() const override { return slots_[0].cached; }
  // A chunk of 256 tokens: about a second of the bundled model on two cores (bench/NOTES.md, "CPU prefill"),
  // and enough rows that the many-row kernels' packing costs under 2 % of it.
  int32_t prefill_chunk() const override { return 256; }
  void reset_cache() override { slots_[0].cached = 0; }

  int32_t max_batch() const override { return static_cast<int32_t>(slots_.size()); }
  int64_t slot_len(int32_t slot) const override { return slots_.at(slot).cached; }
  void reset_slot(int32_t slot) override { slots_.at(slot).cached = 0; }

  void forward(const ForwardArgs& args, float* logits) override { forward_batch({SlotForward{0, &args, nullptr}}, logits); }

  // One forward over every entry's rows, laid one entry after another (entry e's rows from first_[e]): the
  // projections run over all rows at once (each entry's rows multiplied as they would be alone, through
  // matmuls_ranges), attention per entry over its own slot.
  void forward_batch(const std::vector<SlotForward>& batch, float* logits) override {
    const ModelConfig& c = config();
    const int64_t hidden = c.hidden_size, inter = c.intermediate_size, hd = c.head_dim;
    const int64_t q_dim = c.num_heads * hd, kv_dim = c.num_kv_heads * hd;
    const size_t E = batch.size();
    rows_.assign(E, 0);
    first_.assign(E + 1, 0);
    logit_counts_.assign(E, 0);
    check_batch(batch);
    for (size_t e = 0; e < E; ++e) {
      const ForwardArgs& args = *batch[e].args;
      const int64_t T = static_cast<int64_t>(args.commit.size() + args.window.size());
      rows_[e] = T;
      first_[e + 1] = first_[e] + T;
      logit_counts_[e] = static_cast<int64_t>(args.logit_rows.size());
    }
    const int64_t R = first_[E];  // rows of the whole forward

    ids_.clear();
    positions_.resize(R);
    for (size_t e = 0; e < E; ++e) {
      const ForwardArgs& args = *batch[e].args;
      ids_.insert(ids_.end(), args.commit.begin(), args.commit.end());
      ids_.insert(ids_.end(), args.window.begin(), args.window.end());
      const int64_t n = slots_[batch[e].slot].cached;
      for (int64_t r = 0; r < rows_[e]; ++r) positions_[first_[e] + r] = n + r;
    }
    for (int32_t id : ids_) {
      if (id < 0 || id >= c.vocab_size) {
        throw std::runtime_error("token id " + std::to_string(id) + " is outside the vocabulary (0.." +
                                 std::to_string(c.vocab_size - 1) + ")");
      }
    }
    // A row adapter: its factors act on the rows holding the mask token (mask) or on every window row (window),
    // and the window rows holding a real token attend over the revealed positions by its rule (docs/decoding.md);
    // the window rule has the window adapter's attention and no factors.
    const bool ruled = c.adapter_rule != AdapterRule::none;
    adapter_rows_.assign(E, {});
    revealed_.assign(E, {});
    if (ruled) {
      for (size_t e = 0; e < E; ++e) {
        const int64_t C = static_cast<int64_t>(batch[e].args->commit.size());
        for (int64_t r = C; r < rows_[e]; ++r) {
          const bool masked = ids_[first_[e] + r] == c.mask_token_id;
          if (c.adapter_rank > 0 && (masked || c.adapter_rule == AdapterRule::window)) adapter_rows_[e].push_back(r);
          revealed_[e].push_back(masked ? 0 : 1);
        }
      }
    }
    rope_cos_.resize(R * (hd / 2));
    rope_sin_.resize(R * (hd / 2));
    cpu::rope_table(positions_.data(), R, c.head_dim, c.rope_theta, rope_cos_.data(), rope_sin_.data());
    x_.resize(R * hidden);
    h_.resize(R * hidden);
    q_.resize(R * q_dim);
    k_.resize(R * kv_dim);
    v_.resize(R * kv_dim);
    attn_.resize(R * q_dim);
    gate_.resize(R * inter);
    up_.resize(R * inter);
    // The row adapter on one projection, entry by entry (its rows as they would be alone).
    auto low_rank_add = [&](const float* x, int64_t x_stride, const LowRank& ad, float* y, int64_t y_stride) {
      if (c.adapter_rank == 0) return;
      for (size_t e = 0; e < E; ++e) {
        cpu::low_rank_add(pool_, x + first_[e] * x_stride, x_stride, adapter_rows_[e], ad, y + first_[e] * y_stride,
                          y_stride);
      }
    };

    cpu::embed(weights_.embed, ids_.data(), R, x_.data());
    for (size_t l = 0; l < layers_.size(); ++l) {
      const LayerWeights& W = weights_.layers[l];
      const LayerVectors& V = layers_[l];
      cpu::rmsnorm(x_.data(), R, hidden, V.input_norm.data(), c.rms_norm_eps, h_.data());
      cpu::matmuls_ranges(pool_, h_.data(), rows_,
                          {{&W.q, data_or_null(V.q_bias), q_.data()},
                           {&W.k, data_or_null(V.k_bias), k_.data()},
                           {&W.v, data_or_null(V.v_bias), v_.data()}});
      low_rank_add(h_.data(), hidden, W.q_ad, q_.data(), q_dim);
      low_rank_add(h_.data(), hidden, W.k_ad, k_.data(), kv_dim);
      low_rank_add(h_.data(), hidden, W.v_ad, v_.data(), kv_dim);
      if (c.qk_norm) {
        cpu::rmsnorm(q_.data(), R * c.num_heads, hd, V.q_norm.data(), c.rms_norm_eps, q_.data());
        cpu::rmsnorm(k_.data(), R * c.num_kv_heads, hd, V.k_norm.data(), c.rms_norm_eps, k_.data());
      }
      cpu::rope_rotate(q_.data(), R, q_dim, c.num_heads, c.head_dim, rope_cos_.data(), rope_sin_.data());
      cpu::rope_rotate(k_.data(), R, kv_dim, c.num_kv_heads, c.head_dim, rope_cos_.data(), rope_sin_.data());
      for (size_t e = 0; e < E; ++e) {
        // The entry's keys and values go into its slot at positions n..n+T-1; only the commit rows count as
        // cached afterwards, the window's are overwritten by the slot's next forward.
        KvSlot& slot = slots_[batch[e].slot];
        const ForwardArgs& args = *batch[e].args;
        const int64_t n = slot.cached, T = rows_[e], C = static_cast<int64_t>(args.commit.size());
        std::vector<float>& k_cache = slot.k[l];
        std::vector<float>& v_cache = slot.v[l];
        k_cache.resize(std::max<size_t>(k_cache.size(), (n + T) * kv_dim));
        v_cache.resize(std::max<size_t>(v_cache.size(), (n + T) * kv_dim));
        std::copy_n(k_.data() + first_[e] * kv_dim, T * kv_dim, k_cache.data() + n * kv_dim);
        std::copy_n(v_.data() + first_[e] * kv_dim, T * kv_dim, v_cache.data() + n * kv_dim);
        cpu::attention(pool_, q_.data() + first_[e] * q_dim, k_cache.data(), v_cache.data(), n, C, T, c.num_heads,
                       c.num_kv_heads, c.head_dim, attn_.data() + first_[e] * q_dim, ruled ? &revealed_[e] : nullptr,
                       c.adapter_rule);
      }
      cpu::matmuls_ranges(pool_, attn_.data(), rows_, {{&W.o, data_or_null(V.o_bias), h_.data()}});
      low_rank_add(attn_.data(), q_dim, W.o_ad, h_.data(), hidden);
      cpu::add(x_.data(), h_.data(), R * hidden);

      cpu::rmsnorm(x_.data(), R, hidden, V.post_norm.data(), c.rms_norm_eps, h_.data());
      cpu::matmuls_ranges(pool_, h_.data(), rows_, {{&W.gate, nullptr, gate_.data()}, {&W.up, nullptr, up_.data()}});
      low_rank_add(h_.data(), hidden, W.gate_ad, gate_.data(), inter);
      low_rank_add(h_.data(), hidden, W.up_ad, up_.data(), inter);
      for (size_t e = 0; e < E; ++e) {  // entry by entry: the vectorised loop's tail would move with the offset
        cpu::silu_mul(gate_.data() + first_[e] * inter, up_.data() + first_[e] * inter, rows_[e] * inter);
      }
      cpu::matmuls_ranges(pool_, gate_.data(), rows_, {{&W.down, nullptr, h_.data()}});
      low_rank_add(gate_.data(), inter, W.down_ad, h_.data(), hidden);
      cpu::add(x_.data(), h_.data(), R * hidden);
    }

    // Final norm and lm_head only on the rows the decoder asked for, entry after entry.
    int64_t logit_rows = 0;
    for (int64_t count : logit_counts_) logit_rows += count;
    h_.resize(std::max(logit_rows, R) * hidden);
    int64_t i = 0;
    for (size_t e = 0; e < E; ++e) {
      for (int32_t row : batch[e].args->logit_rows) {
        cpu::rmsnorm(x_.data() + (first_[e] + row) * hidden, 1, hidden, final_norm_.data(), c.rms_norm_eps,
                     h_.data() + i * hidden);
        ++i;
      }
    }
    if (logit_rows > 0) cpu::matmuls_ranges(pool_, h_.data(), logit_counts_, {{&weights_.lm_head, nullptr, logits}});
    for (const SlotForward& entry : batch) slots_[entry.slot].cached += static_cast<int64_t>(entry.args->commit.size());
  }

 private:
  const ModelWeights& weights_;
  ThreadPool pool_;
  std::vector<LayerVectors> layers_;
  std::vector<float> final_norm_;
  std::vector<KvSlot> slots_;
  // Per entry of the forward: its rows, its first row, its logits rows, its row adapter's rows and flags.
  std::vector<int64_t> rows_, first_, logit_counts_;
  std::vector<std::vector<int64_t>> adapter_rows_;
  std::vector<std::vector<uint8_t>> revealed_;
  std::vector<int32_t> ids_;
  std::vector<int64_t> positions_;  // per row of the forward: its RoPE position
  std::vector<float> rope_cos_, rope_sin_;  // per row: cos and sin of its position's angles, for every layer
  std::vector<float> x_, h_, q_, k_, v_, attn_, gate_, up_;  // activations, reused across forwards
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const Model& model, const BackendOptions& options) {
  return std::make_unique<CpuBackend>(model, options);
}

}  // namespace a2d
