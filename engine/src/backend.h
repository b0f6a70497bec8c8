// The interface between the decode loop (decode.cpp) and a compute backend (CPU, CUDA).
//
// A backend owns the weights' compute form and the KV cache of one generation. The decode loop drives
// it with one call per model forward (docs/decoding.md, "One forward: commit part + window part").
// A denoising step is forward + reveal decision; the default `step` runs the forward, brings the needed
// logits rows to the host and applies the shared host reveal rule (reveal.h). A device backend may
// override `step` to keep logits on the device and return only the few revealed tokens.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "model.h"

namespace a2d {

// One model forward. Rows are numbered 0..C+W-1: commit rows first, then window rows, at absolute
// positions cached_len() + row.
struct ForwardArgs {
  std::vector<int32_t> commit;  // appended to the KV cache (causal among themselves)
  std::vector<int32_t> window;  // the current block, scratch: attends to the cache + the whole window
  std::vector<int32_t> logit_rows;  // rows whose logits are wanted, ascending
  // A row (one of logit_rows) whose logits the backend keeps as the *anchor* of the next block
  // (shift_logits: block position 0 is predicted from the last committed token). -1: keep the old one.
  int32_t anchor_row = -1;
};


// Where a candidate's logits come from.
constexpr int32_t kAnchorLogits = -1;

// The reveal decision of one denoising step (docs/decoding.md, "A denoising step"). Everything that
// depends on the RNG or the schedule is computed by the decode loop before the step, so a backend only
// evaluates logits: the RNG draws are passed in.
struct RevealArgs {
  std::vector<int32_t> candidates;      // block indices j of the masked relevant positions, ascending
  std::vector<int32_t> candidate_rows;  // per candidate: index into ForwardArgs::logit_rows, or kAnchorLogits
  std::vector<double> sample_draws;     // temperature > 0: one u in [0,1) per candidate; else empty
  std::vector<double> priority_draws;   // remasking "random" (draws) or "leftmost" (n - c): one per candidate; else empty
  int32_t mask_token_id = -1;
  double temperature = 0.0;
  double top_p = 1.0;
  double threshold = 0.9;
  int32_t min_reveal = 1;  // k: at least this many candidates are revealed
  bool prefix_order = false;  // reveal_order "prefix" (docs/decoding.md, step 3)
};

struct Revealed {
  int32_t j;  // block index
  int32_t token;
  double confidence;
};

struct StepResult {
  std::vector<Revealed> revealed;  // ascending j
};

// One sequence's part of a batched forward (continuous batching): its request and the KV cache slot it runs on.
struct SlotForward {
  int32_t slot = 0;                   // 0..max_batch()-1, each slot at most once per forward
  const ForwardArgs* args = nullptr;
  const RevealArgs* reveal = nullptr;  // step_batch: the reveal decision, or null (a commit-only forward)
};

struct BackendOptions {
  int threads = 0;          // CPU worker threads; 0: hardware concurrency
  int64_t max_context = 0;  // KV cache capacity in tokens (prompt + completion + one window), per slot
  int32_t max_batch = 1;    // KV cache slots: sequences one forward may hold (a backend may hold fewer)
};

class Backend {
 public:
  virtual ~Backend() = default;

  // Runs one forward: appends `args.commit` to the cache and writes the fp32 logits of every
  // `args.logit_rows` row, row-major [logit_rows.size(), vocab], to host memory `logits`.
  virtual void forward(const ForwardArgs& args, float* logits) = 0;

  // Tokens held by the KV cache.
  virtual int64_t cached_len() const = 0;

  // Empties the KV cache (a new generation starts).
  virtual void reset_cache() = 0;

  // One decoding forward plus, when `reveal` is non-null, the reveal decision over its logits. Handles
  // `args.anchor_row`. The default runs `forward` into host buffers and the host reveal rule.
  virtual StepResult step(const ForwardArgs& args, const RevealArgs* reveal);

  const ModelConfig& config() const { return config_; }

  // Positions the KV cache can hold (prompt + completion + one window); forward throws beyond it.
  int64_t max_context() const { return max_context_; }

  // The longest window one forward takes.
  virtual int32_t max_window() const { return INT32_MAX; }

  // Rows per forward for a long prompt: the decode loop sends a prompt as commit-only forwards of at most
  // this many tokens (the window empty, logits only from the last one) and checks cancellation between
  // them. A backend picks the size at which its per-token cost has stopped falling.
  virtual int32_t prefill_chunk() const { return 512; }

  // Rows (a prompt part's commit plus its window) from which a backend runs a prompt's forward as device work of its
  // own before the forward the batch shares (the CUDA backend: the prefill kernels, then commit-only forwards).
  // Two such prompts in one step gain nothing from each other and each waits out the other's work, so a batch's
  // step carries at most one (BatchDecoder::step). INT32_MAX: every prompt row rides in the shared forward.
  virtual int32_t alone_prompt_rows() const { return INT32_MAX; }

  // Several sequences in one forward (continuous batching). Each has a KV cache slot of its own,
  // 0..max_batch()-1, with its own positions; a row attends only to its own slot's cache and its own
  // forward's rows, so an entry's logits do not depend on the other entries. Slot 0 is the cache that
  // forward, step, cached_len and reset_cache work on. A backend without batching holds one slot.
  virtual int32_t max_batch() const { return 1; }
  virtual int64_t slot_len(int32_t slot) const;  // tokens held by the slot's cache
  virtual void reset_slot(int32_t slot);         // empties one slot (a new sequence takes it)
  // One forward of every entry's request on its slot: the logits rows of each entry's logit_rows, entry
  // after entry, row-major [sum of logit_rows, vocab]. The default runs a single slot-0 entry as forward.
  virtual void forward_batch(const std::vector<SlotForward>& batch, float* logits);
  // step for every entry: one forward_batch, then each entry's anchor row (kept per slot) and reveal
  // decision. The default runs a single slot-0 entry as step (a device backend's own), more on the host.
  virtual std::vector<StepResult> step_batch(const std::vector<SlotForward>& batch);

 protected:
  Backend(const ModelConfig& config, int64_t max_context) : config_(config), max_context_(max_context) {}

  // What every forward_batch checks before it runs anything, so that a bad entry leaves every slot's cache as it
  // was: each slot one of 0..max_batch()-1 and used once, every entry within the context, its logit_rows ascending
  // rows of its forward and its anchor_row one of them (or -1).
  void check_batch(const std::vector<SlotForward>& batch) const;

  // The host path of step and step_batch: forward_batch into host buffers, the anchor rows, the host reveal rule.
  std::vector<StepResult> host_steps(const std::vector<SlotForward>& batch);

 private:
  ModelConfig config_;
  int64_t max_context_;
  std::vector<float> host_logits_;                // host steps: [logit_rows, vocab]
  std::vector<std::vector<float>> host_anchors_;  // host steps: per slot, the kept anchor row [vocab]
};

// The KV cache capacity for `requested` tokens (0: the default of engine/types.ts,
// min(max_position_embeddings, 32768 + 4096)). Throws when requested exceeds max_position_embeddings.
int64_t resolve_max_context(const ModelConfig& config, int64_t requested);

std::unique_ptr<Backend> make_cpu_backend(const Model& model, const BackendOptions& options);
#ifdef A2D_CUDA
// Implemented in engine/cuda/.
std::unique_ptr<Backend> make_cuda_backend(const Model& model, const BackendOptions& options);
#endif

}  // namespace a2d
