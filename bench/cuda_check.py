"""Checks and times the a2d CUDA engine on a GPU machine, in one run (bench/NOTES.md records each run).

    python3 bench/cuda_check.py --lib build/cuda-bench/liba2d_cuda_bench.so --out $OUT [--peers DIR]

1. device ceilings: device-to-device copy bandwidth through PyTorch (bytes read + written);
2. the engine's forward on tiny random models of every supported switch (GQA, head_dim 16..128, QKV/O
   bias, QK-norm, tied embeddings, bf16/f16/f32 and host/device weight sources, KV lengths that split
   attention) against a PyTorch fp32 forward on the same weights, logits relative error per row;
3. the Backend interface on tiny model folders: CUDA vs CPU backend logits, and greedy generations
   token for token;
4. the MiniCPM5-2B shape on random bf16 weights: upload from host memory, the same fp32 check at
   KV 1000, then ms per forward for rows 1/4/8/16/32 at KV 1k/8k/32k for three launch variants, a
   GEMM-only and an attention-only breakdown, and the weight-stream floor;
5. the PyTorch peers (graph_baseline.py) side by side, then the engine's real load path (load_model +
   CUDA backend) on a 2B-shape folder written to local disk.
Prints a short table last; full logs and summary.json go to --out.
"""
import argparse
import ctypes
import json
import math
import os
import subprocess
import sys
import time
import traceback

import torch
import torch.nn.functional as F

WEIGHT_NAMES = ["embed", "lm_head", "final_norm", "input_norm", "post_norm", "q", "k", "v", "o", "q_bias",
                "k_bias", "v_bias", "o_bias", "q_norm", "k_norm", "gate", "up", "down"]
SOURCE_TYPES = {torch.bfloat16: 0, torch.float16: 1, torch.float32: 2}
REL_TOL = 1e-2
# The reference and the random models live on the GPU; A2D_CHECK_DEVICE=cpu runs the reference parts on the
# CPU (checking the reference itself against transformers, no GPU needed).
DEV = os.environ.get("A2D_CHECK_DEVICE", "cuda")
STARTED = time.time()
# A tuning is a dict of BenchOptions fields (below) to values, the engine's default for every field it leaves
# out; each field has a short label (tuning_label, parse_tuning).
TUNING_LABELS = {
    "loads": "s",                     # GemmTuning: 16-byte load pairs in flight per lane (4 or 8)
    "blocks_per_sm": "b",             # the K-split target
    "small_loads": "x",               # the one-round depth of small GEMMs (0: off)
    "stage_ssq": "ssq",               # the row scale after the K loop (0/1)
    "attention_trigger": "tr",        # ModelOptions::attention_early_trigger: 0 never, 1 at short KV, 2 always
    "attention_split_keys": "ks",     # ModelOptions::attention_split_keys (0/1)
    "wide_from_rows": "wf",           # GemmTuning's wide kernel: its first row count (0: never),
    "wide_min_tiles_per_sm": "wt",    # its least tiles per SM,
    "wide_split_blocks_per_sm": "wsb",  # its K split: blocks per SM,
    "wide_split_chunks": "wsc",       # and least chunks per split
    "decode_prefill_gemm_rows": "dp",  # ModelOptions::decode_prefill_gemm_rows: forwards of this many rows and more
                                      # on the prefill GEMMs (0: never),
    "decode_prefill_pdl": "dpp",      # and their kernels chained by PDL (0/1)
    "wgmma_cluster": "wc",            # GemmTuning::prefill_wgmma_cluster: the warpgroup GEMM's K splits as clusters (0/1)
}
# No early trigger after attention, no attention key split: the option paths off the default.
OPTIONS_TUNING = {"attention_trigger": 0, "attention_split_keys": 0}
# The tile-per-block kernel above 8 rows too (no wide kernel); the wide kernel for every GEMM above 8 rows.
NARROW_TUNING = {"wide_from_rows": 0}
WIDE_TUNING = {"wide_from_rows": 9, "wide_min_tiles_per_sm": 0}
# Every forward of more than 8 rows with its projections on the prefill GEMMs (where the model allows: bf16, no
# row adapter, RoPE in the QKV epilogue).
PREFILL_GEMMS_TUNING = {"decode_prefill_gemm_rows": 9}
# The tiny checks' configurations: the default, the optional paths, both GEMM kernels above 8 rows, the prefill
# GEMMs above 8 rows.
SCHEDULES = (("default", {}), ("options", OPTIONS_TUNING), ("narrow", NARROW_TUNING), ("wide", WIDE_TUNING),
             ("prefill", PREFILL_GEMMS_TUNING))
# Which kernels the captured forwards run (Engine.run_only; 7: all).
GEMM_KERNELS, ATTENTION_KERNELS, ALL_KERNELS = 1, 2, 7


def tuning_label(tuning):
    """A tuning's fields by their labels, "s8 b2" ("default": none)."""
    return " ".join(f"{TUNING_LABELS[name]}{value}" for name, value in tuning.items()) or "default"


def parse_tuning(text):
    """tuning_label's text back into a tuning: "s8 b2 wf0", or "default"."""
    by_label = {label: name for name, label in TUNING_LABELS.items()}
    tuning = {}
    for word in text.split():
        if word == "default":
            continue
        label = word.rstrip("-0123456789")
        if label not in by_label or label == word:
            raise SystemExit(f"tuning {text!r}: {word!r} is not a label followed by a number "
                             f"({', '.join(f'{l}: {n}' for n, l in TUNING_LABELS.items())})")
        tuning[by_label[label]] = int(word[len(label):])
    return tuning


class BenchOptions(ctypes.Structure):
    """engine/bench/forward_bench.cu's BenchOptions, field for field; -1 keeps the engine's default."""
    _fields_ = [("struct_size", ctypes.c_int), ("graphs", ctypes.c_int), ("pdl", ctypes.c_int)] + \
               [(name, ctypes.c_int) for name in ("loads blocks_per_sm small_loads stage_ssq attention_trigger "
                                                  "attention_split_keys wide_from_rows wide_min_tiles_per_sm "
                                                  "wide_split_blocks_per_sm wide_split_chunks "
                                                  "decode_prefill_gemm_rows decode_prefill_pdl wgmma_cluster").split()]


class Shape(ctypes.Structure):
    """engine/bench/forward_bench.cu's BenchShape, field for field."""
    _fields_ = [(n, ctypes.c_int) for n in ("hidden intermediate layers heads kv_heads head_dim vocab max_context "
                                            "mask_token_id tied qkv_bias o_bias qk_norm fp8").split()] + \
               [("rms_eps", ctypes.c_double), ("rope_theta", ctypes.c_double)] + \
               [(n, ctypes.c_int) for n in ("adapter_rank", "adapter_targets", "adapter_on_window")]


# A row adapter's targets in the engine's order (AdapterTarget), each a projection's weight name.
ADAPTER_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")


def log(*args):
    print(*args, flush=True)


