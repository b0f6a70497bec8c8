// The per-forward inputs that change between replays of one CUDA graph. They live in device memory and
// are refreshed by one small host-to-device copy before each replay, so a graph captured once for a row
// count serves every KV length, commit/window split and token content.
//
// A forward holds one sequence (entries <= 1: `cached`, `commit` and `slot` describe it, its rows are all the
// rows) or several (continuous batching, entries > 1: the per-entry arrays describe each sequence, whose rows are
// consecutive, commit rows first; row t belongs to entry row_entry[t]). Each sequence has a KV cache slot of its
// own: its keys and values live there, and its rows attend to nothing else (docs/decoding.md, "Several sequences
// at once"). The row facts below read either form, so a kernel has one body for both.
#pragma once

#include <stdexcept>
#include <string>

namespace a2d::cuda {

// Most rows of a forward on the decode GEMMs, of one sequence's part of a forward, and most sequences a forward
// holds; longer commits (prompts) run as several forwards.
constexpr int kMaxRows = 64;
// Most rows of one forward of several sequences on the prefill GEMMs (ModelOptions::max_forward_rows): the rows'
// arrays below are this long, the sequences' kMaxRows.
constexpr int kMaxForwardRows = 256;
// Query rows, (token, q head) pairs, of one attention block (attention_tile.cuh's kRowsPerBlock), and the most blocks
// one attention launch runs: a forward's query rows cut at every sequence, for groups of up to 64 q heads per KV head
// (at most rows x group / 64 + sequences <= 256 + 64).
constexpr int kAttentionRowsPerBlock = 64;
constexpr int kMaxAttentionBlocks = 2 * kMaxForwardRows;

struct StepState {
  int cached;        // entries <= 1: n, tokens in the sequence's cache before this forward; row r takes position n + r
  int commit;        // entries <= 1: C, rows 0..C-1 are committed (causal); rows C..rows-1 are the window
  int slot;          // entries <= 1: the sequence's KV cache slot
  int rows;          // every entry's rows
  int logit_count;   // how many rows get logits
  int write_logits;  // 0: compute only the per-row argmax and confidence, not the fp32 logits
  int entries;       // sequences in this forward: 0 or 1 reads the three fields above, more the arrays below
  unsigned serial;   // the forward's number, never 0: the tag of a row adapter's t values (gemm.cuh, tag_t)
  int tokens[kMaxForwardRows];
  int logit_rows[kMaxForwardRows];  // which rows, ascending
  // entries > 1: each row's entry, and each entry's slot, cached tokens, commit rows, first row and rows.
  int row_entry[kMaxForwardRows];
  int entry_slot[kMaxRows];
  int entry_cached[kMaxRows];
  int entry_commit[kMaxRows];
  int entry_row0[kMaxRows];
  int entry_rows[kMaxRows];
  // entries > 1: the attention's blocks of query rows (attention.cu): each one's entry and first query row.
  int attention_blocks;
  int block_entry[kMaxAttentionBlocks];
  int block_first[kMaxAttentionBlocks];
};

// One sequence's part of a forward, as the kernels read it.
struct EntryView {
  int slot;
  int cached;
  int commit;
  int row0;  // its first row in the forward
  int rows;
};

// Appends sequence e of a several-sequence forward to the state: its facts, its rows' entry, and its query rows
// (heads `group` a row) cut into attention blocks. Entries come in row order, e = 0 first; the caller sets `entries`.
inline void add_entry(StepState& st, int e, const EntryView& entry, int group) {
  if (e < 0 || e >= kMaxRows || entry.row0 < 0 || entry.rows < 0 || entry.rows > kMaxRows ||
      entry.row0 + entry.rows > kMaxForwardRows) {
    throw std::logic_error("forward: entry " + std::to_string(e) + "'s rows [" + std::to_string(entry.row0) + ", " +
                           std::to_string(entry.row0 + entry.rows) + ") pass the " + std::to_string(kMaxRows) +
                           " sequences or rows of one, or the " + std::to_string(kMaxForwardRows) + " rows a forward holds");
  }
  if (e == 0) st.attention_blocks = 0;
  st.entry_slot[e] = entry.slot;
  st.entry_cached[e] = entry.cached;
  st.entry_commit[e] = entry.commit;
  st.entry_row0[e] = entry.row0;
  st.entry_rows[e] = entry.rows;
  for (int first = entry.row0 * group; first < (entry.row0 + entry.rows) * group; first += kAttentionRowsPerBlock) {
    if (st.attention_blocks == kMaxAttentionBlocks) throw std::logic_error("forward: too many attention blocks");
    st.block_entry[st.attention_blocks] = e;
    st.block_first[st.attention_blocks] = first;
    ++st.attention_blocks;
  }
  for (int r = 0; r < entry.rows; ++r) st.row_entry[entry.row0 + r] = e;
}

#ifdef __CUDACC__
__device__ __forceinline__ int row_entry(const StepState& st, int t) { return st.entries > 1 ? st.row_entry[t] : 0; }

__device__ __forceinline__ EntryView entry_view(const StepState& st, int e) {
  if (st.entries > 1) return {st.entry_slot[e], st.entry_cached[e], st.entry_commit[e], st.entry_row0[e], st.entry_rows[e]};
  return {st.slot, st.cached, st.commit, 0, st.rows};
}

// Row t's absolute position in its sequence (its RoPE position and its place in the slot's cache).
__device__ __forceinline__ int row_position(const StepState& st, int t) {
  const EntryView e = entry_view(st, row_entry(st, t));
  return e.cached + t - e.row0;
}

// Whether row t is a window row of its sequence (not a commit row).
__device__ __forceinline__ bool row_in_window(const StepState& st, int t) {
  const EntryView e = entry_view(st, row_entry(st, t));
  return t - e.row0 >= e.commit;
}
#endif

}  // namespace a2d::cuda
