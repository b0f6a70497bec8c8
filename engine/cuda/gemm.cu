#include "gemm.cuh"

#include <algorithm>
#include <climits>
#include <vector>

#include "fp8.cuh"

namespace a2d::cuda {
namespace {

// The k-permutation that makes both operands 16-byte loads: lane (g, c) holds 8 consecutive k of its
// weight rows g and g+8 (the tiled layout of weights.cuh) and loads the same 8 k of its token row g,
// starting at chunk*32 + 8c. Those 8 values fill the fragment slots {2c, 2c+1, 2c+8, 2c+9} of two
// consecutive mma k-steps (first 4, then 4). Both operands are permuted the same way, so the dot
// product is unchanged.

// The input fragment of one lane for one chunk: 8 consecutive k of `input_row` from k; zero where the chunk
// lies past its split (`valid` false) or past K. Branch-free (a select, not a return), so that the
// unrolled loop over a round's chunks stays one basic block and the compiler can issue every chunk's
// input loads before the first multiply instead of one dependent round trip per chunk.
template <GemmInput kInput>
__device__ __forceinline__ uint4 load_input_row(const GemmParams& p, int input_row, int k, bool valid, float scale) {
  valid = valid && k < p.k;
  const int at = valid ? k : 0;
  if constexpr (kInput == GemmInput::bf16_rows) {
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(p.x + static_cast<size_t>(input_row) * p.x_stride + at));
    return valid ? v : make_uint4(0, 0, 0, 0);
  } else {
    const float4* h = reinterpret_cast<const float4*>(p.residual_in + static_cast<size_t>(input_row) * p.x_stride + at);
    const float4 h0 = __ldg(h);
    const float4 h1 = __ldg(h + 1);
    const uint4 gamma = __ldg(reinterpret_cast<const uint4*>(p.norm_weight + at));
    const float2 w0 = unpack_bf16(gamma.x), w1 = unpack_bf16(gamma.y), w2 = unpack_bf16(gamma.z),
                 w3 = unpack_bf16(gamma.w);
    const uint4 v = make_uint4(pack_bf16(h0.x * scale * w0.x, h0.y * scale * w0.y),
                               pack_bf16(h0.z * scale * w1.x, h0.w * scale * w1.y),
                               pack_bf16(h1.x * scale * w2.x, h1.y * scale * w2.y),
                               pack_bf16(h1.z * scale * w3.x, h1.w * scale * w3.y));
    return valid ? v : make_uint4(0, 0, 0, 0);
  }
}

constexpr int kStagedParts = 128;  // sums-of-squares parts the tile kernel stages (hidden up to 2048)

// Logits: the input row of this pass's token row t, and the pass's token rows (GemmParams::logit_first).
__device__ __forceinline__ int logit_row(const GemmParams& p, int t) { return p.state->logit_rows[p.logit_first + t]; }
__device__ __forceinline__ int logit_pass_rows(const GemmParams& p) {
  return min(p.state->logit_count - p.logit_first, kMaxRows);
}

// The RMSNorm scale of each input row t < rows, one warp per row (the block's `warps` warps take turns):
// the producer's per-tile partial sums of squares ssq[part * stride + row], summed across the lanes. ssq is
// the producer's ssq_in (stride kMaxRows) or the tile kernel's copy in shared memory (stride kCols, rows
// unmapped). Columns from `rows` up to `cols` (no token there) get 0.
__device__ __forceinline__ void rmsnorm_row_scales(const GemmParams& p, const float* ssq, int stride, int rows, int cols,
                                                   float* row_scale, int warps) {
  const int lane = threadIdx.x % 32;
  for (int t = threadIdx.x / 32; t < cols; t += warps) {
    if (t >= rows) {
      if (lane == 0) row_scale[t] = 0.f;
      continue;
    }
    const int r = p.use_row_map ? logit_row(p, t) : t;
    float sum = 0.f;
    for (int part = lane; part < p.ssq_in_parts; part += 32) sum += ssq[part * stride + r];
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (lane == 0) row_scale[t] = rsqrtf(sum / static_cast<float>(p.k) + p.norm_eps);
  }
}

// What a lane's token columns read, fixed for the whole K loop: the input row of column j * 8 + g (the
// logits' row map applied; columns past `rows` repeat the last row, their results unused) and the RMSNorm
// scale applied at the load (1 where there is none, or where the caller scales after the K loop:
// row_scale null).
template <int kTiles>
struct TileInputs {
  int row[kTiles];
  float scale[kTiles];
};
template <int kTiles, GemmInput kInput>
__device__ __forceinline__ TileInputs<kTiles> tile_inputs(const GemmParams& p, int rows, int g, const float* row_scale) {
  TileInputs<kTiles> in;
#pragma unroll
  for (int j = 0; j < kTiles; ++j) {
    const int t = min(j * 8 + g, rows - 1);
    in.row[j] = p.use_row_map ? logit_row(p, t) : t;
    in.scale[j] = kInput == GemmInput::rmsnorm_residual && row_scale != nullptr ? row_scale[t] : 1.f;
  }
  return in;
}

// A chunk of a tile is 1 KiB in either layout (weights.cuh): 32 bf16 columns of 16 rows, or 64 e4m3 ones.
// Each lane loads 16 bytes of row g and 16 of row g + 8.
constexpr int kChunkBytes = 1024;
template <bool kFp8>
__host__ __device__ constexpr int chunk_cols() {
  return kFp8 ? 64 : 32;
}
template <bool kFp8>
__device__ __forceinline__ const unsigned char* weight_bytes(const GemmParams& p) {
  return kFp8 ? p.weight_fp8 : reinterpret_cast<const unsigned char*>(p.weight);
}

// The bf16 fragment of 8 consecutive k that 32-column step `half` of a lane's 16 loaded weight bytes holds:
// the bytes themselves (bf16, one step per chunk), or e4m3 bytes 8 * half .. 8 * half + 7 turned into bf16.
template <bool kFp8>
__device__ __forceinline__ uint4 weight_fragment(const uint4& w, int half) {
  if constexpr (kFp8) {
    return half == 0 ? e4m3x8_to_bf16x8(w.x, w.y) : e4m3x8_to_bf16x8(w.z, w.w);
  } else {
    return w;
  }
}

// acc[j] += one chunk of the tile's weights (this lane's wa, wb: rows g and g + 8, 8 consecutive k from k, and
// for e4m3 8 more from k + 32) times the input fragments of the token columns j * 8 + g at the same k, for the
// row tiles that hold rows; a chunk that is not `valid` adds zero.
template <int kTiles, GemmInput kInput, bool kFp8>
__device__ __forceinline__ void multiply_chunk(float (&acc)[kTiles][4], const uint4& wa, const uint4& wb, const GemmParams& p,
                                               int rows, int k, bool valid, const TileInputs<kTiles>& in) {
#pragma unroll
  for (int half = 0; half < chunk_cols<kFp8>() / 32; ++half) {
    const uint4 a = weight_fragment<kFp8>(wa, half), b = weight_fragment<kFp8>(wb, half);
#pragma unroll
    for (int j = 0; j < kTiles; ++j) {
      if (j > 0 && j * 8 >= rows) break;
      const uint4 xv = load_input_row<kInput>(p, in.row[j], k + 32 * half, valid, in.scale[j]);
      mma_bf16_16816(acc[j], a.x, b.x, a.y, b.y, xv.x, xv.y);
      mma_bf16_16816(acc[j], a.z, b.z, a.w, b.w, xv.z, xv.w);
    }
  }
}

// What the epilogues read of the step state, read by each kernel at its start (the host wrote the state
// before the forward's first kernel): in the epilogue the read would be one more dependent round trip. A forward of
// several sequences reads each row's own position and slot there instead (place_of).
struct StepView {
  int cached;
  int slot;
  int entries;
  bool write_logits;
  unsigned serial;  // the tag of this forward's adapter t (gemm.cuh, tag_t)
};
__device__ __forceinline__ StepView step_view(const GemmParams& p) {
  return {p.state->cached, p.state->slot, p.state->entries, p.state->write_logits != 0, p.state->serial};
}

// Row t's position in its sequence and its sequence's KV cache slot.
struct RowPlace {
  int position;
  int slot;
};
__device__ __forceinline__ RowPlace place_of(const GemmParams& p, const StepView& view, int t) {
  if (view.entries <= 1) return {view.cached + t, view.slot};
  const StepState& st = *p.state;
  const EntryView e = entry_view(st, st.row_entry[t]);
  return {e.cached + t - e.row0, e.slot};
}

#if defined(A2D_GEMM_TRACE)
// A decode GEMM tile's record (trace.cuh), written when its block (the wide kernel: its warp) ends: the times up to
// the reduction, then the end now; an adapter tile i as tile -1 - i; the split + 1000 where it ran the epilogue.
struct TileTimes {
  uint64_t start, waited, first_data, loop_done, reduced;
};
__device__ __forceinline__ void trace_tile(const GemmParams& p, const TileTimes& t, bool adapter_tile, int tile,
                                           int split, bool epilogue) {
  trace_write(p.trace, GemmBlockRecord{t.start, t.waited, t.first_data, t.loop_done, t.reduced, trace_clock(), trace_sm(),
                                       p.site, adapter_tile ? -1 - tile : tile, split + (epilogue ? 1000 : 0)});
}
#endif

// A block's place in the grid (gridDim.x blocks of tiles by gridDim.y K splits): its tile block and its split.
// The first `adapter_blocks` tile blocks hold a fused adapter's tiles; they take the lowest linear block indices
// with every split of theirs, so t is written by the first blocks dispatched (with the weight's split order, the
// adapter's second split came after every weight tile's first). The weight's blocks follow in the grid's order.
struct BlockPlace {
  int block;
  int split;
};
__device__ __forceinline__ BlockPlace block_place(int adapter_blocks) {
  const int blocks = gridDim.x, splits = gridDim.y;
  const int linear = blockIdx.y * blocks + blockIdx.x;
  if (linear < adapter_blocks * splits) return {linear / splits, linear % splits};
  const int rest = linear - adapter_blocks * splits, others = blocks - adapter_blocks;
  return {adapter_blocks + rest % others, rest / others};
}

// A fused row adapter (GemmParams::adapter_tiles). The adapter tiles store t, each value tagged with the forward's
// serial (tag_t); a weight tile's epilogue loads the values it needs and loads again until every tag it holds is
// this forward's, then adds B t for its 16 rows. A value and its tag travel in one 8-byte word, which the memory
// model moves whole (single-copy atomic), so a matching tag means a current value: no count, fence or barrier
// between the two kinds of tile, and nothing to reset after the launch. (Counts took a release by each adapter
// tile, an acquire poll and a barrier in each weight tile, and a done count that the last weight tile reset:
// bench/NOTES.md, runs 152-163.) The adapter tiles' blocks, every split of them, hold the lowest linear block indices
// (block_place), so they were all dispatched before any weight tile's block: the loads end.
__device__ __forceinline__ void store_tagged(unsigned long long* at, unsigned long long value) {
  asm volatile("st.relaxed.gpu.global.b64 [%0], %1;" ::"l"(at), "l"(value) : "memory");
}
__device__ __forceinline__ unsigned long long load_tagged(const unsigned long long* at) {
  unsigned long long value;
  asm volatile("ld.relaxed.gpu.global.b64 %0, [%1];" : "=l"(value) : "l"(at));
  return value;
}
__device__ __forceinline__ ulonglong2 load_tagged2(const unsigned long long* at) {  // 16-byte aligned
  ulonglong2 value;
  asm volatile("ld.relaxed.gpu.global.v2.b64 {%0, %1}, [%2];" : "=l"(value.x), "=l"(value.y) : "l"(at));
  return value;
}
__device__ __forceinline__ bool tagged_now(unsigned long long value, unsigned serial) {
  return static_cast<unsigned>(value >> 32) == serial;
}
__device__ __forceinline__ float tagged_value(unsigned long long value) {
  return __uint_as_float(static_cast<unsigned>(value));
}

// t values at[0..7] (16-byte aligned) once all eight are this forward's: every load of a try issued before any check.
__device__ __forceinline__ void load_t8(const unsigned long long* at, unsigned serial, float (&out)[8]) {
  ulonglong2 v[4];
  bool now;
  do {
#pragma unroll
    for (int q = 0; q < 4; ++q) v[q] = load_tagged2(at + 2 * q);
    now = true;
#pragma unroll
    for (int q = 0; q < 4; ++q) now = now && tagged_now(v[q].x, serial) && tagged_now(v[q].y, serial);
  } while (!now);
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    out[2 * q] = tagged_value(v[q].x);
    out[2 * q + 1] = tagged_value(v[q].y);
  }
}