class Lib:
    def __init__(self, path):
        self.lib = ctypes.CDLL(path)
        self.lib.a2d_bench_create.restype = ctypes.c_void_p
        self.lib.a2d_bench_destroy.argtypes = [ctypes.c_void_p]

    def call(self, name, *args):
        error = ctypes.create_string_buffer(2048)
        rc = getattr(self.lib, name)(*args, error, 2048)
        if rc != 0:
            raise RuntimeError(f"{name}: {error.value.decode()}")


class Engine:
    """A DeviceModel through the harness's C interface."""

    def __init__(self, lib, cfg, graphs=True, pdl=True, fuse_rope=True, adapter=None):
        """adapter: None, or (rule, rank) with rule "window" or "mask": a row adapter on every projection, whose
        factors upload_adapter then gives."""
        self.lib, self.cfg = lib, cfg
        rule, rank = adapter or ("window", 0)
        if rule not in ("window", "mask"):
            raise ValueError(f"adapter rule {rule!r}: window or mask")
        shape = Shape(cfg["hidden"], cfg["inter"], cfg["layers"], cfg["heads"], cfg["kv_heads"], cfg["head_dim"],
                      cfg["vocab"], cfg["max_context"], cfg["mask"], int(cfg["tied"]), int(cfg["qkv_bias"]),
                      int(cfg["o_bias"]), int(cfg["qk_norm"]), int(cfg.get("fp8", False)), cfg["eps"], cfg["theta"],
                      rank, (1 << len(ADAPTER_TARGETS)) - 1 if rank else 0, int(rule == "window"))
        error = ctypes.create_string_buffer(2048)
        self.handle = lib.lib.a2d_bench_create(ctypes.byref(shape), int(graphs), int(pdl), int(fuse_rope), error, 2048)
        if not self.handle:
            raise RuntimeError("a2d_bench_create: " + error.value.decode())
        self.handle = ctypes.c_void_p(self.handle)
        self.keep = []

    def upload(self, weights, dtypes=None, on_host=False, adapters=None):
        """weights: (name, layer) -> tensor, or for an FP8 engine's projections and lm_head (e4m3 tensor, fp32
        row scales). adapters (an engine made with one): (target, layer) -> (a [rank, in], b [out, rank]) for every
        target of ADAPTER_TARGETS and layer; they are copied from host memory."""
        dtypes = dtypes or {}
        for (target, layer), (a, b) in (adapters or {}).items():
            a, b = (t.to(torch.bfloat16).contiguous().cpu() for t in (a, b))
            self.keep += [a, b]
            self.lib.call("a2d_bench_upload_adapter", self.handle, ADAPTER_TARGETS.index(target), layer,
                          ctypes.c_void_p(a.data_ptr()), ctypes.c_void_p(b.data_ptr()), SOURCE_TYPES[torch.bfloat16])
        for (name, layer), tensor in weights.items():
            if isinstance(tensor, tuple):
                q, scale = (t.contiguous().cpu() if on_host else t.contiguous() for t in tensor)
                self.keep += [q, scale]
                self.lib.call("a2d_bench_upload_fp8", self.handle, WEIGHT_NAMES.index(name), layer,
                              ctypes.c_void_p(q.data_ptr()), ctypes.c_void_p(scale.data_ptr()), int(not on_host))
                continue
            t = tensor.to(dtypes.get(name, tensor.dtype)).contiguous()
            if on_host:
                t = t.cpu()
            self.keep.append(t)
            self.lib.call("a2d_bench_upload", self.handle, WEIGHT_NAMES.index(name), layer, ctypes.c_void_p(t.data_ptr()),
                          SOURCE_TYPES[t.dtype], int(not on_host))
        times = (ctypes.c_double * 4)()
        self.lib.call("a2d_bench_finish", self.handle, times)
        self.keep.clear()
        return {"context_s": times[0], "upload_s": times[1], "capture_s": times[2], "weight_bytes": times[3]}

    def forward(self, cached, commit, tokens, logit_rows, want_logits=True):
        rows, n = len(tokens), len(logit_rows)
        tok = (ctypes.c_int * rows)(*tokens)
        lr = (ctypes.c_int * max(n, 1))(*logit_rows)
        logits = torch.empty(max(n, 1), self.cfg["vocab"], dtype=torch.float32)
        ct = (ctypes.c_int * max(n, 1))()
        cc = (ctypes.c_float * max(n, 1))()
        self.lib.call("a2d_bench_forward", self.handle, cached, commit, tok, rows, lr, n,
                      ctypes.c_void_p(logits.data_ptr()) if want_logits else None, ct, cc)
        return logits[:n], list(ct)[:n], list(cc)[:n]

    def prefill(self, tokens):
        for start in range(0, len(tokens), 64):
            chunk = tokens[start:start + 64]
            self.forward(start, len(chunk), chunk, [], want_logits=False)

    def time(self, cached, commit, rows, logit_count, iterations=20):
        device, step = ctypes.c_double(), ctypes.c_double()
        self.lib.call("a2d_bench_time", self.handle, cached, commit, rows, logit_count, iterations,
                      ctypes.byref(device), ctypes.byref(step))
        return device.value, step.value

    def reconfigure(self, tuning=None, graphs=True, pdl=True):
        """Recaptures the forwards under a tuning (TUNING_LABELS; None or {}: the defaults), every kernel on."""
        options = BenchOptions(ctypes.sizeof(BenchOptions), int(graphs), int(pdl),
                               *[-1] * (len(BenchOptions._fields_) - 3))
        for name, value in (tuning or {}).items():
            if name not in TUNING_LABELS:
                raise ValueError(f"tuning field {name!r}: not one of {', '.join(TUNING_LABELS)}")
            setattr(options, name, int(value))
        self.lib.call("a2d_bench_reconfigure", self.handle, ctypes.byref(options))

    def run_only(self, kernels):
        """Disables every other kernel of the captured forwards (GEMM_KERNELS, ATTENTION_KERNELS, bits of
        ALL_KERNELS) until the next reconfigure: timing breakdowns, whose outputs are meaningless."""
        self.lib.call("a2d_bench_kernels", self.handle, ctypes.c_uint(kernels))

    def fill_kv(self, seed=1):
        self.lib.call("a2d_bench_fill_kv", self.handle, ctypes.c_ulonglong(seed))

    def close(self):
        self.lib.lib.a2d_bench_destroy(self.handle)


# ---------------------------------------------------------------- random models and the fp32 reference

