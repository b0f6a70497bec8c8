"""The index math of engine/cuda/gemm_prefill.cu emulated on the CPU (no GPU needed): the tiled weight layout of
weights.cuh, the kernel's cp.async staging into shared memory, every lane's fragment reads, mma.m16n8k16's
fragment semantics (PTX ISA), the epilogue's (row, token) mapping and the K split (prefill_split's plan, each
split's step range, the partials' float4 [tile x group][thread] layout and their sum in split order), against
x @ W^T. A wrong index shows as errors of the order of the values; fp32 sums in another order as about 1e-5.

    .venv/bin/python engine/bench/gemm_prefill_emulate.py      (a few minutes; prints the max abs error per case)
"""
import numpy as np

kBlockTiles, kStageChunks, CE, kThreads = 8, 2, 512, 256
kMinSplitSteps = 2  # kPrefillMinSplitSteps


def ceil_div(a, b):
    return (a + b - 1) // b


def prefill_split(rows, n_rows, k, blocks_per_sm, sm_count, T=128):
    """gemm_prefill.cu's prefill_split for blocks of T token rows: (splits, steps_per_split), 0 for no split."""
    blocks = ceil_div(rows, T) * ceil_div(ceil_div(n_rows, 16), kBlockTiles)
    target = blocks_per_sm * sm_count
    steps = ceil_div(ceil_div(k, 32), kStageChunks)
    if blocks_per_sm <= 0 or 2 * blocks > target or steps < 2 * kMinSplitSteps:
        return 1, 0
    wanted = min(target // blocks, steps // kMinSplitSteps)
    per = ceil_div(steps, wanted)
    splits = ceil_div(steps, per)
    return (splits, per) if splits >= 2 else (1, 0)


def mma(acc, a, b):
    # a: [4 regs][2 halves] per lane -> A 16x16; b: [2 regs][2 halves] per lane -> B 16x8
    A = np.zeros((16, 16)); B = np.zeros((16, 8))
    for lane in range(32):
        g, c = lane // 4, lane % 4
        A[g, 2*c:2*c+2] = a[lane][0]; A[g+8, 2*c:2*c+2] = a[lane][1]
        A[g, 2*c+8:2*c+10] = a[lane][2]; A[g+8, 2*c+8:2*c+10] = a[lane][3]
        B[2*c:2*c+2, g] = b[lane][0]; B[2*c+8:2*c+10, g] = b[lane][1]
    D = A @ B
    for lane in range(32):
        g, c = lane // 4, lane % 4
        acc[lane][0] += D[g, 2*c]; acc[lane][1] += D[g, 2*c+1]; acc[lane][2] += D[g+8, 2*c]; acc[lane][3] += D[g+8, 2*c+1]


def emulate(N, K, M, steps_per_split, T=128, seed=0):
    G = T // 32  # a warp's groups of 8 tokens
    rng = np.random.default_rng(seed)
    W = rng.standard_normal((N, K)).astype(np.float32)
    X = rng.standard_normal((M, K)).astype(np.float32)
    tiles = (N + 15) // 16; chunks = (K + 31) // 32

    def tiled_index(row, col):
        tile, r, chunk, c = row // 16, row % 16, col // 32, (col % 32) // 8
        return (((tile * chunks + chunk) * 2 + r // 8) * 32 + (r % 8) * 4 + c) * 8 + col % 8

    Wt = np.zeros(tiles * 16 * chunks * 32, np.float32)
    for r in range(N):
        for c in range(K):
            Wt[tiled_index(r, c)] = W[r, c]
    all_steps = (chunks + 1) // 2
    splits = ceil_div(all_steps, steps_per_split) if steps_per_split > 0 else 1
    grid_x, grid_y = ceil_div(M, T), ceil_div(tiles, 8)
    partial = np.full(splits * grid_x * grid_y * 4 * G * kThreads * 4, np.nan, np.float32)
    out = np.full((M, N), np.nan, np.float32)

    def block_acc(bx, by, z):
        """One block's accumulators after its K loop: {(warp, i, j): [32 lanes][4]}."""
        tile0, token0 = by * 8, bx * T
        first = z * steps_per_split if steps_per_split > 0 else 0
        end = min(all_steps, first + steps_per_split) if steps_per_split > 0 else all_steps
        acc = {(w, i, j): np.zeros((32, 4)) for w in range(8) for i in range(4) for j in range(G)}
        for local in range(end - first):
            s = first + local
            ws = np.zeros(8 * 2 * CE, np.float32); xs = np.zeros(2 * T * 32, np.float32)
            for piece in range(1024):
                tile, chunk, e = piece // 128, piece // 64 % 2, piece % 64 * 8
                gc = s * 2 + chunk
                if tile0 + tile < tiles and gc < chunks:
                    off = ((tile0 + tile) * chunks + gc) * CE + e
                    ws[(tile * 2 + chunk) * CE + e:(tile * 2 + chunk) * CE + e + 8] = Wt[off:off + 8]
            for piece in range(2 * T * 4):
                chunk, token, quarter = piece // (T * 4), piece // 4 % T, piece % 4
                k = (s * 2 + chunk) * 32 + quarter * 8
                if token0 + token < M and k < K:
                    xs[(chunk * T + token) * 32 + quarter * 8:(chunk * T + token) * 32 + quarter * 8 + 8] = X[token0 + token, k:k + 8]
            for w in range(8):
                wt, wtok = (w % 2) * 4, (w // 2) * (T // 4)
                for chunk in range(2):
                    for i in range(4):
                        for j in range(G):
                            a1 = []; a2 = []; b1 = []; b2 = []
                            for lane in range(32):
                                g, c = lane // 4, lane % 4
                                base = ((wt + i) * 2 + chunk) * CE + lane * 8
                                wa = ws[base:base + 8]; wb = ws[base + 256:base + 264]
                                xv = xs[(chunk * T + wtok + j * 8 + g) * 32 + c * 8:][:8]
                                # uint4 .x = elements 0,1; .y = 2,3; .z = 4,5; .w = 6,7
                                a1.append([wa[0:2], wb[0:2], wa[2:4], wb[2:4]]); b1.append([xv[0:2], xv[2:4]])
                                a2.append([wa[4:6], wb[4:6], wa[6:8], wb[6:8]]); b2.append([xv[4:6], xv[6:8]])
                            mma(acc[(w, i, j)], a1, b1); mma(acc[(w, i, j)], a2, b2)
        return acc

    def quad(z, block, i, j, tid):
        """Index of the float4 (tile i, group j, thread tid) of split z's partial of `block`."""
        return ((z * grid_x * grid_y + block) * 4 * G + i * G + j) * kThreads + tid

    for by in range(grid_y):
        for bx in range(grid_x):
            tile0, token0 = by * 8, bx * T
            block = by * grid_x + bx
            if splits == 1:
                acc = block_acc(bx, by, 0)
            else:
                for z in rng.permutation(splits):  # the splits publish in any order
                    own = block_acc(bx, by, z)
                    for (w, i, j), a in own.items():
                        for lane in range(32):
                            q = quad(z, block, i, j, w * 32 + lane)
                            partial[q * 4:q * 4 + 4] = a[lane]
                acc = {(w, i, j): np.zeros((32, 4)) for w in range(8) for i in range(4) for j in range(G)}
                for z in range(splits):  # the last to arrive adds them in split order
                    for (w, i, j), a in acc.items():
                        for lane in range(32):
                            q = quad(z, block, i, j, w * 32 + lane)
                            a[lane] += partial[q * 4:q * 4 + 4]
            for w in range(8):
                wt, wtok = (w % 2) * 4, (w // 2) * (T // 4)
                for i in range(4):
                    tile = tile0 + wt + i
                    if tile >= tiles: continue
                    for j in range(G):
                        for lane in range(32):
                            g, c = lane // 4, lane % 4
                            row0, row1 = tile * 16 + g, tile * 16 + g + 8
                            for h in range(2):
                                t = token0 + wtok + j * 8 + 2 * c + h
                                if t >= M: continue
                                if row0 < N: out[t, row0] = acc[(w, i, j)][lane][h]
                                if row1 < N: out[t, row1] = acc[(w, i, j)][lane][h + 2]
    return np.nanmax(np.abs(out - X @ W.T)), int(np.isnan(out).sum()), splits


# The 2B shape's prefill GEMMs at a short chunk, as the plan splits them at one block per SM on 132 SMs.
for name, n_rows, k in (("qkv", 2560, 2048), ("o", 2048, 2048), ("gate/up", 12288, 2048), ("down", 2048, 6144)):
    print(f"plan, 2B {name} at 64 / 256 / 1024 rows:", [prefill_split(r, n_rows, k, 1, 132) for r in (64, 256, 1024)])
# Partial weight block, partial K stage, partial token block; unsplit, then K split unevenly (9 steps as 4 + 4 + 1);
# at every block shape's token rows (gemm_prefill.cuh, kPrefillShapes).
for T in (128, 64, 32):
    for N, K, M, per in ((40, 200, 150, 0), (40, 520, 150, 4)):
        err, nans, splits = emulate(N, K, M, per, T)
        print(f"{T}-token blocks, N {N} K {K} M {M}, {splits} split(s): max abs err {err:.2e}, nan {nans}")
        assert err < 1e-3 and nans == 0, "gemm_prefill's index math is wrong"