// Asks L2 for a weight tile's B rows and offsets while the K loop streams its weights, so that the epilogue finds
// them there. Called before the K loop by every thread of the team.
__device__ __forceinline__ void prefetch_low_rank_rows(const GemmParams& p, int tile, int rank, int team) {
  const int row0 = tile * kGemmTileRows;
  if (p.adapter_tiles == 0 || row0 >= p.n_rows) return;
  const int rows = min(kGemmTileRows, p.n_rows - row0);
  const char* b = reinterpret_cast<const char*>(p.adapter_b + static_cast<size_t>(row0) * p.adapter_rank);
  const int lines = ceil_div(rows * p.adapter_rank * 2, 128);
  for (int i = rank; i <= lines; i += team) {
    const void* at = i < lines ? static_cast<const void*>(b + 128 * i) : static_cast<const void*>(p.adapter_offset + row0);
    asm volatile("prefetch.global.L2 [%0];" ::"l"(at));
  }
}

// The two bf16 values of B row `row` at k and k + 1 (zeros past the rank), as one mma operand register.
__device__ __forceinline__ uint32_t low_rank_b_pair(const GemmParams& p, int row, int k) {
  const unsigned short* b = reinterpret_cast<const unsigned short*>(p.adapter_b) + static_cast<size_t>(row) * p.adapter_rank;
  const uint32_t lo = k < p.adapter_rank ? __ldg(b + k) : 0u;
  const uint32_t hi = k + 1 < p.adapter_rank ? __ldg(b + k + 1) : 0u;
  return lo | (hi << 16);
}

// At most this many token columns, a tile's B t sums go to lane groups (add_low_rank_by_lanes), more to the tensor
// cores: with 8 or fewer an mma's token block is mostly padding and one warp of the team would do all of it (run
// 110: the tensor-core sums made the 2B's block-4 forward 3.8 ms against 3.2 with lane groups, block 32 7.8 against
// 10.0).
constexpr int kLowRankLaneColumns = 8;

