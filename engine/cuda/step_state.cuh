// The per-forward inputs that change between replays of one CUDA graph. They live in device memory and
// are refreshed by one small host-to-device copy before each replay, so a graph captured once for a row
// count serves every KV length, commit/window split and token content.
#pragma once

namespace a2d::cuda {

// Most rows one forward processes; longer commits (prompts) run as several forwards.
constexpr int kMaxRows = 64;

struct StepState {
  int cached;        // n: tokens in the KV cache before this forward; row r takes position and cache slot n + r
  int commit;        // C: rows 0..C-1 are committed (causal); rows C..rows-1 are the window
  int rows;          // C + W
  int logit_count;   // how many rows get logits
  int write_logits;  // 0: compute only the per-row argmax and confidence, not the fp32 logits
  int tokens[kMaxRows];
  int logit_rows[kMaxRows];  // which rows, ascending
};

}  // namespace a2d::cuda