def make_weights(cfg, seed, lm_scale=1.0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    H, I, D, V = cfg["hidden"], cfg["inter"], cfg["head_dim"], cfg["vocab"]
    nq, nkv = cfg["heads"] * D, cfg["kv_heads"] * D

    def w(*shape, std=0.02):
        return (torch.randn(*shape, generator=g, device=DEV) * std).to(torch.bfloat16)

    def norm(n):
        return (1.0 + 0.1 * torch.randn(n, generator=g, device=DEV)).to(torch.bfloat16)

    W = {("embed", 0): w(V, H), ("final_norm", 0): norm(H)}
    if not cfg["tied"]:
        W[("lm_head", 0)] = w(V, H, std=0.02 * lm_scale)
    for l in range(cfg["layers"]):
        W.update({("input_norm", l): norm(H), ("post_norm", l): norm(H), ("q", l): w(nq, H), ("k", l): w(nkv, H),
                  ("v", l): w(nkv, H), ("o", l): w(H, nq), ("gate", l): w(I, H), ("up", l): w(I, H),
                  ("down", l): w(H, I)})
        if cfg["qkv_bias"]:
            W.update({("q_bias", l): w(nq, std=0.1), ("k_bias", l): w(nkv, std=0.1), ("v_bias", l): w(nkv, std=0.1)})
        if cfg["o_bias"]:
            W[("o_bias", l)] = w(H, std=0.1)
        if cfg["qk_norm"]:
            W.update({("q_norm", l): norm(D), ("k_norm", l): norm(D)})
    return W


def random_adapter(rank, out_features, in_features, gen):
    """One projection's random row adapter factors, bf16 on the host: a [rank, in], b [out, rank]."""
    a = (torch.randn(rank, in_features, generator=gen) / in_features ** 0.5).to(torch.bfloat16)
    b = (torch.randn(out_features, rank, generator=gen) * 0.05).to(torch.bfloat16)
    return a, b


def reference_logits(W, cfg, tokens, n_causal, rows, dtype=torch.float32):
    """fp32 forward of the whole sequence: rows < n_causal are causal, later rows (the window) see all.
    dtype=torch.bfloat16 gives a plain PyTorch bf16 forward instead (norms and softmax in fp32), the
    yardstick for what bf16 activations alone cost."""
    f = lambda name, l=0: W[(name, l)].to(dtype)
    T, D, nh, nkv = len(tokens), cfg["head_dim"], cfg["heads"], cfg["kv_heads"]
    eps = cfg["eps"]
    ids = torch.tensor(tokens, device=DEV)
    x = f("embed")[ids]
    pos = torch.arange(T, device=DEV)
    allowed = (pos[None, :] <= pos[:, None]) | (pos[:, None] >= n_causal)
    inv = 1.0 / (cfg["theta"] ** (torch.arange(0, D, 2, device=DEV, dtype=torch.int64).float() / D))
    angle = pos.float()[:, None] * inv[None, :]
    cos, sin = torch.cat([angle.cos()] * 2, -1).to(dtype), torch.cat([angle.sin()] * 2, -1).to(dtype)

    def rms(v, weight):
        v32 = v.float()
        return (v32 * torch.rsqrt(v32.pow(2).mean(-1, keepdim=True) + eps)).to(dtype) * weight

    def rope(v):
        half = v.shape[-1] // 2
        rotated = torch.cat([-v[..., half:], v[..., :half]], -1)
        return v * cos[:, None, :] + rotated * sin[:, None, :]

    for l in range(cfg["layers"]):
        h = rms(x, f("input_norm", l))
        q, k, v = h @ f("q", l).T, h @ f("k", l).T, h @ f("v", l).T
        if cfg["qkv_bias"]:
            q, k, v = q + f("q_bias", l), k + f("k_bias", l), v + f("v_bias", l)
        q, k, v = q.view(T, nh, D), k.view(T, nkv, D), v.view(T, nkv, D)
        if cfg["qk_norm"]:
            q, k = rms(q, f("q_norm", l)), rms(k, f("k_norm", l))
        q, k = rope(q), rope(k)
        k, v = k.repeat_interleave(nh // nkv, 1), v.repeat_interleave(nh // nkv, 1)
        scores = torch.einsum("qhd,khd->hqk", q, k).float() / math.sqrt(D)
        scores = scores.masked_fill(~allowed[None], float("-inf"))
        a = torch.einsum("hqk,khd->qhd", scores.softmax(-1).to(dtype), v).reshape(T, nh * D)
        x = x + a @ f("o", l).T + (f("o_bias", l) if cfg["o_bias"] else 0)
        h = rms(x, f("post_norm", l))
        x = x + (F.silu(h @ f("gate", l).T) * (h @ f("up", l).T)) @ f("down", l).T
    head = f("embed") if cfg["tied"] else f("lm_head")
    return (rms(x[rows], f("final_norm")) @ head.T).float()


def rel_errors(got, want):
    return ((got - want).norm(dim=-1) / want.norm(dim=-1)).tolist()


def greedy(logits, mask):
    l = logits.double().clone()
    l[:, mask] = float("-inf")
    p = l.softmax(-1)
    conf, token = p.max(-1)
    return token.tolist(), conf.tolist()


def check_case(engine, W, cfg, prefix, commit, window, gen, bf16_yardstick=None):
    """One forward after a prefix of `prefix` cached tokens; returns (max rel err, argmax agreement, conf diff)."""
    V = cfg["vocab"]
    toks = torch.randint(0, V, (prefix + commit + window,), generator=gen).tolist()
    for j in range(window):  # a block in progress: some positions still masked
        if j % 2 == 0:
            toks[prefix + commit + j] = cfg["mask"]
    engine.prefill(toks[:prefix])
    rows = list(range(commit + window))
    logits, tokens, conf = engine.forward(prefix, commit, toks[prefix:], rows)
    want = reference_logits(W, cfg, toks, prefix + commit, [prefix + r for r in rows])
    errs = rel_errors(logits.to(DEV), want)
    if bf16_yardstick is not None:
        bf16_yardstick.append(max(rel_errors(
            reference_logits(W, cfg, toks, prefix + commit, [prefix + r for r in rows], torch.bfloat16), want)))
    want_tok, want_conf = greedy(want, cfg["mask"])
    agree = sum(a == b for a, b in zip(tokens, want_tok)) / len(rows)
    conf_diff = max(abs(a - b) for a, b in zip(conf, want_conf))
    # The device argmax/confidence must match the engine's own logits exactly up to fp32 rounding.
    own_tok, own_conf = greedy(logits, cfg["mask"])
    self_agree = sum(a == b for a, b in zip(tokens, own_tok)) / len(rows)
    self_conf = max(abs(a - b) for a, b in zip(conf, own_conf))
    return max(errs), agree, conf_diff, self_agree, self_conf


def tiny_configs():
    base = dict(layers=2, eps=1e-6, theta=10000.0, tied=False, qkv_bias=False, o_bias=False, qk_norm=False,
                max_context=8192)
    return {
        "llama_gqa4_d32": dict(base, hidden=256, inter=688, heads=8, kv_heads=2, head_dim=32, vocab=1000),
        "qwen2_bias_d32": dict(base, hidden=128, inter=256, heads=4, kv_heads=2, head_dim=32, vocab=515, qkv_bias=True),
        "qwen3_qknorm_tied_d64": dict(base, hidden=128, inter=384, heads=4, kv_heads=2, head_dim=64, vocab=700,
                                      qk_norm=True, tied=True),
        "llama_mha_d16_bias": dict(base, hidden=64, inter=160, heads=4, kv_heads=4, head_dim=16, vocab=300,
                                   qkv_bias=True, o_bias=True, theta=5e6),
        "minicpm_like_d128": dict(base, layers=3, hidden=512, inter=1024, heads=16, kv_heads=2, head_dim=128,
                                  vocab=4096, theta=5e6),
    }


def section_tiny(lib, out):
    results = {}
    cases = [(0, 5, 4), (37, 4, 4), (200, 0, 8), (100, 60, 4), (1000, 4, 4), (3000, 1, 16), (5000, 8, 32)]
    for i, (name, cfg) in enumerate(tiny_configs().items()):
        cfg["mask"] = cfg["vocab"] - 1
        W = make_weights(cfg, seed=100 + i, lm_scale=10.0)
        # Exercise every source path: host staging, f16 and f32 conversion.
        dtypes, on_host = {}, False
        if name == "qwen2_bias_d32":
            dtypes = {"q": torch.float16, "k": torch.float16, "v": torch.float16, "input_norm": torch.float32,
                      "post_norm": torch.float32, "final_norm": torch.float32}
        if name == "llama_gqa4_d32":
            on_host = True
        W = {key: t.to(dtypes.get(key[0], t.dtype)).to(torch.bfloat16) if key[0] in dtypes else t
             for key, t in W.items()}  # the reference sees the values the engine receives
        engine = Engine(lib, cfg)
        engine.upload(W, dtypes, on_host)
        # The default, the optional paths, and both GEMM kernels above 8 rows (gemm.cuh).
        for schedule, tuning in SCHEDULES:
            engine.reconfigure(tuning)
            gen = torch.Generator().manual_seed(7 + i)
            rows = []
            for prefix, commit, window in cases:
                err, agree, conf_diff, self_agree, self_conf = check_case(engine, W, cfg, prefix, commit, window, gen)
                rows.append(dict(prefix=prefix, commit=commit, window=window, rel_err=err, argmax_agree=agree,
                                 conf_diff=conf_diff, device_argmax_vs_own_logits=self_agree, device_conf_vs_own=self_conf))
                log(f"  tiny {name:24s} {schedule:6s} P={prefix:5d} C={commit:2d} W={window:2d}: rel_err {err:.2e}  "
                    f"argmax agree {agree:.2f}  conf diff {conf_diff:.1e}  device argmax vs own logits {self_agree:.2f} "
                    f"({self_conf:.1e})")
            results[f"{name}/{schedule}"] = rows
        engine.close()
    for schedule, _ in SCHEDULES:
        worst = max(r["rel_err"] for key, rows in results.items() if key.endswith("/" + schedule) for r in rows)
        log(f"  tiny worst rel_err, {schedule} GEMMs: {worst:.2e} ({'PASS' if worst <= 1e-2 else 'FAIL'}: <= 1e-2)")
    return results


# ---------------------------------------------------------------- model folders (Backend interface)

def opens_with_anchor(cfg):
    """A window adapter's folder or the window rule's: its window opens with its anchor token (docs/decoding.md)."""
    return bool(cfg.get("window_adapter") or cfg.get("window_rule"))


def write_folder(path, cfg, W, block_size=4, remasking="low_confidence", advance="block"):
    from safetensors.torch import save_file
    os.makedirs(path, exist_ok=True)
    arch = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}[cfg.get("type", "llama")]
    config = {
        "architectures": [arch], "model_type": cfg.get("type", "llama"), "hidden_size": cfg["hidden"],
        "intermediate_size": cfg["inter"], "num_hidden_layers": cfg["layers"], "num_attention_heads": cfg["heads"],
        "num_key_value_heads": cfg["kv_heads"], "head_dim": cfg["head_dim"], "vocab_size": cfg["vocab"],
        "rms_norm_eps": cfg["eps"], "rope_theta": cfg["theta"], "max_position_embeddings": cfg.get("max_pos", 8192),
        "tie_word_embeddings": cfg["tied"], "attention_bias": cfg["o_bias"], "hidden_act": "silu",
        "torch_dtype": "bfloat16",
        "a2d": {"format_version": 1, "mask_token_id": cfg["mask"], "mask_token": "<|mask|>", "block_size": block_size,
                "shift_logits": True, "eos_token_ids": [cfg["vocab"] - 2], "trained": False,
                "decoding": {"threshold": 0.9, "min_per_step": 1, "steps": 0, "temperature": 0.0, "top_p": 1.0,
                             "remasking": remasking, "advance": advance, "commit": "fused"}},
    }
    hf = {"embed": "model.embed_tokens.weight", "lm_head": "lm_head.weight", "final_norm": "model.norm.weight"}
    per_layer = {"input_norm": "input_layernorm.weight", "post_norm": "post_attention_layernorm.weight",
                 "q": "self_attn.q_proj.weight", "k": "self_attn.k_proj.weight", "v": "self_attn.v_proj.weight",
                 "o": "self_attn.o_proj.weight", "gate": "mlp.gate_proj.weight", "up": "mlp.up_proj.weight",
                 "down": "mlp.down_proj.weight", "q_bias": "self_attn.q_proj.bias", "k_bias": "self_attn.k_proj.bias",
                 "v_bias": "self_attn.v_proj.bias", "o_bias": "self_attn.o_proj.bias",
                 "q_norm": "self_attn.q_norm.weight", "k_norm": "self_attn.k_norm.weight"}
    tensors = {}
    for (name, l), t in W.items():
        key = hf[name] if name in hf else f"model.layers.{l}.{per_layer[name]}"
        tensors[key] = t.contiguous().cpu()
    for rule in ("mask", "window"):
        rank = cfg.get(f"{rule}_adapter", 0)
        if not rank:
            continue
        # A random row adapter on every projection (docs/model-format.md).
        gen = torch.Generator().manual_seed(77)
        for key in sorted(tensors):
            if key.endswith("proj.weight"):
                stem = key.removesuffix(".weight")
                tensors[f"{stem}.{rule}_a"], tensors[f"{stem}.{rule}_b"] = random_adapter(rank, *tensors[key].shape, gen)
        config["a2d"][f"{rule}_adapter"] = {"rank": rank, "targets": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                                       "up_proj", "down_proj"]}
    if cfg.get("window_rule"):  # the window adapter's window and attention, no factors (docs/model-format.md)
        config["a2d"]["window_rule"] = True
    save_file(tensors, os.path.join(path, "model.safetensors"))
    with open(os.path.join(path, "config.json"), "w") as fh:
        json.dump(config, fh, indent=1)


