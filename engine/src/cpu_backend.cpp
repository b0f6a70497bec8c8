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

class CpuBackend final : public Backend {
 public:
  CpuBackend(const Model& model, const BackendOptions& options)
      : Backend(model.config, resolve_max_context(model.config, options.max_context)),
        weights_(model.weights),
        pool_(options.threads > 0 ? options.threads
                                  : std::max(1, static_cast<int>(std::thread::hardware_concurrency()))) {
    // The kernels read the weights in place from the mapped files: read them in now, so that a loaded
    // engine is ready (the first forward would otherwise wait on the disk for every weight).
    for (const auto& file : model.files) file->read_through();
    for (const LayerWeights& L : weights_.layers) {
      layers_.push_back({cpu::to_fp32(L.input_norm), cpu::to_fp32(L.post_norm), cpu::to_fp32(L.q_norm),
                         cpu::to_fp32(L.k_norm), cpu::to_fp32(L.q_bias), cpu::to_fp32(L.k_bias),
                         cpu::to_fp32(L.v_bias), cpu::to_fp32(L.o_bias)});
    }
    final_norm_ = cpu::to_fp32(weights_.final_norm);
    k_cache_.resize(layers_.size());
    v_cache_.resize(layers_.size());
  }

  int64_t cached_len() const override { return cached_; }
  // A chunk of 256 tokens: about a second of the bundled model on two cores (bench/NOTES.md, "CPU prefill"),
  // and enough rows that the many-row kernels' packing costs under 2 % of it.
  int32_t prefill_chunk() const override { return 256; }
  void reset_cache() override { cached_ = 0; }

