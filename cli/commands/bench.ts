// `a2d bench`: the engine's speed on this machine, printed (a measurement, not a test). For each block
// size and KV length: ms per denoising forward, the weight-stream floor and the ratio, tokens per
// forward and tokens/s of a long generation; the time of load(); and, with --ar-baseline, transformers'
// AR `generate` on the same weights in the same run.
//
// ms per forward comes from the engine's public surface: two generations after the same prompt, one
// block long and --tokens long; the difference of their times over the difference of their forward
// counts cancels the prompt's prefill. EOS is disabled so random weights generate to the end.
import { spawnSync } from "node:child_process";
import { closeSync, existsSync, linkSync, mkdirSync, openSync, readFileSync, readSync, writeFileSync, writeSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type Command, Option } from "commander";

import { loadEngine, positionsNeeded } from "../../engine/index.js";
import type { Device, Engine } from "../../engine/types.js";
import { integerIn, numberIn } from "../parse.js";

interface BenchOptions {
  model?: string;
  randomShape?: string;
  randomAdapter?: string;
  device: Device;
  blocks: number[];
  kv: number[];
  tokens: number;
  threshold: number;
  hbmTbps: number;
  arBaseline?: boolean;
  python: string;
  json?: boolean;
}

interface Shape {
  layers: number;
  hidden: number;
  intermediate: number;
  heads: number;
  kvHeads: number;
  headDim: number;
  vocab: number;
  ropeTheta: number;
  eos: number[];
  tied?: boolean;
}

// minicpm5-2b: openbmb/MiniCPM5-2B (SPEC.md §2).
const SHAPES: Record<string, Shape> = {
  "minicpm5-2b": {
    layers: 42, hidden: 2048, intermediate: 6144, heads: 16, kvHeads: 2, headDim: 128, vocab: 130560,
    ropeTheta: 5e6, eos: [1, 130073],
  },
  // The bundled model's: SmolLM2-135M with the mask token appended to its tied embedding.
  "smollm2-135m": {
    layers: 30, hidden: 576, intermediate: 1536, heads: 9, kvHeads: 3, headDim: 64, vocab: 49153, ropeTheta: 1e5, eos: [2],
    tied: true,
  },
  // A few MB: checks the command end to end on any machine.
  tiny: { layers: 2, hidden: 128, intermediate: 384, heads: 4, kvHeads: 2, headDim: 32, vocab: 1000, ropeTheta: 1e4, eos: [1] },
};

interface Row {
  blockSize: number;
  kv: number;
  msPerForward: number;
  floorMs: number;
  ratio: number;
  tokensPerForward: number;
  tokensPerSecond: number;
}

const list = (name: string, min: number) => (value: string) =>
  value.split(",").map((part) => integerIn(name, min, 1 << 20)(part));

export function register(program: Command): void {
  program
    .command("bench")
    .description("Time the engine: ms per denoising forward per block size and KV length, load time, AR baseline")
    .option("--model <dir>", "a2d model folder")
    .addOption(new Option("--random-shape <name>", "random bf16 weights of a known shape").choices(Object.keys(SHAPES)))
    .option(
      "--random-adapter <rule:rank>",
      "with --random-shape: a random row adapter on every projection, e.g. window:64 or mask:64; or window-rule: the window " +
        "rule (a2d.window_rule), whose factors are merged into the weights, so they are the shape's own",
    )
    .addOption(new Option("--device <device>", "compute backend").choices(["cpu", "cuda"]).default("cuda"))
    .option("--blocks <list>", "block sizes (2..64)", list("--blocks", 2), [2, 4, 8, 16, 32])
    .option("--kv <list>", "KV lengths (prompt tokens before the timed blocks)", list("--kv", 1), [1024, 8192, 32768])
    .option("--tokens <n>", "tokens of the long generation", integerIn("--tokens", 8, 1 << 16), 256)
    .option("--threshold <t>", "reveal threshold", numberIn("--threshold", 0, 1), 0.9)
    .option("--hbm-tbps <x>", "memory bandwidth for the floor, TB/s (H200 copy: 4.3)", numberIn("--hbm-tbps", 0.01, 100), 4.3)
    .option("--ar-baseline", "also time transformers' AR generate on the same weights (needs python3 with torch)")
    .option("--python <path>", "python for --ar-baseline", "python3")
    .option("--json", "print the results as one JSON object")
    .action(async (options: BenchOptions) => {
      process.stdout.write(`${await bench(options)}\n`);
    });
}