def section_backend(lib, workdir):
    results = {}
    folders = {
        "llama_gqa4": dict(type="llama", layers=2, hidden=256, inter=512, heads=8, kv_heads=2, head_dim=32, vocab=600,
                           eps=1e-6, theta=10000.0, tied=False, qkv_bias=False, o_bias=False, qk_norm=False),
        "qwen3_qknorm": dict(type="qwen3", layers=2, hidden=128, inter=384, heads=4, kv_heads=2, head_dim=64,
                             vocab=500, eps=1e-6, theta=1e6, tied=True, qkv_bias=False, o_bias=False, qk_norm=True),
        "qwen2_bias": dict(type="qwen2", layers=2, hidden=128, inter=256, heads=4, kv_heads=2, head_dim=32,
                           vocab=515, eps=1e-6, theta=1e6, tied=False, qkv_bias=True, o_bias=False, qk_norm=False),
        # The mask adapter: head_dim 32 (RoPE in the QKV epilogue, B in rope-pair order) and 64 (the rope kernel).
        "llama_adapter32": dict(type="llama", layers=2, hidden=256, inter=520, heads=8, kv_heads=2, head_dim=32,
                                vocab=600, eps=1e-6, theta=10000.0, tied=False, qkv_bias=False, o_bias=False,
                                qk_norm=False, mask_adapter=8),
        "qwen3_adapter64": dict(type="qwen3", layers=2, hidden=128, inter=384, heads=4, kv_heads=2, head_dim=64,
                                vocab=500, eps=1e-6, theta=1e6, tied=True, qkv_bias=False, o_bias=False, qk_norm=True,
                                mask_adapter=4),
        # The window adapter (every window row, the anchor opening the window): rank 64 (the 16-byte B loads) on
        # the bundled model's head_dim, and rank 4 (the scalar loop) with the rope kernel.
        "llama_window64": dict(type="llama", layers=2, hidden=256, inter=520, heads=4, kv_heads=2, head_dim=64,
                               vocab=600, eps=1e-6, theta=10000.0, tied=False, qkv_bias=False, o_bias=False,
                               qk_norm=False, window_adapter=64),
        "qwen3_window4": dict(type="qwen3", layers=2, hidden=128, inter=384, heads=4, kv_heads=2, head_dim=64,
                              vocab=500, eps=1e-6, theta=1e6, tied=True, qkv_bias=False, o_bias=False, qk_norm=True,
                              window_adapter=4),
        # The window rule: the window adapter's window and attention with no factors (the base's GEMMs).
        "llama_window_rule": dict(type="llama", layers=2, hidden=256, inter=520, heads=4, kv_heads=2, head_dim=64,
                                  vocab=600, eps=1e-6, theta=10000.0, tied=False, qkv_bias=False, o_bias=False,
                                  qk_norm=False, window_rule=True),
    }
    for i, (name, cfg) in enumerate(folders.items()):
        cfg["mask"] = cfg["vocab"] - 1
        W = make_weights(cfg, seed=300 + i, lm_scale=25.0)
        path = os.path.join(workdir, name)
        write_folder(path, cfg, W)
        gen = torch.Generator().manual_seed(11 + i)
        commit = torch.randint(0, cfg["vocab"] - 2, (150,), generator=gen).tolist()
        window = [cfg["mask"], 5, cfg["mask"], cfg["mask"]]
        if opens_with_anchor(cfg):
            window = [commit.pop()] + window  # the window opens with its anchor (docs/decoding.md)
        prompts = [torch.randint(0, cfg["vocab"] - 2, (int(torch.randint(3, 40, (1,), generator=gen)),),
                                 generator=gen).tolist() for _ in range(12)]
        results[name] = compare_backends(lib, path, commit, window, prompts, cfg["vocab"], 48, name)
        results[name]["batch"] = compare_batch(lib, path, cfg, gen, name)
        # The sliding window (advance slide): commits of any length each step, windows partly revealed; at a
        # lower threshold, so that steps reveal several tokens. Mask adapter folders with the leftmost top-up.
        write_folder(path + "_slide", cfg, W, remasking="leftmost" if cfg.get("mask_adapter") else "low_confidence", advance="slide")
        results[name + "_slide"] = compare_backends(lib, path + "_slide", commit, window, prompts, cfg["vocab"], 48,
                                                    name + " slide", threshold=0.5)
    off = [name for name, r in results.items() if not r.get("batch", {}).get("ok", True)]
    if off:
        raise AssertionError(f"batched logits differ from alone beyond {BATCH_TOLERANCE}: {', '.join(off)}")
    return results


