"""The index math of engine/cuda/gemm_prefill.cu emulated on the CPU (no GPU needed): the tiled weight layout of
weights.cuh, the kernel's cp.async staging into shared memory, every lane's fragment reads, mma.m16n8k16's
fragment semantics (PTX ISA) and the epilogue's (row, token) mapping, against x @ W^T. A wrong index shows as
errors of the order of the values; fp32 sums in another order as about 1e-5.

    .venv/bin/python engine/bench/gemm_prefill_emulate.py      (about a minute; prints the max abs error)
"""
import numpy as np
rng = np.random.default_rng(0)
N, K, M = 40, 200, 150   # weight rows, k, tokens
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
kBlockTiles, kBlockTokens, kStageChunks, CE = 8, 128, 2, 512
steps = (chunks + 1) // 2
out = np.full((M, N), np.nan, np.float32)
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
for by in range((tiles + 7) // 8):
    for bx in range((M + 127) // 128):
        tile0, token0 = by * 8, bx * 128
        acc = {(w, i, j): np.zeros((32, 4)) for w in range(8) for i in range(4) for j in range(4)}
        for s in range(steps):
            ws = np.zeros(8 * 2 * CE, np.float32); xs = np.zeros(2 * 128 * 32, np.float32)
            for piece in range(1024):
                tile, chunk, e = piece // 128, piece // 64 % 2, piece % 64 * 8
                gc = s * 2 + chunk
                if tile0 + tile < tiles and gc < chunks:
                    off = ((tile0 + tile) * chunks + gc) * CE + e
                    ws[(tile * 2 + chunk) * CE + e:(tile * 2 + chunk) * CE + e + 8] = Wt[off:off + 8]
            for piece in range(1024):
                chunk, token, quarter = piece // 512, piece // 4 % 128, piece % 4
                k = (s * 2 + chunk) * 32 + quarter * 8
                if token0 + token < M and k < K:
                    xs[(chunk * 128 + token) * 32 + quarter * 8:(chunk * 128 + token) * 32 + quarter * 8 + 8] = X[token0 + token, k:k + 8]
            for w in range(8):
                wt, wtok = (w % 2) * 4, (w // 2) * 32
                for chunk in range(2):
                    for i in range(4):
                        for j in range(4):
                            a1 = []; a2 = []; b1 = []; b2 = []
                            for lane in range(32):
                                g, c = lane // 4, lane % 4
                                base = ((wt + i) * 2 + chunk) * CE + lane * 8
                                wa = ws[base:base + 8]; wb = ws[base + 256:base + 264]
                                xv = xs[(chunk * 128 + wtok + j * 8 + g) * 32 + c * 8:][:8]
                                # uint4 .x = elements 0,1; .y = 2,3; .z = 4,5; .w = 6,7
                                a1.append([wa[0:2], wb[0:2], wa[2:4], wb[2:4]]); b1.append([xv[0:2], xv[2:4]])
                                a2.append([wa[4:6], wb[4:6], wa[6:8], wb[6:8]]); b2.append([xv[4:6], xv[6:8]])
                            mma(acc[(w, i, j)], a1, b1); mma(acc[(w, i, j)], a2, b2)
        for w in range(8):
            wt, wtok = (w % 2) * 4, (w // 2) * 32
            for i in range(4):
                tile = tile0 + wt + i
                if tile >= tiles: continue
                for j in range(4):
                    for lane in range(32):
                        g, c = lane // 4, lane % 4
                        row0, row1 = tile * 16 + g, tile * 16 + g + 8
                        for h in range(2):
                            t = token0 + wtok + j * 8 + 2 * c + h
                            if t >= M: continue
                            if row0 < N: out[t, row0] = acc[(w, i, j)][lane][h]
                            if row1 < N: out[t, row1] = acc[(w, i, j)][lane][h + 2]
want = X @ W.T
print("max abs err", np.nanmax(np.abs(out - want)), "nan", np.isnan(out).sum())
assert np.nanmax(np.abs(out - want)) < 1e-3 and not np.isnan(out).any(), "gemm_prefill's index math is wrong"