// tile_sum[r][t] += sum_i B[row][i] t[t][offset(row) + i] for few token columns: each (row, token) pair summed by a
// group of lanes, 8 rank values a lane with 16-byte loads (B from global memory, t from L2, all issued in one round),
// the group reduced with shuffles. Every lane of the team takes the same trip count. The offset and first B chunk of
// this thread's first row are loaded before its first t values. (The team is a multiple of the lane groups: a
// thread's chunk is the same on every pass.)
template <int kCols>
__device__ __forceinline__ void add_low_rank_by_lanes(const GemmParams& p, unsigned serial, int tile,
                                                      float (*tile_sum)[kCols + 1], int active_cols, int rank, int team) {
  const int R = p.adapter_rank;
  const int chunks = (R + 7) / 8;
  int lanes = 1;  // a power of two, at most 32: the groups line up with the warps' lanes
  while (lanes < chunks && lanes < 32) lanes *= 2;
  const int items = kGemmTileRows * active_cols * lanes;
  const int lane_in_pair = rank % lanes;
  const int first_row = tile * kGemmTileRows + rank / lanes % kGemmTileRows;
  const bool first_valid = first_row < p.n_rows && lane_in_pair < chunks && R % 8 == 0;
  const int first_offset = first_row < p.n_rows ? p.adapter_offset[first_row] : 0;
  const uint4 first_b = first_valid ? __ldg(reinterpret_cast<const uint4*>(p.adapter_b + static_cast<size_t>(first_row) * R +
                                                                           8 * lane_in_pair))
                                    : make_uint4(0, 0, 0, 0);
  for (int base = 0; base < items; base += team) {
    const int e = base + rank;
    const int pair = e / lanes;
    const int r = pair % kGemmTileRows, t = pair / kGemmTileRows;
    const int row = tile * kGemmTileRows + r;
    float sum = 0.f;
    if (e < items && row < p.n_rows) {
      const bf16* b = p.adapter_b + static_cast<size_t>(row) * R;
      const unsigned long long* tv = p.adapter_t + static_cast<size_t>(t) * p.adapter_total_rank +
                                     (row == first_row ? first_offset : p.adapter_offset[row]);
      for (int c = lane_in_pair; c < chunks; c += lanes) {
        const int i = 8 * c;
        if (R % 8 == 0) {  // then t's rows and offsets are multiples of 8 values too: 16-byte loads
          const uint4 bv = row == first_row && c == lane_in_pair ? first_b : __ldg(reinterpret_cast<const uint4*>(b + i));
          float tq[8];
          load_t8(tv + i, serial, tq);
          const float2 b0 = unpack_bf16(bv.x), b1 = unpack_bf16(bv.y), b2 = unpack_bf16(bv.z), b3 = unpack_bf16(bv.w);
          sum += b0.x * tq[0] + b0.y * tq[1] + b1.x * tq[2] + b1.y * tq[3] + b2.x * tq[4] + b2.y * tq[5] + b3.x * tq[6] +
                 b3.y * tq[7];
        } else {
          for (int j = i; j < min(i + 8, R); ++j) {
            unsigned long long v;
            do {
              v = load_tagged(tv + j);
            } while (!tagged_now(v, serial));
            sum += __bfloat162float(b[j]) * tagged_value(v);
          }
        }
      }
    }
    for (int offset = lanes / 2; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (e < items && lane_in_pair == 0 && row < p.n_rows) tile_sum[r][t] += sum;
  }
}

// tile_sum[r][t] += sum_i B[row][i] t[t][offset(row) + i] for the tile's rows and active token columns, from this
// forward's t (more than kLowRankLaneColumns of them: on tensor cores; else by lane groups).
// Warp w of the team takes the token blocks w, w + warps, ...: an m16n8k16 mma per
// 16 rank values with B's 16 rows as the A operand and t's 8 token columns as the B operand, t split into a bf16
// high part and the bf16 of the rest (fp32-grade products: B is bf16 already). Rows of one tile may belong to
// different targets (gate rows 0..7 and up rows 8..15): one pass of mmas per distinct offset, the other rows'
// operands zero.
template <int kCols>
__device__ __forceinline__ void add_low_rank(const GemmParams& p, unsigned serial, int tile, float (*tile_sum)[kCols + 1],
                                             int active_cols, int rank, int team) {
  if (active_cols <= kLowRankLaneColumns) {
    add_low_rank_by_lanes<kCols>(p, serial, tile, tile_sum, active_cols, rank, team);
    return;
  }
  const int lane = rank % 32, g = lane / 4, c = lane % 4;
  const int row_lo = tile * kGemmTileRows + g, row_hi = row_lo + 8;
  const bool has_lo = row_lo < p.n_rows, has_hi = row_hi < p.n_rows;
  const int offset_lo = has_lo ? p.adapter_offset[row_lo] : 0;
  const int offset_hi = has_hi ? p.adapter_offset[row_hi] : 0;
  const int R = p.adapter_rank;
  // This warp's token blocks j = first + w * warps (w < kBlocks): B's fragments are loaded once per 16 rank values
  // for all of them, and their t loads are independent, so that one warp holding every block (the wide kernel's
  // team) waits for one round of loads per 16 rank values, not one per block.
  constexpr int kBlocks = kCols / 8;
  const int first = rank / 32, warps = team / 32;
  float d[kBlocks][4];
#pragma unroll
  for (int w = 0; w < kBlocks; ++w) d[w][0] = d[w][1] = d[w][2] = d[w][3] = 0.f;
  bool need_lo = has_lo, need_hi = has_hi;
  for (;;) {
    const int offset = __reduce_min_sync(0xffffffffu, min(need_lo ? offset_lo : INT_MAX, need_hi ? offset_hi : INT_MAX));
    if (offset == INT_MAX) break;
    const bool use_lo = need_lo && offset_lo == offset, use_hi = need_hi && offset_hi == offset;
    for (int k0 = 0; k0 < R; k0 += 16) {
      const uint32_t a0 = use_lo ? low_rank_b_pair(p, row_lo, k0 + 2 * c) : 0u;
      const uint32_t a1 = use_hi ? low_rank_b_pair(p, row_hi, k0 + 2 * c) : 0u;
      const uint32_t a2 = use_lo ? low_rank_b_pair(p, row_lo, k0 + 2 * c + 8) : 0u;
      const uint32_t a3 = use_hi ? low_rank_b_pair(p, row_hi, k0 + 2 * c + 8) : 0u;
#pragma unroll
      for (int w = 0; w < kBlocks; ++w) {
        const int j = first + w * warps;
        if (j * 8 >= active_cols) break;  // the same for the whole warp
        const int t = j * 8 + g;            // this lane's token column of the B operand
        const unsigned long long* t_row =
            p.adapter_t + static_cast<size_t>(t < active_cols ? t : 0) * p.adapter_total_rank + offset;
        // The four values this lane feeds (zeros past the rank or the columns), loaded again until all are current.
        const int ks[4] = {k0 + 2 * c, k0 + 2 * c + 1, k0 + 2 * c + 8, k0 + 2 * c + 9};
        float tv[4];
        bool now;
        do {
          now = true;
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            const bool used = t < active_cols && ks[q] < R;
            const unsigned long long v = used ? load_tagged(t_row + ks[q]) : tag_t(0.f, serial);
            now = now && tagged_now(v, serial);
            tv[q] = tagged_value(v);
          }
        } while (!now);
        const uint32_t b0 = pack_bf16(tv[0], tv[1]), b1 = pack_bf16(tv[2], tv[3]);
        const float2 h0 = unpack_bf16(b0), h1 = unpack_bf16(b1);
        mma_bf16_16816(d[w], a0, a1, a2, a3, b0, b1);
        mma_bf16_16816(d[w], a0, a1, a2, a3, pack_bf16(tv[0] - h0.x, tv[1] - h0.y), pack_bf16(tv[2] - h1.x, tv[3] - h1.y));
      }
    }
    need_lo = need_lo && !use_lo;
    need_hi = need_hi && !use_hi;
  }
  // d[w]: rows g and g + 8, token columns j * 8 + 2c and + 1 (inside tile_sum's kCols + 1 columns).
#pragma unroll
  for (int w = 0; w < kBlocks; ++w) {
    const int j = first + w * warps;
    if (j * 8 >= active_cols) break;
    tile_sum[g][j * 8 + 2 * c] += d[w][0];
    tile_sum[g][j * 8 + 2 * c + 1] += d[w][1];
    tile_sum[g + 8][j * 8 + 2 * c] += d[w][2];
    tile_sum[g + 8][j * 8 + 2 * c + 1] += d[w][3];
  }
}

// The epilogue of adapter tile `a_tile`: its 16 rows of t = A x for the token rows the adapter acts on, zeros for
// the others, tagged with the forward's serial.
template <int kCols>
__device__ __forceinline__ void adapter_tile_epilogue(const GemmParams& p, unsigned serial, int a_tile,
                                                      float (*tile_sum)[kCols + 1], int active_cols, int rank, int team) {
  const StepState& st = *p.state;
  for (int e = rank; e < kGemmTileRows * active_cols; e += team) {
    const int r = e % kGemmTileRows, t = e / kGemmTileRows;
    const int i = a_tile * kGemmTileRows + r;
    if (i >= p.adapter_total_rank) continue;
    const bool acts = row_in_window(st, t) && (p.adapter_mask_token < 0 || st.tokens[t] == p.adapter_mask_token);
    store_tagged(p.adapter_t + static_cast<size_t>(t) * p.adapter_total_rank + i, tag_t(acts ? tile_sum[r][t] : 0.f, serial));
  }
}