def backend_logits_error(lib, path, commit, window, vocab):
    """Max per-row relative error, CUDA vs CPU backend, of every row of one forward (commit then window)."""
    n, w = len(commit), len(window)
    out = {}
    for device in ("cpu", "cuda"):
        logits = torch.empty(n + w, vocab, dtype=torch.float32)
        lib.call("a2d_bench_backend_logits", path.encode(), device.encode(), (ctypes.c_int * n)(*commit), n,
                 (ctypes.c_int * w)(*window), w, ctypes.c_void_p(logits.data_ptr()))
        out[device] = logits
    return max(rel_errors(out["cuda"], out["cpu"]))


# Batched against alone: at most this relative error of a logits row on the CUDA backend (a forward of more rows
# splits its bf16 sums differently; the tiny forwards' own tolerance against the reference), none on the CPU backend.
BATCH_TOLERANCE = {"cuda": 1e-2, "cpu": 0.0}


def compare_batch(lib, path, cfg, gen, name, n_seq=5):
    """Continuous batching through the Backend interface on both backends: n_seq sequences of different prompt
    lengths (one long enough to be chunked) each make a prompt forward and a decoding forward, all on one backend's
    slots at once and each alone; every logits row of the two must agree (BATCH_TOLERANCE)."""
    mask, vocab = cfg["mask"], cfg["vocab"]
    first = [150, 3, 37, 1, 70][:n_seq]
    second = [2, 0, 1, 4, 1][:n_seq]
    width = 5 if opens_with_anchor(cfg) else 4

    def window():  # masked positions and a revealed one; the window adapter's opens with its anchor token
        w = [mask, int(torch.randint(0, vocab - 2, (1,), generator=gen)), mask, mask]
        return ([int(torch.randint(0, vocab - 2, (1,), generator=gen))] + w) if width == 5 else w

    tokens, rows = [], 0
    for f, c in zip(first, second):
        tokens += torch.randint(0, vocab - 2, (f,), generator=gen).tolist() + window()
        tokens += torch.randint(0, vocab - 2, (c,), generator=gen).tolist() + window()
        rows += 2 * width + c
    result = {}
    for device in ("cpu", "cuda"):
        together = torch.empty(rows, vocab, dtype=torch.float32)
        alone = torch.empty(rows, vocab, dtype=torch.float32)
        lib.call("a2d_bench_backend_batch_logits", path.encode(), device.encode(), n_seq, (ctypes.c_int * n_seq)(*first),
                 (ctypes.c_int * n_seq)(*second), width, (ctypes.c_int * len(tokens))(*tokens),
                 ctypes.c_void_p(together.data_ptr()), ctypes.c_void_p(alone.data_ptr()))
        result[device] = max(rel_errors(together, alone))
    log(f"  backend {name:14s}: {n_seq} sequences batched vs alone, logits rel_err cuda {result['cuda']:.2e}, "
        f"cpu {result['cpu']:.2e}")
    result["ok"] = all(result[d] <= BATCH_TOLERANCE[d] for d in BATCH_TOLERANCE)
    return result


