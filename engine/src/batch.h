// Continuous batching (docs/decoding.md, "Several sequences at once"): generations decoded together, each on a
// KV cache slot of its own, one backend forward serving every running sequence's next request. Sequences join
// and leave between forwards; each runs the one decode loop (Sequence), so its tokens are those it would
// have alone.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend.h"
#include "decode.h"

namespace a2d {

class BatchDecoder {
 public:
  // Up to `max_batch` sequences at once, at most the backend's max_batch().
  BatchDecoder(Backend& backend, int32_t max_batch);

  struct Finished {
    uint64_t id;
    GenerateResult result;
    std::string error;  // non-empty: its forward failed, and `result` holds what it had generated
  };

  int32_t capacity() const { return static_cast<int32_t>(free_slots_.size() + members_.size()); }
  // Forwards run so far, and the sequences' forwards among them (a forward of three sequences counts three).
  int64_t forwards() const { return forwards_; }
  int64_t sequence_forwards() const { return sequence_forwards_; }
  int32_t running() const { return static_cast<int32_t>(members_.size()); }
  bool full() const { return free_slots_.empty(); }

  // Puts a sequence on a free slot (std::logic_error when full); it takes part from the next step on.
  // `cancel` (may be null) is checked before each of its forwards and must outlive it.
  void add(uint64_t id, std::unique_ptr<Sequence> sequence, const std::atomic<bool>* cancel);

  // One forward over the running sequences' next requests, carrying at most the backend's prefill_chunk()
  // prompt tokens (chunks of long prompts, prompts' last parts with their first windows; one prompt forward
  // at least) and at most one prompt part that the backend runs alone (Backend::alone_prompt_rows), so that
  // prompts joining delay the running sequences by about one chunk per forward, not by their whole prefill.
  // Returns the sequences that finished (cancelled ones without a forward); they leave the batch.
  std::vector<Finished> step();

 private:
  struct Member {
    uint64_t id;
    int32_t slot;
    std::unique_ptr<Sequence> sequence;
    const std::atomic<bool>* cancel;
    bool prepared;  // sequence->next() has prepared the forward it needs
  };

  Backend& backend_;
  std::vector<Member> members_;     // in the order they joined
  std::vector<int32_t> free_slots_;
  int64_t forwards_ = 0;
  int64_t sequence_forwards_ = 0;
};

}  // namespace a2d