// The epilogue of one finished 16-row tile, run by a team of `team` threads (a whole block, or one warp of
// the wide kernel), `rank` being this thread's index in it and `sync` the team's barrier: the bias, then
// the epilogue's own work (kAdapter: a fused adapter's B t first, where the GEMM has one; never in an FP8 one).
// tile_sum[r][t] holds row r of the tile for token column t; tile_scratch is a
// second buffer of the same shape the epilogue may overwrite.
template <GemmEpilogue kEpilogue, int kCols, bool kAdapter, typename Sync>
__device__ __forceinline__ void tile_epilogue(const GemmParams& p, const StepView& view, int tile,
                                              float (*tile_sum)[kCols + 1], float (*tile_scratch)[kCols + 1],
                                              int active_cols, int rank, int team, Sync sync) {
  if (p.weight_scale != nullptr || p.bias != nullptr) {
    sync();
    for (int e = rank; e < kGemmTileRows * active_cols; e += team) {
      const int r = e % kGemmTileRows;
      const int row = tile * kGemmTileRows + r;
      if (row >= p.n_rows) continue;
      float& v = tile_sum[r][e / kGemmTileRows];
      if (p.weight_scale != nullptr) v *= p.weight_scale[row];
      if (p.bias != nullptr) v += __bfloat162float(p.bias[row]);
    }
  }
  if (kAdapter && p.adapter_tiles > 0) {
    sync();
    add_low_rank<kCols>(p, view.serial, tile, tile_sum, active_cols, rank, team);
  }
  sync();

  if constexpr (kEpilogue == GemmEpilogue::store_bf16) {
    for (int e = rank; e < kGemmTileRows * active_cols; e += team) {
      const int r = e % kGemmTileRows, t = e / kGemmTileRows;
      const int row = tile * kGemmTileRows + r;
      if (row < p.n_out) p.out[static_cast<size_t>(t) * p.out_stride + row] = __float2bfloat16(tile_sum[r][t]);
    }
  } else if constexpr (kEpilogue == GemmEpilogue::silu_mul) {
    // Tile rows 0..7 are gate rows i..i+7 and rows 8..15 the up rows of the same i.
    for (int e = rank; e < 8 * active_cols; e += team) {
      const int r = e % 8, t = e / 8;
      const int i = tile * 8 + r;
      if (i < p.n_out) {
        const float gate = tile_sum[r][t];
        const float up = tile_sum[r + 8][t];
        p.out[static_cast<size_t>(t) * p.out_stride + i] = __float2bfloat16(gate / (1.f + __expf(-gate)) * up);
      }
    }
  } else if constexpr (kEpilogue == GemmEpilogue::residual_add) {
    for (int e = rank; e < kGemmTileRows * active_cols; e += team) {
      const int r = e % kGemmTileRows, t = e / kGemmTileRows;
      const int row = tile * kGemmTileRows + r;
      float square = 0.f;
      if (row < p.n_out) {
        float* h = p.residual_out + static_cast<size_t>(t) * p.out_stride + row;
        const float v = *h + tile_sum[r][t];
        *h = v;
        square = v * v;
      }
      tile_scratch[r][t] = square;
    }
    sync();
    for (int t = rank; t < active_cols; t += team) {
      float sum = 0.f;
#pragma unroll
      for (int r = 0; r < kGemmTileRows; ++r) sum += tile_scratch[r][t];
      p.ssq_out[tile * kMaxRows + t] = sum;
    }
  } else if constexpr (kEpilogue == GemmEpilogue::rope_qkv) {
    const int first_row = tile * kGemmTileRows;
    const int head = first_row / p.head_dim;
    const int j = first_row % p.head_dim / kGemmTileRows;
    if (head < p.num_heads + p.num_kv_heads) {
      // Tile rows r and r + 8 are the dims i = 8j + r and i + half of one q or k head (the rope-pair order of
      // row_placement.h, in which the upload placed them).
      const int half = p.head_dim / 2;
      for (int e = rank; e < 8 * active_cols; e += team) {
        const int r = e % 8, t = e / 8;
        const int i = rope_pair_dim(first_row % p.head_dim + r, half);
        const RowPlace at = place_of(p, view, t);  // RoPE position and k slot
        const float x1 = tile_sum[r][t], x2 = tile_sum[r + 8][t];
        const float2 cs = p.rope_table[static_cast<size_t>(at.position) * half + i];
        bf16* out = head < p.num_heads
                        ? p.q_out + (static_cast<size_t>(t) * p.num_heads + head) * p.head_dim
                        : p.k_cache + at.slot * p.kv_slot_stride +
                              (static_cast<size_t>(head - p.num_heads) * p.max_context + at.position) * p.head_dim;
        out[i] = __float2bfloat16(x1 * cs.x - x2 * cs.y);
        out[i + half] = __float2bfloat16(x2 * cs.x + x1 * cs.y);
      }
    } else {
      const int kv_head = head - p.num_heads - p.num_kv_heads;
      for (int e = rank; e < kGemmTileRows * active_cols; e += team) {
        const int r = e % kGemmTileRows, t = e / kGemmTileRows;
        const RowPlace at = place_of(p, view, t);
        p.v_cache[at.slot * p.kv_slot_stride + (static_cast<size_t>(kv_head) * p.max_context + at.position) * p.head_dim +
                  j * kGemmTileRows + r] = __float2bfloat16(tile_sum[r][t]);
      }
    }
  } else {
    if (view.write_logits) {
      for (int e = rank; e < kGemmTileRows * active_cols; e += team) {
        const int r = e % kGemmTileRows, t = e / kGemmTileRows;
        const int row = tile * kGemmTileRows + r;
        if (row < p.n_out) p.logits[static_cast<size_t>(t) * p.out_stride + row] = tile_sum[r][t];
      }
    }
    // One warp: lane = 16 * half + r holds row r of the columns half, half + 2, ...; the max (the lowest
    // row on ties), then the sum of exp(logit - max), are reduced across the 16 lanes of a half with
    // shuffles, so the warp reads each value once from shared memory instead of twice in a serial loop.
    if (rank < 32) {
      const int r = rank % kGemmTileRows, half = rank / kGemmTileRows;
      const int row = tile * kGemmTileRows + r;
      const bool valid = row < p.n_out && row != p.mask_token_id;
      for (int pair = 0; pair < active_cols; pair += 2) {  // the same trip count on every lane (shuffles)
        const int t = pair + half;                         // <= kCols: inside tile_sum's padded rows
        const bool used = valid && t < active_cols;
        float best = used ? tile_sum[r][t] : -INFINITY;
        int index = used ? row : INT_MAX;
#pragma unroll
        for (int offset = kGemmTileRows / 2; offset > 0; offset /= 2) {
          const float other = __shfl_xor_sync(0xffffffffu, best, offset);
          const int other_index = __shfl_xor_sync(0xffffffffu, index, offset);
          if (other > best || (other == best && other_index < index)) {
            best = other;
            index = other_index;
          }
        }
        float sum = used ? __expf(tile_sum[r][t] - best) : 0.f;
#pragma unroll
        for (int offset = kGemmTileRows / 2; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
        if (r == 0 && t < active_cols) {
          p.argmax_out[tile * kMaxRows + t] = ArgmaxPartial{best, index == INT_MAX ? 0.f : sum, index == INT_MAX ? -1 : index};
        }
      }
    }
  }
}

// Split K across teams (a block, or one warp): publishes this team's fp32 partial of `tile` (sums[r][t], 16 rows x
// active_cols) as split `split`, and returns true in the team that arrives last, whose `sums` then hold every
// split's partial added in split order (the same result whichever team arrives last). Every thread of the team
// calls it; `sync` is the team's barrier and `from_rank0` hands rank 0's value to the whole team. The last team
// resets the tile's counter for the next launch.
template <int kCols, typename Sync, typename FromRank0>
__device__ __forceinline__ bool merge_split_k(const GemmParams& p, int tile, int split, float (*sums)[kCols + 1],
                                              int active_cols, int rank, int team, Sync sync, FromRank0 from_rank0) {
  float* tile_partials = p.split_partials + static_cast<size_t>(tile) * p.splits * kMaxRows * kGemmTileRows;
  float* own = tile_partials + static_cast<size_t>(split) * kMaxRows * kGemmTileRows;
  for (int e = rank; e < kGemmTileRows * active_cols; e += team) own[e] = sums[e % kGemmTileRows][e / kGemmTileRows];
  __threadfence();
  sync();
  unsigned arrived = 0;
  if (rank == 0) arrived = atomicAdd(&p.split_counters[tile], 1u);
  if (from_rank0(arrived) != static_cast<unsigned>(p.splits - 1)) return false;
  __threadfence();
  for (int e = rank; e < kGemmTileRows * active_cols; e += team) {
    float sum = 0.f;
    for (int s = 0; s < p.splits; ++s) sum += __ldcg(tile_partials + static_cast<size_t>(s) * kMaxRows * kGemmTileRows + e);
    sums[e % kGemmTileRows][e / kGemmTileRows] = sum;
  }
  if (rank == 0) p.split_counters[tile] = 0;
  return true;
}

__device__ __forceinline__ unsigned warp_from_lane0(unsigned value) { return __shfl_sync(0xffffffffu, value, 0); }

// One block: one 16-row tile of the weight over its split's K range, which is contiguous in the tiled
// layout. The 8 warps take interleaved chunks; each lane keeps kLoads pairs of 16-byte weight loads in
// flight (every warp load instruction reads 512 contiguous bytes), then multiplies them with the
// matching input fragments. (A cp.async shared-memory ring measured slower: bench/NOTES.md.)
// One row tile at 4 loads: at least three blocks per SM (85 registers at most). Four (64 registers) measured
// slower: gate/up's 768 tiles then run in 1.45 waves of 528 slots, in 1.94 of 396 with three. Up to two row tiles, the rest to 128 registers, two blocks per SM
// (with every chunk's input loads issued ahead of the multiplies, ptxas would take up to 220 at 8 loads).
template <int kTiles>
__host__ __device__ constexpr int gemm_min_blocks(int loads) {
  return kTiles == 1 && loads == 4 ? 3 : (kTiles <= 2 ? 2 : 1);
}
template <int kTiles, GemmInput kInput, GemmEpilogue kEpilogue, int kLoads, bool kFp8>
__global__ void __launch_bounds__(kGemmWarps * 32, gemm_min_blocks<kTiles>(kLoads)) gemm_kernel(const GemmParams p) {
  constexpr int kCols = kTiles * 8;
  // A normalised input's row scale is constant over k, so it can multiply the dot products after the K
  // loop: the producer's partial sums of squares are then copied to shared memory while the weights and
  // input rows stream, instead of being read and reduced (an L2 round trip) before the first input load.
  // Up to 16 token rows (at 32 it measured slower) and kStagedParts parts, and not for mapped rows (the
  // logits' row map).
  constexpr bool kStageSsq = kInput == GemmInput::rmsnorm_residual && kTiles <= 2;
  __shared__ float partial[kGemmWarps][kGemmTileRows][kCols + 1];
  __shared__ float row_scale[kCols];
  __shared__ __align__(16) float ssq_stage[kStageSsq ? kStagedParts * kCols : 4];
  __shared__ unsigned arrived;  // merge_split_k's count, from thread 0

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int g = lane / 4;
  const int c = lane % 4;
  // A fused adapter's tiles first (GemmParams::adapter_tiles, block_place); `tile` numbers the output (or adapter)
  // tile, `stored` its place in the weight.
  const BlockPlace place = block_place(p.adapter_tiles);
  const bool adapter_tile = place.block < p.adapter_tiles;
  const int tile = adapter_tile ? place.block : place.block - p.adapter_tiles;
  const int stored = adapter_tile ? ceil_div(p.n_rows, kGemmTileRows) + tile : tile;
  const int chunks = ceil_div(p.k, chunk_cols<kFp8>());
  const int chunk_begin = place.split * p.chunks_per_split;
  const int chunk_end = min(chunks, chunk_begin + p.chunks_per_split);
  const unsigned char* tile_weights = weight_bytes<kFp8>(p) + static_cast<size_t>(stored) * chunks * kChunkBytes + lane * 16;

  uint4 wa[kLoads], wb[kLoads];
  auto load_weights = [&](int base) {
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      const int chunk = base + u * kGemmWarps + warp;
      if (chunk < chunk_end) {
        const unsigned char* w = tile_weights + static_cast<size_t>(chunk) * kChunkBytes;
        wa[u] = load_stream16(w);
        wb[u] = load_stream16(w + kChunkBytes / 2);
      } else {
        wa[u] = wb[u] = make_uint4(0, 0, 0, 0);
      }
    }
  };
  A2D_TRACE(const uint64_t t_start = trace_clock());
  // The weights do not depend on earlier kernels: start streaming them before waiting. Nor does the
  // row count: the host wrote the step state before the forward's first kernel.
  load_weights(chunk_begin);
  if (!kFp8 && !adapter_tile) prefetch_low_rank_rows(p, tile, threadIdx.x, blockDim.x);
  const int rows = kEpilogue == GemmEpilogue::logits ? logit_pass_rows(p) : p.state->rows;
  const StepView view = step_view(p);
  wait_for_previous_grid();
  A2D_TRACE(const uint64_t t_waited = trace_clock());
  A2D_TRACE(uint64_t t_data = 0);
  if (rows <= 0) return;
  const bool staged = kStageSsq && p.stage_ssq && !p.use_row_map && p.ssq_in_parts <= kStagedParts;
  if constexpr (kInput == GemmInput::rmsnorm_residual) {
    if (staged) {
      // ssq_in[part][row]: the first kCols rows of every part, 16 bytes at a time (kMaxRows >= kCols).
      constexpr int kQuads = kCols / 4;
      for (int e = threadIdx.x; e < p.ssq_in_parts * kQuads; e += blockDim.x) {
        const int part = e / kQuads, quad = e % kQuads;
        cp_async16(&ssq_stage[part * kCols + 4 * quad], p.ssq_in + part * kMaxRows + 4 * quad, true);
      }
      cp_async_commit();
    } else {
      rmsnorm_row_scales(p, p.ssq_in, kMaxRows, min(rows, kCols), min(rows, kCols), row_scale, kGemmWarps);
      __syncthreads();
    }
  }

  float acc[kTiles][4];
#pragma unroll
  for (int j = 0; j < kTiles; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;

  // Rounds of kLoads chunks per lane, the next round requested once the whole round is multiplied. The
  // round's body has no branch (chunks past the split multiply zeros): one basic block, so every chunk's
  // input loads can be issued ahead of the first multiply.
  const TileInputs<kTiles> in = tile_inputs<kTiles, kInput>(p, rows, g, staged ? nullptr : row_scale);
  for (int base = chunk_begin; base < chunk_end; base += kLoads * kGemmWarps) {
    if (base > chunk_begin) load_weights(base);
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      const int chunk = base + u * kGemmWarps + warp;
      multiply_chunk<kTiles, kInput, kFp8>(acc, wa[u], wb[u], p, rows, chunk * chunk_cols<kFp8>() + c * 8,
                                           chunk < chunk_end, in);
    }
    A2D_TRACE(if (t_data == 0) t_data = trace_clock_after(acc[0][0]));
  }
  allow_next_grid();
  A2D_TRACE(const uint64_t t_loop = trace_clock_after(acc[0][0]));
  if (kStageSsq && staged) {
    cp_async_wait<0>();
    __syncthreads();
    rmsnorm_row_scales(p, ssq_stage, kCols, min(rows, kCols), kCols, row_scale, kGemmWarps);
    __syncthreads();
#pragma unroll
    for (int j = 0; j < kTiles; ++j) {
      const float s0 = row_scale[j * 8 + 2 * c], s1 = row_scale[j * 8 + 2 * c + 1];
      acc[j][0] *= s0;
      acc[j][1] *= s1;
      acc[j][2] *= s0;
      acc[j][3] *= s1;
    }
  }

  // Split-K reduction across the 8 warps through shared memory.
#pragma unroll
  for (int j = 0; j < kTiles; ++j) {
    partial[warp][g][j * 8 + 2 * c] = acc[j][0];
    partial[warp][g][j * 8 + 2 * c + 1] = acc[j][1];
    partial[warp][g + 8][j * 8 + 2 * c] = acc[j][2];
    partial[warp][g + 8][j * 8 + 2 * c + 1] = acc[j][3];
  }
  __syncthreads();
  const int active_cols = min(rows, kCols);
  for (int e = threadIdx.x; e < kGemmTileRows * active_cols; e += blockDim.x) {
    const int r = e % kGemmTileRows;
    const int t = e / kGemmTileRows;
    float sum = 0.f;
#pragma unroll
    for (int w = 0; w < kGemmWarps; ++w) sum += partial[w][r][t];
    partial[0][r][t] = sum;
  }
  A2D_TRACE(const uint64_t t_reduced = trace_clock());
#if defined(A2D_GEMM_TRACE)
  auto record = [&](bool epilogue) {
    if (threadIdx.x == 0) trace_tile(p, {t_start, t_waited, t_data, t_loop, t_reduced}, adapter_tile, tile, place.split, epilogue);
  };
#endif

  // Split K across blocks: the tile's last block to finish sums every split's partial and runs the epilogue.
  if (p.splits > 1) {
    const auto sync = [] { __syncthreads(); };
    const auto from_thread0 = [&](unsigned value) {
      if (threadIdx.x == 0) arrived = value;
      __syncthreads();
      return arrived;
    };
    if (!merge_split_k<kCols>(p, stored, place.split, partial[0], active_cols, threadIdx.x, blockDim.x, sync, from_thread0)) {
      A2D_TRACE(record(false));
      return;
    }
  }
  if (!kFp8 && adapter_tile) {
    adapter_tile_epilogue<kCols>(p, view.serial, tile, partial[0], active_cols, threadIdx.x, blockDim.x);
  } else {
    tile_epilogue<kEpilogue, kCols, !kFp8>(p, view, tile, partial[0], partial[1], active_cols, threadIdx.x, blockDim.x,
                                           [] { __syncthreads(); });
  }
  A2D_TRACE(record(true));
}