def compare_backends(lib, path, commit, window, prompts, vocab, max_new, name, threshold=0.9):
    """CUDA vs CPU backend on one model folder: logits of a commit (several GPU chunks when long) plus a
    window, then greedy generations token for token (the folder's default decoding at `threshold`)."""
    err = backend_logits_error(lib, path, commit, window, vocab)
    same, agree_tokens, total_tokens, forwards = 0, 0, 0, {}
    for prompt in prompts:
        seqs = {}
        for device in ("cpu", "cuda"):
            toks = (ctypes.c_int * 1024)()
            count, nfe = ctypes.c_int(), ctypes.c_longlong()
            lib.call("a2d_bench_backend_generate", path.encode(), device.encode(), (ctypes.c_int * len(prompt))(*prompt),
                     len(prompt), max_new, 4, ctypes.c_double(threshold), toks, ctypes.byref(count), ctypes.byref(nfe))
            seqs[device] = list(toks)[:count.value]
            forwards[device] = forwards.get(device, 0) + nfe.value
        a, b = seqs["cpu"], seqs["cuda"]
        same += a == b
        agree_tokens += next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        total_tokens += len(a)
    result = dict(logits_rel_err=err, identical_generations=f"{same}/{len(prompts)}",
                  tokens_before_first_divergence=f"{agree_tokens}/{total_tokens}", forwards=forwards)
    log(f"  backend {name:14s}: cuda vs cpu logits rel_err {err:.2e}; greedy generations identical {same}/"
        f"{len(prompts)}, tokens before first divergence {agree_tokens}/{total_tokens}; forwards {forwards}")
    return result


# Self-written prompts for a trained model's CPU vs CUDA comparison (no benchmark text).
TRAINED_PROMPTS = [
    "The capital of France is", "Write a short poem about the sea.", "What is 12 times 7?",
    "List three colours of the rainbow.", "Explain why the sky is blue in one sentence.",
    "Translate 'good morning' into Spanish.", "Once upon a time, in a small village,",
    "What is the opposite of hot?", "Name a fruit that is yellow.", "How many legs does a spider have?",
    "Give me a synonym for happy.", "Describe a cat in two sentences.", "What comes after Monday?",
    "Complete the sentence: The quick brown fox", "Why do we need sleep?", "What is water made of?",
]


def section_trained(lib, model_dir, summary):
    """CUDA vs CPU on a trained model folder (the demo model): real text, logits that are not near-tied."""
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    with open(os.path.join(model_dir, "config.json")) as fh:
        config = json.load(fh)
    prompts = [tok.encode(text).ids for text in TRAINED_PROMPTS]
    commit = [t for p in prompts for t in p][:150]
    mask = config["a2d"]["mask_token_id"]
    window = [mask, commit[-1], mask, mask]
    name = os.path.basename(model_dir.rstrip("/"))
    summary["trained"] = compare_backends(lib, model_dir, commit, window, prompts, config["vocab_size"], 64, name)
    decoding = config["a2d"]["decoding"]
    if decoding["threshold"] != 0.9:  # also at the model's own decoding
        summary["trained_default"] = compare_backends(lib, model_dir, commit, window, prompts, config["vocab_size"], 64,
                                                      f"{name} {decoding['remasking']}/{decoding.get('advance', 'block')}@{decoding['threshold']}",
                                                      threshold=decoding["threshold"])


# ---------------------------------------------------------------- the 2B shape

MINICPM = dict(layers=42, hidden=2048, inter=6144, heads=16, kv_heads=2, head_dim=128, vocab=130560, eps=1e-6,
               theta=5e6, tied=False, qkv_bias=False, o_bias=False, qk_norm=False, max_context=32768 + 4096,
               mask=130560 - 1)


def stream_bytes(cfg):
    H, I, D = cfg["hidden"], cfg["inter"], cfg["head_dim"]
    per_layer = (cfg["heads"] + 2 * cfg["kv_heads"]) * D * H + H * cfg["heads"] * D + 2 * I * H + H * I
    return 2 * (cfg["layers"] * per_layer + cfg["vocab"] * H)