async function bench(options: BenchOptions): Promise<string> {
  if ((options.model === undefined) === (options.randomShape === undefined)) {
    throw new Error("give exactly one of --model DIR and --random-shape NAME");
  }
  const largestBlock = Math.max(...options.blocks);
  if (options.tokens <= largestBlock) {
    throw new Error(
      `--tokens ${options.tokens} must be more than the largest block size (${largestBlock}): ms/forward is the ` +
        "difference between a --tokens generation and a one-block one; raise --tokens or drop that block size",
    );
  }
  if (options.randomAdapter !== undefined && options.randomShape === undefined) {
    throw new Error("--random-adapter adds an adapter to --random-shape's weights; give --random-shape too");
  }
  const modelDir = options.model ?? withRandomAdapter(randomModel(options.randomShape as string), options.randomAdapter);
  // Room for the longest generation plus what a window reaches past it (decode.cpp positions_needed).
  const longest = positionsNeeded(Math.max(...options.kv), options.tokens, largestBlock);
  const loadStarted = performance.now();
  const engine = await loadEngine({ modelDir, device: options.device, maxContext: longest });
  const loadSeconds = (performance.now() - loadStarted) / 1e3;
  const floorMs = (streamBytes(modelDir) / (options.hbmTbps * 1e12)) * 1e3;
  const rows: Row[] = [];
  try {
    for (const blockSize of options.blocks) {
      for (const kv of options.kv) {
        rows.push(await timeBlocks(engine, blockSize, kv, options, floorMs));
        if (!options.json) process.stderr.write(`  block ${blockSize} kv ${kv}: ${rows.at(-1)?.msPerForward.toFixed(3)} ms/forward\n`);
      }
    }
  } finally {
    await engine.close();
  }
  const baseline = options.arBaseline ? arBaseline(options.python, modelDir, options.tokens) : undefined;
  const result = { model: modelDir, device: options.device, loadSeconds, hbmTbps: options.hbmTbps, rows, arBaseline: baseline };
  if (options.json) return JSON.stringify(result, null, 1);
  const lines = [
    `model ${modelDir} on ${options.device}: load ${loadSeconds.toFixed(2)} s; floor ${floorMs.toFixed(3)} ms at ${options.hbmTbps} TB/s`,
    "block     kv   ms/fwd   floor   ratio  tok/fwd    tok/s",
    ...rows.map((r) =>
      [r.blockSize.toString().padStart(5), r.kv.toString().padStart(6), r.msPerForward.toFixed(3).padStart(8),
        r.floorMs.toFixed(3).padStart(7), `${r.ratio.toFixed(2)}x`.padStart(7), r.tokensPerForward.toFixed(2).padStart(8),
        r.tokensPerSecond.toFixed(0).padStart(8)].join(" "),
    ),
  ];
  if (baseline !== undefined) lines.push(`AR baseline (transformers generate, same weights): ${baseline}`);
  return lines.join("\n");
}

async function timeBlocks(engine: Engine, blockSize: number, kv: number, options: BenchOptions, floorMs: number): Promise<Row> {
  const vocab = engine.info.vocabSize;
  const mask = engine.info.maskTokenId;
  let state = (kv * 2654435761 + blockSize) >>> 0;
  const promptIds = Array.from({ length: kv }, () => {
    state = (Math.imul(state, 1664525) + 1013904223) >>> 0;
    const id = state % vocab;
    return id === mask ? (id + 1) % vocab : id;
  });
  const params = { blockSize, threshold: options.threshold, eosTokenIds: [] as number[] };
  // The fastest of three runs each: the prefill's run-to-run spread must not leak into the difference.
  const fastest = async (maxTokens: number) => {
    const runs = [];
    for (let i = 0; i < 3; ++i) runs.push(await engine.generate({ promptIds, params: { ...params, maxTokens } }));
    return runs.reduce((a, b) => (b.ms < a.ms ? b : a));
  };
  const short = await fastest(blockSize);
  const long = await fastest(options.tokens);
  const forwards = long.forwardPasses - short.forwardPasses;
  const ms = long.ms - short.ms;
  if (forwards <= 0) {
    throw new Error(`block ${blockSize} kv ${kv}: the ${options.tokens}-token generation took no more forwards than the one-block one; raise --tokens`);
  }
  const msPerForward = ms / forwards;
  return {
    blockSize,
    kv,
    msPerForward,
    floorMs,
    ratio: msPerForward / floorMs,
    tokensPerForward: long.completionTokens / long.forwardPasses,
    tokensPerSecond: ((long.completionTokens - short.completionTokens) / ms) * 1e3,
  };
}