// Wide forwards (GemmTuning::wide_from_rows): one 16-row tile per warp, kWideWarps consecutive tiles per
// block, all over the block's K split. The tile-per-block kernel's 8 warps each load their own chunk's input
// rows, so above 8 token rows the input bytes outgrow the weight bytes (64 rows: 4 KiB of inputs per 1 KiB
// chunk, mostly from L2) and its warps stall on them. Here the block copies each
// chunk of its input rows once into shared memory (kWideStages - 1 chunks ahead, cp.async), and every warp
// multiplies it with its own tile's chunk, which it streams from memory kWideLoads chunks ahead in
// registers. Then each warp runs its own tile's epilogue (split K merged by the tile's last warp to finish,
// in split order).
constexpr int kWideWarps = 4;
constexpr int kWideStageCols = 256;  // input columns staged ahead: 8 bf16 chunks, 4 e4m3 ones
constexpr int kWideLoads = 4;
template <int kTiles, GemmEpilogue kEpilogue, bool kFp8>
__global__ void __launch_bounds__(kWideWarps * 32, 4) gemm_wide_kernel(const __grid_constant__ GemmParams p) {
  constexpr int kCols = kTiles * 8;
  constexpr int kHalves = chunk_cols<kFp8>() / 32;
  constexpr int kWideStages = kWideStageCols / chunk_cols<kFp8>();
  // The input stages (one chunk, 32 or 64 k, of every input row each, as 32-column halves so that a warp's
  // reads of one half hit every bank once) during the K loop, then each warp's sums and scratch for its
  // epilogue: the same bytes.
  using Stages = bf16[kWideStages][kHalves][kCols][32];
  using Partials = float[kWideWarps][2][kGemmTileRows][kCols + 1];
  __shared__ __align__(16) unsigned char shared_bytes[sizeof(Stages) > sizeof(Partials) ? sizeof(Stages) : sizeof(Partials)];
  Stages& stage = *reinterpret_cast<Stages*>(shared_bytes);
  Partials& partial = *reinterpret_cast<Partials*>(shared_bytes);

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int g = lane / 4;
  const int c = lane % 4;
  // A fused adapter's tiles first, as in the tile-per-block kernel.
  const int out_tiles = ceil_div(p.n_rows, kGemmTileRows);
  const int tiles = out_tiles + p.adapter_tiles;
  const BlockPlace place = block_place(ceil_div(p.adapter_tiles, kWideWarps));
  const int logical = place.block * kWideWarps + warp;
  const bool has_tile = logical < tiles;
  const bool adapter_tile = logical < p.adapter_tiles;
  const int tile = adapter_tile ? logical : logical - p.adapter_tiles;
  const int stored = adapter_tile ? out_tiles + tile : tile;
  const int chunks = ceil_div(p.k, chunk_cols<kFp8>());
  const int chunk_begin = place.split * p.chunks_per_split;
  const int n = min(chunks, chunk_begin + p.chunks_per_split) - chunk_begin;  // >= 1 (gemm_plan)
  const unsigned char* weights =
      weight_bytes<kFp8>(p) + (static_cast<size_t>(min(stored, tiles - 1)) * chunks + chunk_begin) * kChunkBytes + lane * 16;

  A2D_TRACE(const uint64_t t_start = trace_clock());
  // The weights do not depend on earlier kernels: start streaming them before waiting.
  uint4 wa[kWideLoads], wb[kWideLoads];
#pragma unroll
  for (int u = 0; u < kWideLoads; ++u) {
    wa[u] = wb[u] = make_uint4(0, 0, 0, 0);
    const unsigned char* w = weights + static_cast<size_t>(min(u, n - 1)) * kChunkBytes;
    load_stream16_if(wa[u], w, has_tile && u < n);
    load_stream16_if(wb[u], w + kChunkBytes / 2, has_tile && u < n);
  }
  if (!kFp8 && has_tile && !adapter_tile) prefetch_low_rank_rows(p, tile, lane, 32);
  const int rows = kEpilogue == GemmEpilogue::logits ? logit_pass_rows(p) : p.state->rows;
  const StepView view = step_view(p);
  wait_for_previous_grid();
  A2D_TRACE(const uint64_t t_waited = trace_clock());
  A2D_TRACE(uint64_t t_data = 0);
  if (rows <= 0) return;

  // Local chunk i of every input row into stage slot i % kWideStages, 16 bytes a thread; zeros for
  // columns without a token row and past K. One commit group per call, empty or not.
  auto stage_chunk = [&](int i) {
    const int k0 = (chunk_begin + i) * chunk_cols<kFp8>();
    for (int piece = threadIdx.x; piece < kHalves * kCols * 4; piece += blockDim.x) {
      const int half = piece / (kCols * 4), t = piece / 4 % kCols, quarter = piece % 4;
      const int k = k0 + half * 32 + quarter * 8;
      const bool valid = t < rows && i < n && k < p.k;
      const int row = valid ? (p.use_row_map ? logit_row(p, t) : t) : 0;
      cp_async16(&stage[i % kWideStages][half][t][quarter * 8],
                 p.x + static_cast<size_t>(row) * p.x_stride + (valid ? k : 0), valid);
    }
    cp_async_commit();
  };
#pragma unroll
  for (int i = 0; i < kWideStages - 1; ++i) stage_chunk(i);

  float acc[kTiles][4];
#pragma unroll
  for (int j = 0; j < kTiles; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
  for (int base = 0; base < n; base += kWideLoads) {
#pragma unroll
    for (int u = 0; u < kWideLoads; ++u) {
      const int i = base + u;
      if (i >= n) break;  // the same for the whole block
      cp_async_wait<kWideStages - 2>();  // chunk i's copies (this thread's), then everyone's:
      __syncthreads();                   // and every warp is done with chunk i - 1's slot, refilled here
      stage_chunk(i + kWideStages - 1);
#pragma unroll
      for (int half = 0; half < kHalves; ++half) {
        const bf16 (*in)[32] = stage[i % kWideStages][half];
        const uint4 a = weight_fragment<kFp8>(wa[u], half), b = weight_fragment<kFp8>(wb[u], half);
#pragma unroll
        for (int j = 0; j < kTiles; ++j) {
          if (j > 0 && j * 8 >= rows) break;
          const uint4 xv = *reinterpret_cast<const uint4*>(&in[j * 8 + g][c * 8]);
          mma_bf16_16816(acc[j], a.x, b.x, a.y, b.y, xv.x, xv.y);
          mma_bf16_16816(acc[j], a.z, b.z, a.w, b.w, xv.z, xv.w);
        }
      }
      const int next = i + kWideLoads;
      const unsigned char* w = weights + static_cast<size_t>(min(next, n - 1)) * kChunkBytes;
      load_stream16_if(wa[u], w, has_tile && next < n);
      load_stream16_if(wb[u], w + kChunkBytes / 2, has_tile && next < n);
    }
    A2D_TRACE(if (t_data == 0) t_data = trace_clock_after(acc[0][0]));
  }
  cp_async_wait<0>();
  allow_next_grid();
  A2D_TRACE(const uint64_t t_loop = trace_clock_after(acc[0][0]));
  __syncthreads();  // every warp is done with the stages: their bytes become the partials
  if (!has_tile) return;

  const int active_cols = min(rows, kCols);
  float (*sums)[kCols + 1] = partial[warp][0];
#pragma unroll
  for (int j = 0; j < kTiles; ++j) {
    sums[g][j * 8 + 2 * c] = acc[j][0];
    sums[g][j * 8 + 2 * c + 1] = acc[j][1];
    sums[g + 8][j * 8 + 2 * c] = acc[j][2];
    sums[g + 8][j * 8 + 2 * c + 1] = acc[j][3];
  }
  __syncwarp();
  A2D_TRACE(const uint64_t t_reduced = trace_clock());
#if defined(A2D_GEMM_TRACE)
  // One record a warp (its tile), as the tile-per-block kernel writes one a block.
  auto record = [&](bool epilogue) {
    if (lane == 0) trace_tile(p, {t_start, t_waited, t_data, t_loop, t_reduced}, adapter_tile, tile, place.split, epilogue);
  };
#endif
  // Split K: the tile's last warp to finish (of its splits' blocks) sums them and runs the epilogue.
  if (p.splits > 1 &&
      !merge_split_k<kCols>(p, stored, place.split, sums, active_cols, lane, 32, [] { __syncwarp(); }, warp_from_lane0)) {
    A2D_TRACE(record(false));
    return;
  }
  if (!kFp8 && adapter_tile) {
    adapter_tile_epilogue<kCols>(p, view.serial, tile, sums, active_cols, lane, 32);
  } else {
    tile_epilogue<kEpilogue, kCols, !kFp8>(p, view, tile, sums, partial[warp][1], active_cols, lane, 32,
                                           [] { __syncwarp(); });
  }
  A2D_TRACE(record(true));
}

template <int kTiles, bool kFp8>
void launch_wide(const GemmParams& p, GemmEpilogue epilogue, dim3 grid, cudaStream_t stream, bool pdl) {
  using Ep = GemmEpilogue;
  const dim3 block(kWideWarps * 32);
  switch (epilogue) {
    case Ep::store_bf16: return launch(gemm_wide_kernel<kTiles, Ep::store_bf16, kFp8>, grid, block, 0, stream, pdl, p);
    case Ep::silu_mul: return launch(gemm_wide_kernel<kTiles, Ep::silu_mul, kFp8>, grid, block, 0, stream, pdl, p);
    case Ep::residual_add: return launch(gemm_wide_kernel<kTiles, Ep::residual_add, kFp8>, grid, block, 0, stream, pdl, p);
    case Ep::logits: return launch(gemm_wide_kernel<kTiles, Ep::logits, kFp8>, grid, block, 0, stream, pdl, p);
    case Ep::rope_qkv: return launch(gemm_wide_kernel<kTiles, Ep::rope_qkv, kFp8>, grid, block, 0, stream, pdl, p);
  }
}

template <bool kFp8>
void dispatch_wide(const GemmParams& p, const GemmPlan& plan, GemmInput input, GemmEpilogue epilogue, int max_rows,
                   cudaStream_t stream, bool pdl) {
  if (input != GemmInput::bf16_rows) throw std::logic_error("gemm: the wide kernel reads bf16 rows");
  const dim3 grid(plan.blocks, plan.splits);
  switch (ceil_div(max_rows, 8)) {
    case 2: return launch_wide<2, kFp8>(p, epilogue, grid, stream, pdl);
    case 3: return launch_wide<3, kFp8>(p, epilogue, grid, stream, pdl);
    case 4: return launch_wide<4, kFp8>(p, epilogue, grid, stream, pdl);
    case 5: return launch_wide<5, kFp8>(p, epilogue, grid, stream, pdl);
    case 6: return launch_wide<6, kFp8>(p, epilogue, grid, stream, pdl);
    case 7: return launch_wide<7, kFp8>(p, epilogue, grid, stream, pdl);
    case 8: return launch_wide<8, kFp8>(p, epilogue, grid, stream, pdl);
    default: throw std::logic_error("gemm: the wide kernel runs more than 8 rows");
  }
}

template <int kTiles, int kLoads, bool kFp8, GemmInput kInput, GemmEpilogue kEpilogue>
void launch_kernel(const GemmParams& p, dim3 grid, cudaStream_t stream, bool pdl) {
  launch(gemm_kernel<kTiles, kInput, kEpilogue, kLoads, kFp8>, grid, dim3(kGemmWarps * 32), 0, stream, pdl, p);
}

// The input/epilogue pairs the forward runs. Up to 8 rows the normalised GEMMs (qkv, gate/up, the lm_head) read
// the fp32 residual and normalise it at the load; above, they read rows normalised once by rmsnorm_rows
// (rmsnorm.cuh), so every GEMM of more than 8 rows takes bf16 rows.
template <int kTiles, int kLoads, bool kFp8>
void launch_gemm(const GemmParams& p, GemmInput input, GemmEpilogue epilogue, dim3 grid, cudaStream_t stream, bool pdl) {
  using In = GemmInput;
  using Ep = GemmEpilogue;
  if constexpr (kTiles == 1) {
    if (input == In::rmsnorm_residual) {
      switch (epilogue) {
        case Ep::store_bf16: return launch_kernel<1, kLoads, kFp8, In::rmsnorm_residual, Ep::store_bf16>(p, grid, stream, pdl);
        case Ep::silu_mul: return launch_kernel<1, kLoads, kFp8, In::rmsnorm_residual, Ep::silu_mul>(p, grid, stream, pdl);
        case Ep::rope_qkv: return launch_kernel<1, kLoads, kFp8, In::rmsnorm_residual, Ep::rope_qkv>(p, grid, stream, pdl);
        case Ep::logits: return launch_kernel<1, kLoads, kFp8, In::rmsnorm_residual, Ep::logits>(p, grid, stream, pdl);
        case Ep::residual_add: break;
      }
    } else if (epilogue == Ep::store_bf16) {
      return launch_kernel<1, kLoads, kFp8, In::bf16_rows, Ep::store_bf16>(p, grid, stream, pdl);
    } else if (epilogue == Ep::residual_add) {
      return launch_kernel<1, kLoads, kFp8, In::bf16_rows, Ep::residual_add>(p, grid, stream, pdl);
    }
    throw std::runtime_error("gemm: up to 8 rows a GEMM takes bf16 rows with the store_bf16 or residual_add "
                             "epilogue, or the normalised residual (rmsnorm_residual) with any other");
  } else {
    if (input == In::bf16_rows) {
      switch (epilogue) {
        case Ep::store_bf16: return launch_kernel<kTiles, kLoads, kFp8, In::bf16_rows, Ep::store_bf16>(p, grid, stream, pdl);
        case Ep::silu_mul: return launch_kernel<kTiles, kLoads, kFp8, In::bf16_rows, Ep::silu_mul>(p, grid, stream, pdl);
        case Ep::residual_add:
          return launch_kernel<kTiles, kLoads, kFp8, In::bf16_rows, Ep::residual_add>(p, grid, stream, pdl);
        case Ep::logits: return launch_kernel<kTiles, kLoads, kFp8, In::bf16_rows, Ep::logits>(p, grid, stream, pdl);
        case Ep::rope_qkv: return launch_kernel<kTiles, kLoads, kFp8, In::bf16_rows, Ep::rope_qkv>(p, grid, stream, pdl);
      }
    }
    throw std::runtime_error("gemm: above 8 rows a GEMM reads bf16 rows: normalise the residual first (rmsnorm_rows)");
  }
}

template <int kLoads, bool kFp8>
void dispatch_rows(const GemmParams& p, const GemmPlan& plan, GemmInput input, GemmEpilogue epilogue, int max_rows,
                   cudaStream_t stream, bool pdl) {
  const dim3 grid(plan.blocks, plan.splits);
  switch (ceil_div(max_rows, 8)) {
    case 1: return launch_gemm<1, kLoads, kFp8>(p, input, epilogue, grid, stream, pdl);
    case 2: return launch_gemm<2, kLoads, kFp8>(p, input, epilogue, grid, stream, pdl);
    case 3: return launch_gemm<3, kLoads, kFp8>(p, input, epilogue, grid, stream, pdl);
    case 4: return launch_gemm<4, kLoads, kFp8>(p, input, epilogue, grid, stream, pdl);
    case 5: return launch_gemm<5, kLoads, kFp8>(p, input, epilogue, grid, stream, pdl);
    case 6: return launch_gemm<6, kLoads, kFp8>(p, input, epilogue, grid, stream, pdl);
    case 7: return launch_gemm<7, kLoads, kFp8>(p, input, epilogue, grid, stream, pdl);
    default: return launch_gemm<8, kLoads, kFp8>(p, input, epilogue, grid, stream, pdl);
  }
}

}  // namespace