def copy_bandwidth():
    n = 1 << 30  # 2 GiB of bf16 each way
    a = torch.empty(n, dtype=torch.bfloat16, device=DEV).normal_()
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    torch.cuda.synchronize()
    times = []
    for _ in range(10):
        s, e = torch.cuda.Event(True), torch.cuda.Event(True)
        s.record(); b.copy_(a); e.record(); torch.cuda.synchronize()
        times.append(s.elapsed_time(e))
    times.sort()
    del a, b
    torch.cuda.empty_cache()
    return 2 * 2 * n / (times[len(times) // 2] * 1e-3) / 1e12


def profile_forward(engine, rows, kv, out, summary, tuning=None):
    """Kernel by kernel (CUPTI through torch.profiler; eager launches without PDL, so no kernel's time
    includes waiting for its predecessor): where a forward's time goes."""
    from torch.profiler import ProfilerActivity, profile
    tuning = tuning or {}
    engine.reconfigure(tuning, graphs=False, pdl=False)
    engine.time(kv, 0, rows, rows, iterations=2)
    forwards = 5
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        engine.time(kv, 0, rows, rows, iterations=forwards - 3)  # time() adds 3 warm-up forwards
    table = []
    for e in prof.key_averages():
        total = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if total <= 0:
            continue
        table.append((total / forwards, e.count // forwards, e.key))
    table.sort(reverse=True)
    lines = [f"rows {rows} kv {kv} {tuning_label(tuning)}: us per forward, launches per forward, kernel"]
    lines += [f"{t:9.1f} {n:4d}  {name[:150]}" for t, n, name in table[:14]]
    lines.append(f"{sum(t for t, _, _ in table):9.1f}       all kernels")
    with open(os.path.join(out, "profile.txt"), "a") as fh:
        fh.write("\n".join(lines) + "\n\n")
    summary.setdefault("profile", {})[f"rows{rows}_kv{kv}_{tuning_label(tuning)}"] = [
        dict(us=t, launches=n, kernel=name) for t, n, name in table]
    log("  " + "\n  ".join(lines))
    engine.reconfigure()


def section_2b(lib, out, summary):
    cfg = dict(MINICPM)
    W = make_weights(cfg, seed=2026)
    torch.cuda.synchronize()
    host_start = time.time()
    host = {k: t.cpu() for k, t in W.items()}
    log(f"  2B weights to host memory in {time.time() - host_start:.1f} s")
    engine = Engine(lib, cfg)
    t0 = time.time()
    startup = engine.upload(host, on_host=True)
    startup["wall_upload_and_capture_s"] = time.time() - t0
    startup["upload_GBps"] = startup["weight_bytes"] / startup["upload_s"] / 1e9
    del host
    summary["startup_2b_from_host_memory"] = startup
    log(f"  2B upload from host: {startup}")

    # Tunings (tuning_label), each checked, then timed GEMM-only and whole: the default; attention's early
    # trigger never, and always; K split towards one block per SM (down in two splits instead of three).
    tunings = [{}, {"attention_trigger": 0}, {"attention_trigger": 2}, {"blocks_per_sm": 1}]
    # ROWS_SWEEP=1: only the default tuning's check, then ms/forward against the window's row count (what
    # wider windows or several sequences in one forward cost).
    sweep = os.environ.get("ROWS_SWEEP") == "1"
    if sweep:
        # The default (the wide kernel from 32 rows), the tile-per-block kernel at every row count, and the
        # wide kernel for every GEMM above 8 rows.
        split = [{"wide_split_blocks_per_sm": blocks, "wide_split_chunks": chunks} for blocks, chunks in ((4, 4), (5, 2))]
        tunings = [tunings[0], NARROW_TUNING, WIDE_TUNING] + [
            {**WIDE_TUNING, "wide_split_blocks_per_sm": blocks, "wide_split_chunks": chunks}
            for blocks, chunks in ((4, 4), (5, 2), (8, 2))] + split + [PREFILL_GEMMS_TUNING]
        if os.environ.get("SWEEP_TUNINGS"):  # e.g. "dp33 dpp0;dp33 dpp1": these instead, the first also at KV 8k
            tunings = [parse_tuning(text) for text in os.environ["SWEEP_TUNINGS"].split(";")]
    checks = {}
    for tuning in tunings:
        engine.reconfigure(tuning)
        gen = torch.Generator().manual_seed(5)
        yard = []
        err, agree, conf_diff, self_agree, self_conf = check_case(engine, W, cfg, 1000, 4, 4, gen, yard)
        checks[tuning_label(tuning)] = dict(rel_err=err, argmax_agree=agree, conf_diff=conf_diff,
                                            device_argmax_vs_own_logits=self_agree, device_conf_vs_own=self_conf,
                                            torch_bf16_rel_err=yard[0])
        log(f"  2B P=1000 C=4 W=4 {tuning_label(tuning)}: rel_err {err:.2e} (PyTorch bf16 forward: {yard[0]:.2e}) "
            f"argmax agree {agree:.2f} conf diff {conf_diff:.1e} device argmax vs own {self_agree:.2f} ({self_conf:.1e})")
        if sweep:  # a wide forward too: 64 rows
            wide_yard = []
            err, agree, conf_diff, self_agree, self_conf = check_case(engine, W, cfg, 1000, 4, 60, gen, wide_yard)
            checks[tuning_label(tuning)]["wide_64_rows"] = dict(rel_err=err, argmax_agree=agree, torch_bf16_rel_err=wide_yard[0])
            log(f"  2B P=1000 C=4 W=60 {tuning_label(tuning)}: rel_err {err:.2e} (PyTorch bf16 forward: {wide_yard[0]:.2e}) "
                f"argmax agree {agree:.2f} conf diff {conf_diff:.1e} device argmax vs own {self_agree:.2f} ({self_conf:.1e})")
    summary["check_2b"] = dict(prefix=1000, commit=4, window=4, **checks[tuning_label(tunings[0])], all=checks)

    engine.fill_kv()
    floor_bytes = stream_bytes(cfg)
    bw = summary["copy_TBps"]
    floor_ms = floor_bytes / (bw * 1e12) * 1e3
    summary["stream_bytes"] = floor_bytes
    summary["floor_ms"] = floor_ms
    timings = []

    def timed(label, rows, kv, iterations=20, on=None):
        device_ms, step_ms = (on or engine).time(kv, 0, rows, rows, iterations=iterations)
        timings.append(dict(variant=label, rows=rows, kv=kv, device_ms=device_ms, step_ms=step_ms,
                            ratio=device_ms / floor_ms))
        log(f"  {label:22s} rows {rows:2d} kv {kv:5d}: {device_ms:.3f} ms/forward (step {step_ms:.3f} ms), "
            f"{device_ms / floor_ms:.2f}x floor")
        return device_ms

    if sweep:
        for tuning in tunings:
            engine.reconfigure(tuning)
            for kv in (1024, 8192) if tuning == tunings[0] else (1024,):
                for rows in (1, 4, 8, 12, 16, 19, 24, 32, 34, 40, 48, 49, 56, 64):
                    if rows > 8 or tuning == tunings[0]:
                        timed(f"rows sweep {tuning_label(tuning)}", rows, kv)
        summary["timings_2b"] = timings
        engine.close()
        return W
    for rows, kv in ((4, 1024), (4, 32768), (32, 1024)):
        profile_forward(engine, rows, kv, out, summary)
    for pdl in (1, 0):
        per_kernel = ctypes.c_double()
        lib.call("a2d_bench_launch_overhead", 300, pdl, ctypes.byref(per_kernel))
        summary[f"empty_kernel_us_pdl{pdl}"] = per_kernel.value
        log(f"  300 empty dependent kernels in one graph, pdl {pdl}: {per_kernel.value:.2f} us per kernel")
    best = None
    for tuning in tunings:
        engine.reconfigure(tuning)
        engine.run_only(GEMM_KERNELS)
        label = f"gemm-only {tuning_label(tuning)}"
        t4 = timed(label, 4, 1024)
        for rows in (8, 32):
            timed(label, rows, 1024)
        engine.reconfigure(tuning)
        whole4 = timed(f"graph+pdl {tuning_label(tuning)}", 4, 1024)
        for rows, kv in ((16, 1024), (4, 32768)):
            timed(f"graph+pdl {tuning_label(tuning)}", rows, kv)
        if best is None or whole4 < best[0]:
            best = (whole4, tuning)
    # The tunings again, whole forward, taking turns for several rounds (this machine drifts by up to
    # 0.05 ms between single timings): the median of each.
    turns = {}
    for round_ in range(5):
        for t in tunings:
            engine.reconfigure(t)
            for rows, kv in ((1, 1024), (4, 1024), (8, 1024), (4, 8192), (4, 32768)):
                device_ms, _ = engine.time(kv, 0, rows, rows, iterations=20)
                turns.setdefault((tuning_label(t), rows, kv), []).append(device_ms)
    summary["turns_2b"] = [dict(variant=k[0], rows=k[1], kv=k[2], ms=v, median_ms=sorted(v)[len(v) // 2])
                           for k, v in turns.items()]
    for (label, rows, kv), v in turns.items():
        log(f"  turns {label:28s} rows {rows:2d} kv {kv:5d}: median {sorted(v)[len(v) // 2]:.3f} ms of "
            + " ".join(f"{x:.3f}" for x in v))
    tuning = best[1]
    name = tuning_label(tuning)
    summary["tuning_best"] = dict(label=name, tuning=dict(tuning))
    log(f"  best tuning by the whole forward at rows 4: {name}")
    engine.reconfigure(tuning)
    for rows in (1, 4, 8, 16, 32):
        for kv in (1024, 8192, 32768):
            timed(f"graph+pdl {name}", rows, kv)
    # RoPE in the QKV GEMM's epilogue (the default where the shape allows) against the separate rope
    # kernel, on a second engine with the same weights: the same logits up to rounding, then the time,
    # alternating between the two so that clock drift hits both alike.
    plain = Engine(lib, cfg, fuse_rope=False)
    plain.upload(W)
    plain.reconfigure(tuning)
    err, agree, _, _, _ = check_case(plain, W, cfg, 1000, 4, 4, torch.Generator().manual_seed(5))
    summary["check_2b_rope_kernel"] = dict(rel_err=err, argmax_agree=agree)
    log(f"  2B P=1000 C=4 W=4 with the rope kernel: rel_err {err:.2e} argmax agree {agree:.2f}")
    plain.fill_kv()
    engine.fill_kv()
    for round_ in range(2):
        for label, e in (("rope kernel", plain), ("rope fused", engine)):
            for rows, kv in ((1, 1024), (4, 1024), (8, 1024), (32, 1024), (4, 32768)):
                timed(f"{label} r{round_}", rows, kv, on=e)
    plain.close()
    for label, graphs, pdl in (("graph", True, False), ("eager+pdl", False, True)):
        engine.reconfigure(tuning, graphs=graphs, pdl=pdl)
        for rows in (4, 32):
            timed(f"{label} {name}", rows, 1024, 20 if graphs else 8)
    engine.reconfigure(tuning)
    engine.run_only(ATTENTION_KERNELS)
    for rows in (4, 8, 32):
        for kv in (1024, 8192, 32768):
            timed("attention-only", rows, kv)
    engine.reconfigure(tuning)
    summary["timings_2b"] = timings
    engine.close()
    return W


def section_peers(peers_dir, out, summary):
    script = os.path.join(peers_dir, "graph_baseline.py")
    proc = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=300)
    text = proc.stdout + proc.stderr
    with open(os.path.join(out, "peers.log"), "w") as fh:
        fh.write(text)
    summary["peers"] = proc.stdout.strip().splitlines()
    log("  " + "\n  ".join(summary["peers"]))


def section_load_folder(lib, W, workdir, summary):
    cfg = dict(MINICPM)
    path = os.path.join(workdir, "minicpm5-2b-shape")
    t0 = time.time()
    write_folder(path, dict(cfg, max_pos=65536), W)
    log(f"  wrote the 2B folder in {time.time() - t0:.1f} s")
    # A fresh process: the CUDA context is created by the load itself, as in a server start.
    code = ("import ctypes,sys,time,json;t=time.time();l=ctypes.CDLL(sys.argv[1]);s=(ctypes.c_double*2)();"
            "e=ctypes.create_string_buffer(2048);rc=l.a2d_bench_load_folder(sys.argv[2].encode(),s,e,2048);"
            "print(json.dumps(dict(rc=rc,error=e.value.decode(),load_model_s=s[0],backend_s=s[1],"
            "process_s=time.time()-t)))")
    proc = subprocess.run([sys.executable, "-c", code, lib.lib._name, path], capture_output=True, text=True, timeout=240)
    result = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.stdout.strip() else {"stderr": proc.stderr}
    summary["load_folder_2b"] = result
    log(f"  real load path (fresh process): {result}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lib", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--peers", default=None)
    parser.add_argument("--workdir", default="/tmp/a2d-cuda-check")
    parser.add_argument("--skip", default="", help="comma-separated sections to skip: tiny,backend,2b,peers,load")
    parser.add_argument("--trained", default=None, help="a trained model folder: CUDA vs CPU backend on real text")
    parser.add_argument("--deadline", type=float, default=1e9, help="start no section after this many seconds")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    os.makedirs(args.workdir, exist_ok=True)
    skip = set(filter(None, args.skip.split(",")))
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    lib = Lib(args.lib)
    summary = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__}
    failures = []

    def section(name, fn, *a):
        if name in skip:
            return None
        if time.time() - STARTED > args.deadline:
            log(f"== {name}: skipped, past the {args.deadline:.0f} s deadline")
            return None
        log(f"== {name} ({time.time() - STARTED:.0f} s)")
        try:
            return fn(*a)
        except Exception:
            failures.append(name)
            log(traceback.format_exc())
            return None

    summary["copy_TBps"] = copy_bandwidth()
    log(f"copy bandwidth: {summary['copy_TBps']:.2f} TB/s")
    summary["tiny"] = section("tiny", section_tiny, lib, args.out)
    summary["backend"] = section("backend", section_backend, lib, args.workdir)
    if args.trained:
        section("trained", section_trained, lib, args.trained, summary)
    W = section("2b", section_2b, lib, args.out, summary)
    if args.peers:
        section("peers", section_peers, args.peers, args.out, summary)
    if W is not None:
        section("load", section_load_folder, lib, W, args.workdir, summary)
    summary["failures"] = failures
    with open(os.path.join(args.out, "summary.json"), "w") as fh:
        json.dump(summary, fh, indent=1)

    # The short table.
    log("\n==== summary ====")
    log(f"gpu {summary['gpu']}, copy {summary['copy_TBps']:.2f} TB/s, failures: {failures or 'none'}")
    if summary.get("tiny"):
        worst = max(r["rel_err"] for rows in summary["tiny"].values() for r in rows)
        log(f"tiny forwards: worst rel err {worst:.2e} ({'PASS' if worst <= REL_TOL else 'FAIL'} at {REL_TOL})")
    for name, r in (summary.get("backend") or {}).items():
        log(f"backend {name}: logits {r['logits_rel_err']:.2e}, identical {r['identical_generations']}, "
            f"agree {r['tokens_before_first_divergence']}")
    if summary.get("trained"):
        r = summary["trained"]
        log(f"trained model: logits {r['logits_rel_err']:.2e}, identical {r['identical_generations']}, "
            f"agree {r['tokens_before_first_divergence']}")
    if "check_2b" in summary:
        for name, c in summary["check_2b"]["all"].items():
            ok = c['rel_err'] <= c['torch_bf16_rel_err']
            log(f"2B check {name}: rel err {c['rel_err']:.2e} vs the fp32 reference, PyTorch's own bf16 forward "
                f"{c['torch_bf16_rel_err']:.2e} ({'PASS' if ok else 'FAIL'}: no worse than PyTorch bf16), "
                f"argmax agree {c['argmax_agree']:.2f}")
    if "floor_ms" in summary:
        log(f"floor {summary['stream_bytes'] / 1e9:.2f} GB / {summary['copy_TBps']:.2f} TB/s = {summary['floor_ms']:.3f} ms")
        log("variant                 rows   kv1k   kv8k  kv32k  (ms/forward; x floor at kv1k)")
        table = {}
        for t in summary["timings_2b"]:
            table.setdefault((t["variant"], t["rows"]), {})[t["kv"]] = t["device_ms"]
        for (variant, rows), by_kv in table.items():
            cells = " ".join(f"{by_kv.get(kv, float('nan')):6.3f}" for kv in (1024, 8192, 32768))
            log(f"{variant:22s} {rows:4d} {cells}  {by_kv.get(1024, float('nan')) / summary['floor_ms']:.2f}x")
    if "startup_2b_from_host_memory" in summary:
        s = summary["startup_2b_from_host_memory"]
        log(f"startup (host memory source): context {s['context_s']:.2f} s, upload {s['upload_s']:.2f} s "
            f"({s['upload_GBps']:.1f} GB/s), capture {s['capture_s']:.3f} s")
    if "load_folder_2b" in summary:
        log(f"real load path: {summary['load_folder_2b']}")
    if summary.get("peers"):
        log("peers: " + " | ".join(summary["peers"]))
    log(f"total {time.time() - STARTED:.0f} s")


if __name__ == "__main__":
    main()
