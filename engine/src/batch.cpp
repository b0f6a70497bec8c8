#include "batch.h"

#include <algorithm>
#include <exception>
#include <stdexcept>
#include <utility>

namespace a2d {

BatchDecoder::BatchDecoder(Backend& backend, int32_t max_batch) : backend_(backend) {
  if (max_batch < 1) throw std::runtime_error("maxBatch must be at least 1");
  // Lowest slots last, so that they are taken first (a backend of one slot uses slot 0 only).
  for (int32_t slot = std::min(max_batch, backend.max_batch()) - 1; slot >= 0; --slot) free_slots_.push_back(slot);
}

void BatchDecoder::add(uint64_t id, std::unique_ptr<Sequence> sequence, const std::atomic<bool>* cancel) {
  if (full()) throw std::logic_error("BatchDecoder::add: every slot is taken");
  const int32_t slot = free_slots_.back();
  free_slots_.pop_back();
  backend_.reset_slot(slot);
  members_.push_back({id, slot, std::move(sequence), cancel, false});
}

std::vector<BatchDecoder::Finished> BatchDecoder::step() {
  std::vector<Finished> finished;
  std::vector<bool> leaving(members_.size(), false);
  auto leave = [&](size_t i, std::string error = {}) {
    finished.push_back({members_[i].id, members_[i].sequence->take_result(), std::move(error)});
    leaving[i] = true;
  };

  std::vector<size_t> chosen;
  const int64_t prompt_budget = std::max<int32_t>(1, backend_.prefill_chunk());
  const int64_t alone_rows = backend_.alone_prompt_rows();
  int64_t prompt_rows = 0;  // prompt tokens this forward carries
  bool alone_taken = false;  // it carries a prompt that runs device work of its own (Backend::alone_prompt_rows)
  for (size_t i = 0; i < members_.size(); ++i) {
    Member& m = members_[i];
    if (m.cancel != nullptr && m.cancel->load(std::memory_order_relaxed)) {
      m.sequence->cancel();
      leave(i);
      continue;
    }
    if (!m.prepared) {
      m.prepared = m.sequence->next();
      if (!m.prepared) {
        leave(i);
        continue;
      }
    }
    if (m.sequence->carries_prompt()) {
      const ForwardArgs& args = m.sequence->args();
      const int64_t rows = static_cast<int64_t>(args.commit.size());
      const bool alone = rows + static_cast<int64_t>(args.window.size()) >= alone_rows;
      // It waits for a forward with room for its prompt rows (the first prompt of a forward always has room), and
      // for one without another prompt of work of its own if it has some.
      if (prompt_rows > 0 && (prompt_rows + rows > prompt_budget || (alone && alone_taken))) continue;
      prompt_rows += rows;
      alone_taken = alone_taken || alone;
    }
    chosen.push_back(i);
  }

  if (!chosen.empty()) {
    std::vector<SlotForward> batch;
    for (size_t i : chosen) {
      const Member& m = members_[i];
      batch.push_back({m.slot, &m.sequence->args(), m.sequence->reveal()});
    }
    ++forwards_;
    sequence_forwards_ += static_cast<int64_t>(batch.size());
    std::vector<StepResult> results;
    std::string error;
    try {
      results = backend_.step_batch(batch);
    } catch (const std::exception& e) {
      error = e.what();
    }
    for (size_t k = 0; k < chosen.size(); ++k) {
      const size_t i = chosen[k];
      Member& m = members_[i];
      if (!error.empty()) {
        leave(i, error);
        continue;
      }
      m.sequence->accept(std::move(results[k]));
      // The next forward is prepared now, so a sequence that has ended leaves with this forward's results.
      m.prepared = m.sequence->next();
      if (!m.prepared) leave(i);
    }
  }

  for (size_t i = members_.size(); i-- > 0;) {
    if (!leaving[i]) continue;
    free_slots_.push_back(members_[i].slot);
    members_.erase(members_.begin() + static_cast<std::ptrdiff_t>(i));
  }
  return finished;
}

}  // namespace a2d