// Bytes every forward streams: all weights but the embedding, which is only gathered (unless tied).
function streamBytes(modelDir: string): number {
  const config = JSON.parse(readFileSync(join(modelDir, "config.json"), "utf8")) as Record<string, unknown>;
  const n = (key: string, fallback?: number) => {
    const v = config[key];
    if (typeof v === "number") return v;
    if (fallback !== undefined) return fallback;
    throw new Error(`${modelDir}/config.json: ${key} is missing`);
  };
  const hidden = n("hidden_size");
  const heads = n("num_attention_heads");
  const headDim = n("head_dim", hidden / heads);
  const kvHeads = n("num_key_value_heads", heads);
  const inter = n("intermediate_size");
  const perLayer = (heads + 2 * kvHeads) * headDim * hidden + hidden * heads * headDim + 3 * inter * hidden;
  return 2 * (n("num_hidden_layers") * perLayer + n("vocab_size") * hidden);
}

// A model folder of the named shape with random bf16 weights (std 0.02, norms 1), written once per
// machine into the temporary directory and reused. Deterministic: the same Node binary writes the same
// bytes on any machine, so a packed folder's weights can be regenerated there (bench/device-gpu-run.sh).
export function randomModel(name: string): string {
  const shape = SHAPES[name] as Shape;
  const dir = join(tmpdir(), `a2d-bench-${name}`);
  const done = join(dir, ".complete");
  if (existsSync(done)) return dir;
  mkdirSync(dir, { recursive: true });
  process.stderr.write(`writing random ${name} weights to ${dir} (once)\n`);
  const { layers, hidden: H, intermediate: I, heads, kvHeads, headDim: D, vocab: V } = shape;
  const tensors: Array<[string, number[], "w" | "norm"]> = [["model.embed_tokens.weight", [V, H], "w"]];
  for (let l = 0; l < layers; ++l) {
    const p = `model.layers.${l}.`;
    tensors.push(
      [`${p}input_layernorm.weight`, [H], "norm"],
      [`${p}self_attn.q_proj.weight`, [heads * D, H], "w"],
      [`${p}self_attn.k_proj.weight`, [kvHeads * D, H], "w"],
      [`${p}self_attn.v_proj.weight`, [kvHeads * D, H], "w"],
      [`${p}self_attn.o_proj.weight`, [H, heads * D], "w"],
      [`${p}post_attention_layernorm.weight`, [H], "norm"],
      [`${p}mlp.gate_proj.weight`, [I, H], "w"],
      [`${p}mlp.up_proj.weight`, [I, H], "w"],
      [`${p}mlp.down_proj.weight`, [H, I], "w"],
    );
  }
  tensors.push(["model.norm.weight", [H], "norm"]);
  if (!shape.tied) tensors.push(["lm_head.weight", [V, H], "w"]);

  writeRandomSafetensors(join(dir, "model.safetensors"), tensors);
  const config = {
    architectures: ["LlamaForCausalLM"], model_type: "llama", hidden_size: H, intermediate_size: I,
    num_hidden_layers: layers, num_attention_heads: heads, num_key_value_heads: kvHeads, head_dim: D,
    vocab_size: V, rms_norm_eps: 1e-6, rope_theta: shape.ropeTheta, max_position_embeddings: 65536,
    tie_word_embeddings: shape.tied === true, attention_bias: false, hidden_act: "silu", torch_dtype: "bfloat16",
    a2d: {
      format_version: 1, mask_token_id: V - 1, mask_token: "<|mask|>", block_size: 4, shift_logits: true,
      eos_token_ids: shape.eos, trained: false,
    },
  };
  writeFileSync(join(dir, "config.json"), JSON.stringify(config, null, 1));
  writeFileSync(done, "");
  return dir;
}