GemmPlan gemm_plan(int n_rows, int k, int max_rows, const GemmTuning& tuning, bool fp8, int adapter_tiles) {
  const int chunks = ceil_div(k, fp8 ? chunk_cols<true>() : chunk_cols<false>());
  const int tiles = ceil_div(n_rows, kGemmTileRows);
  // Every choice below is the weight's; a fused adapter's tiles ride it (more blocks, the same splits).
  const size_t split_tiles = static_cast<size_t>(tiles + adapter_tiles);
  GemmPlan plan;
  if (tuning.wide_from_rows > 0 && max_rows > 8 && max_rows >= tuning.wide_from_rows &&
      tiles >= tuning.wide_min_tiles_per_sm * tuning.sm_count) {
    // kWideWarps tiles per block; K split towards wide_split_blocks_per_sm blocks per SM, each split at
    // least wide_split_chunks chunks.
    plan.wide = true;
    const int weight_blocks = ceil_div(tiles, kWideWarps);
    const int splits = std::max(1, std::min(ceil_div(tuning.wide_split_blocks_per_sm * tuning.sm_count, weight_blocks),
                                            chunks / std::max(1, tuning.wide_split_chunks)));
    plan.blocks = ceil_div(tiles + adapter_tiles, kWideWarps);
    plan.chunks_per_split = ceil_div(chunks, splits);
    plan.splits = ceil_div(chunks, plan.chunks_per_split);
    if (plan.splits > 1) plan.scratch_floats = split_tiles * plan.splits * kMaxRows * kGemmTileRows;
    return plan;
  }
  plan.blocks = tiles + adapter_tiles;
  if (tuning.small_loads > 0 && max_rows <= 16 && chunks <= tuning.small_loads * kGemmWarps &&
      tiles <= std::max(1, tuning.blocks_per_sm) * tuning.sm_count) {
    // 4 loads where one round of 4 holds every chunk: the slots past the last chunk would multiply zeros
    // (e4m3 qkv and o of the 2B shape: 32 chunks).
    plan.loads = chunks <= 4 * kGemmWarps ? std::min(4, tuning.small_loads) : tuning.small_loads;
    plan.chunks_per_split = chunks;
    return plan;
  }
  plan.loads = tuning.loads;
  const int round = tuning.loads * kGemmWarps;  // chunks one block streams per round of loads
  const int rounds = ceil_div(chunks, round);
  const int target = max_rows > 16 ? std::min(tuning.blocks_per_sm, tuning.wide_blocks_per_sm) : tuning.blocks_per_sm;
  const int splits = target <= 0 ? 1 : std::min(rounds, ceil_div(target * tuning.sm_count, tiles));
  if (splits <= 1) {
    plan.splits = 1;
    plan.chunks_per_split = chunks;
    return plan;
  }
  // Whole rounds per split, and no empty split.
  plan.chunks_per_split = ceil_div(rounds, splits) * round;
  plan.splits = ceil_div(chunks, plan.chunks_per_split);
  if (plan.splits > 1) plan.scratch_floats = split_tiles * plan.splits * kMaxRows * kGemmTileRows;
  return plan;
}