  void forward(const ForwardArgs& args, float* logits) override {
    const ModelConfig& c = config();
    const int64_t n = cached_;
    const int64_t C = static_cast<int64_t>(args.commit.size());
    const int64_t T = C + static_cast<int64_t>(args.window.size());
    if (n + T > max_context()) {
      throw std::runtime_error("forward of " + std::to_string(T) + " tokens after " + std::to_string(n) +
                               " cached exceeds the engine's context of " + std::to_string(max_context()));
    }
    const int64_t hidden = c.hidden_size, inter = c.intermediate_size, hd = c.head_dim;
    const int64_t q_dim = c.num_heads * hd, kv_dim = c.num_kv_heads * hd;

    for (int32_t row : args.logit_rows) {
      if (row < 0 || row >= T) {
        throw std::runtime_error("logits row " + std::to_string(row) + " is outside the forward's " +
                                 std::to_string(T) + " rows");
      }
    }
    std::vector<int32_t> ids(args.commit);
    ids.insert(ids.end(), args.window.begin(), args.window.end());
    for (int32_t id : ids) {
      if (id < 0 || id >= c.vocab_size) {
        throw std::runtime_error("token id " + std::to_string(id) + " is outside the vocabulary (0.." +
                                 std::to_string(c.vocab_size - 1) + ")");
      }
    }
    // The mask adapter: its factors act on the rows holding the mask token, and the other window rows
    // attend causally over the revealed positions (docs/decoding.md, "Mask adapter").
    const bool adapter = c.mask_adapter_rank > 0;
    std::vector<int64_t> masked_rows;
    std::vector<uint8_t> revealed;
    if (adapter) {
      for (int64_t r = C; r < T; ++r) {
        const bool masked = ids[r] == c.mask_token_id;
        if (masked) masked_rows.push_back(r);
        revealed.push_back(masked ? 0 : 1);
      }
    }
    const int64_t W = T - C;
    if (args.has_layout() && (static_cast<int64_t>(args.window_visible.size()) != W ||
                              static_cast<int64_t>(args.window_offsets.size()) != W || W > 64)) {
      throw std::runtime_error("a window layout needs one offset and one bit set per window row, at most 64 rows");
    }
    positions_.resize(T);
    for (int64_t r = 0; r < T; ++r) {
      positions_[r] = args.has_layout() && r >= C ? n + C + args.window_offsets[r - C] : n + r;
    }
    rope_cos_.resize(T * (hd / 2));
    rope_sin_.resize(T * (hd / 2));
    cpu::rope_table(positions_.data(), T, c.head_dim, c.rope_theta, rope_cos_.data(), rope_sin_.data());
    x_.resize(T * hidden);
    h_.resize(T * hidden);
    q_.resize(T * q_dim);
    attn_.resize(T * q_dim);
    gate_.resize(T * inter);
    up_.resize(T * inter);

    cpu::embed(weights_.embed, ids.data(), T, x_.data());
    for (size_t l = 0; l < layers_.size(); ++l) {
      const LayerWeights& W = weights_.layers[l];
      const LayerVectors& V = layers_[l];
      // This forward's keys and values go straight into the cache at positions n..n+T-1; only the
      // commit rows count as cached afterwards, the window's are overwritten by the next forward.
      k_cache_[l].resize(std::max<size_t>(k_cache_[l].size(), (n + T) * kv_dim));
      v_cache_[l].resize(std::max<size_t>(v_cache_[l].size(), (n + T) * kv_dim));
      float* k = k_cache_[l].data() + n * kv_dim;
      float* v = v_cache_[l].data() + n * kv_dim;

      cpu::rmsnorm(x_.data(), T, hidden, V.input_norm.data(), c.rms_norm_eps, h_.data());
      cpu::matmuls(pool_, h_.data(), T,
                   {{&W.q, data_or_null(V.q_bias), q_.data()},
                    {&W.k, data_or_null(V.k_bias), k},
                    {&W.v, data_or_null(V.v_bias), v}});
      cpu::low_rank_add(pool_, h_.data(), hidden, masked_rows, W.q_ad, q_.data(), q_dim);
      cpu::low_rank_add(pool_, h_.data(), hidden, masked_rows, W.k_ad, k, kv_dim);
      cpu::low_rank_add(pool_, h_.data(), hidden, masked_rows, W.v_ad, v, kv_dim);
      if (c.qk_norm) {
        cpu::rmsnorm(q_.data(), T * c.num_heads, hd, V.q_norm.data(), c.rms_norm_eps, q_.data());
        cpu::rmsnorm(k, T * c.num_kv_heads, hd, V.k_norm.data(), c.rms_norm_eps, k);
      }
      cpu::rope_rotate(q_.data(), T, q_dim, c.num_heads, c.head_dim, rope_cos_.data(), rope_sin_.data());
      cpu::rope_rotate(k, T, kv_dim, c.num_kv_heads, c.head_dim, rope_cos_.data(), rope_sin_.data());
      cpu::attention(pool_, q_.data(), k_cache_[l].data(), v_cache_[l].data(), n, C, T, c.num_heads,
                     c.num_kv_heads, c.head_dim, attn_.data(), adapter ? &revealed : nullptr,
                     args.has_layout() ? &args.window_visible : nullptr);
      cpu::matmul(pool_, attn_.data(), T, W.o, data_or_null(V.o_bias), h_.data());
      cpu::low_rank_add(pool_, attn_.data(), q_dim, masked_rows, W.o_ad, h_.data(), hidden);
      cpu::add(x_.data(), h_.data(), T * hidden);

      cpu::rmsnorm(x_.data(), T, hidden, V.post_norm.data(), c.rms_norm_eps, h_.data());
      cpu::matmuls(pool_, h_.data(), T, {{&W.gate, nullptr, gate_.data()}, {&W.up, nullptr, up_.data()}});
      cpu::low_rank_add(pool_, h_.data(), hidden, masked_rows, W.gate_ad, gate_.data(), inter);
      cpu::low_rank_add(pool_, h_.data(), hidden, masked_rows, W.up_ad, up_.data(), inter);
      cpu::silu_mul(gate_.data(), up_.data(), T * inter);
      cpu::matmul(pool_, gate_.data(), T, W.down, nullptr, h_.data());
      cpu::low_rank_add(pool_, gate_.data(), inter, masked_rows, W.down_ad, h_.data(), hidden);
      cpu::add(x_.data(), h_.data(), T * hidden);
    }

    // Final norm and lm_head only on the rows the decoder asked for.
    const int64_t R = static_cast<int64_t>(args.logit_rows.size());
    h_.resize(std::max(R, T) * hidden);
    for (int64_t i = 0; i < R; ++i) {
      const int64_t row = args.logit_rows[i];
      cpu::rmsnorm(x_.data() + row * hidden, 1, hidden, final_norm_.data(), c.rms_norm_eps,
                   h_.data() + i * hidden);
    }
    cpu::matmul(pool_, h_.data(), R, weights_.lm_head, nullptr, logits);
    cached_ = n + C;
  }

 private:
  const ModelWeights& weights_;
  ThreadPool pool_;
  std::vector<LayerVectors> layers_;
  std::vector<float> final_norm_;
  std::vector<std::vector<float>> k_cache_, v_cache_;  // per layer [positions, kv_heads * head_dim]
  std::vector<int64_t> positions_;  // per row of the forward: its RoPE position
  std::vector<float> rope_cos_, rope_sin_;  // per row: cos and sin of its position's angles, for every layer
  int64_t cached_ = 0;
  std::vector<float> x_, h_, q_, attn_, gate_, up_;  // activations, reused across forwards
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const Model& model, const BackendOptions& options) {
  return std::make_unique<CpuBackend>(model, options);
}

}  // namespace a2d