// The random model with a random row adapter (docs/model-format.md) of `spec` ("window:64", "mask:64") on every
// projection beside it: a folder of two shards, the random model's weights (a hard link) and the factors (std
// 0.02), written once per machine like the model itself. "window-rule": the random model under the window rule
// (a2d.window_rule), the window adapter's window and attention with no factors (a converted model's LoRA is merged
// into its weights), so only its config differs. No spec: the model as it is.
function withRandomAdapter(baseDir: string, spec: string | undefined): string {
  if (spec === undefined) return baseDir;
  if (spec === "window-rule") {
    return derivedModel(baseDir, "window-rule", (config) => {
      config.a2d.window_rule = true;
    });
  }
  const match = /^(mask|window):(\d+)$/.exec(spec);
  const rank = match ? Number(match[2]) : 0;
  if (!match || rank < 1 || rank > 256) throw new Error(`--random-adapter ${spec}: give RULE:RANK, RULE mask or window, RANK 1..256, or window-rule`);
  const rule = match[1] as string;
  return derivedModel(baseDir, `${rule}${rank}`, (config, dir) => {
    const H = config.hidden_size as number, I = config.intermediate_size as number, D = config.head_dim as number;
    const heads = config.num_attention_heads as number, kvHeads = config.num_key_value_heads as number;
    const shapes: Record<string, [number, number]> = {
      "self_attn.q_proj": [heads * D, H], "self_attn.k_proj": [kvHeads * D, H], "self_attn.v_proj": [kvHeads * D, H],
      "self_attn.o_proj": [H, heads * D], "mlp.gate_proj": [I, H], "mlp.up_proj": [I, H], "mlp.down_proj": [H, I],
    };
    const tensors: Array<[string, number[]]> = [];
    for (let l = 0; l < (config.num_hidden_layers as number); ++l) {
      for (const [module, [out, inp]] of Object.entries(shapes)) {
        tensors.push([`model.layers.${l}.${module}.${rule}_a`, [rank, inp]], [`model.layers.${l}.${module}.${rule}_b`, [out, rank]]);
      }
    }
    writeRandomSafetensors(join(dir, "adapter.safetensors"), tensors.map(([name, dims]) => [name, dims, "w"]));
    const weightMap: Record<string, string> = {};
    for (const name of safetensorsNames(join(baseDir, "model.safetensors"))) weightMap[name] = "model.safetensors";
    for (const [name] of tensors) weightMap[name] = "adapter.safetensors";
    writeFileSync(join(dir, "model.safetensors.index.json"), JSON.stringify({ metadata: {}, weight_map: weightMap }));
    config.a2d[`${rule}_adapter`] = { rank, targets: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"] };
  });
}

// A folder `<baseDir>-<suffix>` beside the random model, written once per machine: its weights (a hard link), its
// config as `edit` changes it, and whatever else `edit` writes into the folder.
function derivedModel(baseDir: string, suffix: string, edit: (config: Record<string, any>, dir: string) => void): string {
  const dir = `${baseDir}-${suffix}`;
  const done = join(dir, ".complete");
  if (existsSync(done)) return dir;
  mkdirSync(dir, { recursive: true });
  const config = JSON.parse(readFileSync(join(baseDir, "config.json"), "utf8")) as Record<string, any>;
  edit(config, dir);
  if (!existsSync(join(dir, "model.safetensors"))) linkSync(join(baseDir, "model.safetensors"), join(dir, "model.safetensors"));
  writeFileSync(join(dir, "config.json"), JSON.stringify(config, null, 1));
  writeFileSync(done, "");
  return dir;
}

// A safetensors file of bf16 tensors: "norm" ones all 1, "w" ones N(0, 0.02) from a fixed xorshift stream (the same
// bytes on every machine).
function writeRandomSafetensors(path: string, tensors: Array<[string, number[], "w" | "norm"]>): void {
  const header: Record<string, unknown> = {};
  let offset = 0;
  for (const [tensorName, dims] of tensors) {
    const bytes = dims.reduce((a, b) => a * b, 1) * 2;
    header[tensorName] = { dtype: "BF16", shape: dims, data_offsets: [offset, offset + bytes] };
    offset += bytes;
  }
  let json = JSON.stringify(header);
  json += " ".repeat((8 - (json.length % 8)) % 8);
  const fd = openSync(path, "w");
  try {
    const length = Buffer.alloc(8);
    length.writeBigUInt64LE(BigInt(json.length));
    writeSync(fd, length);
    writeSync(fd, json);
    const normal = normalTable(0.02);
    const one = 0x3f80; // bf16 1.0
    let state = 0x9e3779b9;
    const chunk = new Uint16Array(1 << 24);
    for (const [, dims, kind] of tensors) {
      let left = dims.reduce((a, b) => a * b, 1);
      while (left > 0) {
        const count = Math.min(left, chunk.length);
        if (kind === "norm") {
          chunk.fill(one, 0, count);
        } else {
          for (let i = 0; i < count; ++i) {
            state ^= state << 13;
            state ^= state >>> 17;
            state ^= state << 5;
            chunk[i] = normal[state & 4095] as number;
          }
        }
        writeSync(fd, chunk.subarray(0, count));
        left -= count;
      }
    }
  } finally {
    closeSync(fd);
  }
}

// The tensor names a safetensors file holds, from its header alone.
function safetensorsNames(path: string): string[] {
  const fd = openSync(path, "r");
  try {
    const length = Buffer.alloc(8);
    readSync(fd, length, 0, 8, 0);
    const header = Buffer.alloc(Number(length.readBigUInt64LE(0)));
    readSync(fd, header, 0, header.length, 8);
    return Object.keys(JSON.parse(header.toString("utf8")) as Record<string, unknown>).filter((name) => name !== "__metadata__");
  } finally {
    closeSync(fd);
  }
}

// 4096 bf16 values at evenly spaced quantiles of N(0, std): random 12-bit indices draw from it.
function normalTable(std: number): Uint16Array {
  const table = new Uint16Array(4096);
  const f32 = new Float32Array(1);
  const u32 = new Uint32Array(f32.buffer);
  for (let i = 0; i < 4096; ++i) {
    f32[0] = std * inverseNormal((i + 0.5) / 4096);
    table[i] = (u32[0] as number) >>> 16;
  }
  return table;
}

// Acklam's rational approximation of the standard normal quantile (relative error < 1.2e-9).
function inverseNormal(p: number): number {
  const a = [-39.69683028665376, 220.9460984245205, -275.9285104469687, 138.357751867269, -30.66479806614716, 2.506628277459239];
  const b = [-54.47609879822406, 161.5858368580409, -155.6989798598866, 66.80131188771972, -13.28068155288572];
  const c = [-0.007784894002430293, -0.3223964580411365, -2.400758277161838, -2.549732539343734, 4.374664141464968, 2.938163982698783];
  const d = [0.007784695709041462, 0.3224671290700398, 2.445134137142996, 3.754408661907416];
  const poly = (k: number[], x: number) => k.reduce((acc, v) => acc * x + v, 0);
  if (p < 0.02425) {
    const q = Math.sqrt(-2 * Math.log(p));
    return poly(c, q) / (poly(d, q) * q + 1);
  }
  if (p > 1 - 0.02425) return -inverseNormal(1 - p);
  const q = p - 0.5;
  const r = q * q;
  return (poly(a, r) * q) / (poly(b, r) * r + 1);
}

// transformers' AR generate (greedy, bf16, the model's own eager forward) on the same folder.
function arBaseline(python: string, modelDir: string, tokens: number): string {
  const script = `
import sys, time, torch
from transformers import AutoModelForCausalLM
m = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.bfloat16).cuda().eval()
ids = torch.randint(0, m.config.vocab_size - 1, (1, 1024), device="cuda")
n = int(sys.argv[2])
m.generate(ids, max_new_tokens=8, min_new_tokens=8, do_sample=False)
torch.cuda.synchronize(); t = time.time()
out = m.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False)
torch.cuda.synchronize(); dt = time.time() - t
print(f"{out.shape[1] - ids.shape[1]} tokens in {dt:.2f} s = {(out.shape[1] - ids.shape[1]) / dt:.1f} tok/s")
`;
  const run = spawnSync(python, ["-c", script, modelDir, String(tokens)], { encoding: "utf8" });
  if (run.error !== undefined) return `not run (${run.error.message})`;
  if (run.status !== 0) return `failed: ${run.stderr.trim().split("\n").at(-1) ?? ""}`;
  return run.stdout.trim().split("\n").at(-1) ?? "";
}