void gemm(const GemmParams& params, GemmInput input, GemmEpilogue epilogue, int max_rows, const GemmTuning& tuning,
          cudaStream_t stream, bool pdl) {
  if (params.k % 8 != 0) throw std::runtime_error("gemm: k must be a multiple of 8, got " + std::to_string(params.k));
  if (max_rows < 1 || max_rows > kMaxRows) throw std::runtime_error("gemm: max_rows out of range");
  GemmParams p = params;
  const bool fp8 = p.weight_fp8 != nullptr;
  if (fp8 == (p.weight != nullptr) || fp8 != (p.weight_scale != nullptr)) {
    throw std::logic_error("gemm: give a bf16 weight, or an e4m3 weight with its scales");
  }
  if (p.adapter_tiles > 0 && (fp8 || p.adapter_b == nullptr || p.adapter_offset == nullptr || p.adapter_t == nullptr ||
                              p.adapter_rank < 1 ||
                              adapter_tile_count(p.adapter_total_rank) != p.adapter_tiles)) {
    throw std::logic_error("gemm: a fused adapter needs a bf16 weight, its B rows, offsets, t and ranks");
  }
  const GemmPlan plan = gemm_plan(p.n_rows, p.k, max_rows, tuning, fp8, p.adapter_tiles);
  p.splits = plan.splits;
  p.chunks_per_split = plan.chunks_per_split;
  p.stage_ssq = tuning.stage_ssq;
  if (plan.scratch_floats > 0 && (p.split_partials == nullptr || p.split_counters == nullptr)) {
    throw std::logic_error("gemm: split K without scratch");
  }
  if (plan.wide) {
    return fp8 ? dispatch_wide<true>(p, plan, input, epilogue, max_rows, stream, pdl)
               : dispatch_wide<false>(p, plan, input, epilogue, max_rows, stream, pdl);
  }
  if (plan.loads != 4 && plan.loads != 8) throw std::runtime_error("gemm: loads must be 4 or 8");
  if (fp8) {
    return plan.loads == 4 ? dispatch_rows<4, true>(p, plan, input, epilogue, max_rows, stream, pdl)
                           : dispatch_rows<8, true>(p, plan, input, epilogue, max_rows, stream, pdl);
  }
  return plan.loads == 4 ? dispatch_rows<4, false>(p, plan, input, epilogue, max_rows, stream, pdl)
                         : dispatch_rows<8, false>(p, plan, input, epilogue, max_rows, stream, pdl);
}

}  // namespace a2d::cuda
