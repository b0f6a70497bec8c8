// The only module that touches the native addon. It finds the addon, validates every parameter at this
// boundary (ranges of docs/decoding.md), fills decoding defaults from the model, and turns the native
// callbacks into the Promise/AbortSignal surface of ./types.ts.
import { existsSync } from "node:fs";
import { createRequire } from "node:module";
import { basename, dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import type {
  BlockEvent,
  DecodingDefaults,
  Device,
  Engine,
  FinishReason,
  GenerateRequest,
  GenerateResult,
  LoadOptions,
  ModelInfo,
  TraceStep,
} from "./types.js";

export type * from "./types.js";

/** A decoding parameter or input outside its documented range; `param` names it (camelCase). */
export class InvalidDecodeParamError extends RangeError {
  constructor(
    readonly param: string,
    message: string,
  ) {
    super(`${param}: ${message}`);
    this.name = "InvalidDecodeParamError";
  }
}

/**
 * Cache positions a generation of `maxTokens` after `promptTokens` needs at block size `blockSize`: the
 * prompt, the completion, and the rest of the last block's window, which always spans a whole block
 * however few of its tokens the budget keeps. The one rule for what fits in an engine's context: the C++
 * engine refuses a request past `maxContext` by the same sum (decode.cpp, check_request), and the server
 * derives its default and largest max_tokens from it.
 */
export function positionsNeeded(promptTokens: number, maxTokens: number, blockSize: number): number {
  return promptTokens + maxTokens + blockSize - 1;
}

/** Every decoding parameter resolved: the addon applies no defaults of its own. */
interface NativeParams extends DecodingDefaults {
  maxTokens: number;
  seed: bigint;
  eosTokenIds: number[];
  trace: boolean;
}

/** The addon always returns the trace (empty unless asked for); toResult drops it when not asked for. */
interface NativeResult extends Omit<GenerateResult, "trace"> {
  trace: TraceStep[];
}

interface NativeEngine {
  readonly info: ModelInfo;
  generate(promptIds: Int32Array, params: NativeParams, onBlock: ((event: BlockEvent) => void) | undefined, token: number): Promise<NativeResult>;
  cancel(token: number): void;
  forwardLogits(cachedIds: Int32Array, commitIds: Int32Array, windowIds: Int32Array): Promise<Float32Array>;
  totalForwardPasses(): number;
  close(): Promise<void>;
}

interface NativeAddon {
  readonly cuda: boolean;
  load(modelDir: string, device: Device, threads: number, maxContext: number): Promise<NativeEngine>;
}

const ADDON_FILES: Record<Device, { file: string; buildDir: string; build: string }> = {
  cpu: { file: "a2d_cpu.node", buildDir: "engine", build: "npm run build:engine" },
  cuda: { file: "a2d_cuda.node", buildDir: "engine-cuda", build: "npm run build:cuda" },
};

/**
 * Where the addon for `device` is: `$A2D_ADDON_DIR/<file>` when that variable is set (the packed folder
 * keeps addons apart), else `build/<engine|engine-cuda>/<file>` of the repository this module sits in
 * (compiled: dist/engine/index.js; run from source by vitest: engine/index.ts).
 */
export function addonPath(device: Device): string {
  const { file, buildDir } = ADDON_FILES[device];
  const override = process.env.A2D_ADDON_DIR;
  if (override !== undefined && override !== "") return resolve(override, file);
  const here = dirname(fileURLToPath(import.meta.url));
  const root = basename(dirname(here)) === "dist" ? resolve(here, "..", "..") : resolve(here, "..");
  return join(root, "build", buildDir, file);
}

const addons = new Map<string, NativeAddon>();

function requireAddon(device: Device): NativeAddon {
  const path = addonPath(device);
  const cached = addons.get(path);
  if (cached !== undefined) return cached;
  if (!existsSync(path)) {
    const fix = process.env.A2D_ADDON_DIR ? "check A2D_ADDON_DIR" : `build it with \`${ADDON_FILES[device].build}\``;
    throw new Error(`the a2d engine addon for device '${device}' is missing at ${path}; ${fix}`);
  }
  const addon = createRequire(import.meta.url)(path) as NativeAddon;
  addons.set(path, addon);
  return addon;
}

function checkInteger(param: string, value: unknown, min: number, max: number): number {
  if (typeof value !== "number" || !Number.isInteger(value) || value < min || value > max) {
    throw new InvalidDecodeParamError(param, `must be an integer in ${min}..${max}, got ${String(value)}`);
  }
  return value;
}

function checkNumber(param: string, value: unknown, min: number, max: number, minExclusive = false): number {
  const below = typeof value === "number" && (minExclusive ? value <= min : value < min);
  if (typeof value !== "number" || Number.isNaN(value) || below || value > max) {
    throw new InvalidDecodeParamError(param, `must be a number in ${minExclusive ? "(" : "["}${min}, ${max}], got ${String(value)}`);
  }
  return value;
}

function checkChoice<T extends string>(param: string, value: unknown, choices: readonly T[]): T {
  if (!choices.includes(value as T)) {
    throw new InvalidDecodeParamError(param, `must be one of ${choices.map((c) => `'${c}'`).join(", ")}, got ${String(value)}`);
  }
  return value as T;
}

function checkTokenIds(param: string, ids: unknown, vocabSize: number): Int32Array {
  if (!Array.isArray(ids)) throw new InvalidDecodeParamError(param, "must be an array of token ids");
  const out = new Int32Array(ids.length);
  ids.forEach((id, i) => {
    if (typeof id !== "number" || !Number.isInteger(id) || id < 0 || id >= vocabSize) {
      throw new InvalidDecodeParamError(param, `[${i}] = ${String(id)} is not a token id in 0..${vocabSize - 1}`);
    }
    out[i] = id;
  });
  return out;
}

const MAX_SEED = (1n << 64n) - 1n;
/** Rows one forward of the CUDA backend runs (engine/cuda/step_state.cuh, kMaxRows). */
const CUDA_MAX_WINDOW = 64;
/** Rows of a tree window at most, on every device (one bit each in the layout's visibility sets). */
const MAX_TREE_WINDOW = 64;

function checkSeed(value: bigint | number | undefined): bigint {
  if (value === undefined) return 0n;
  if (typeof value === "number" && !Number.isSafeInteger(value)) {
    throw new InvalidDecodeParamError("seed", `must be a safe integer or a bigint, got ${value}`);
  }
  const seed = BigInt(value);
  if (seed < 0n || seed > MAX_SEED) throw new InvalidDecodeParamError("seed", `must be in 0..2^64-1, got ${seed}`);
  return seed;
}

/** The full native parameter set: the request's values checked, the model's defaults elsewhere. */
function nativeParams(request: GenerateRequest, info: ModelInfo): NativeParams {
  const p = request.params;
  if (typeof p !== "object" || p === null) throw new InvalidDecodeParamError("params", "must be an object");
  const d = info.decoding;
  const blockSize = checkInteger("blockSize", p.blockSize ?? d.blockSize, 1, 64);
  const remasking = checkChoice("remasking", p.remasking ?? d.remasking, ["low_confidence", "random", "leftmost", "verify", "tree"] as const);
  const commit = checkChoice("commit", p.commit ?? d.commit, ["fused", "separate"] as const);
  const treeWidth = checkInteger("treeWidth", p.treeWidth ?? d.treeWidth, 1, 8);
  const lookupNgram = checkInteger("lookupNgram", p.lookupNgram ?? d.lookupNgram, 0, 8);
  const confirming = remasking === "verify" || remasking === "tree";
  if (confirming && !info.shiftLogits) {
    throw new InvalidDecodeParamError("remasking", `'${remasking}' needs a model with shifted logits (the row of a token predicts the next position); this one predicts each position from its own row`);
  }
  if (remasking === "verify" && info.device === "cuda" && 2 * blockSize - 1 > CUDA_MAX_WINDOW) {
    throw new InvalidDecodeParamError("blockSize", `must be at most ${(CUDA_MAX_WINDOW + 1) / 2} with remasking 'verify' on the CUDA engine (its windows reach 2 x block_size - 1 positions; one forward runs at most ${CUDA_MAX_WINDOW})`);
  }
  const branches = treeWidth + (lookupNgram > 0 ? 1 : 0);
  const treeRows = branches * (blockSize - 1) + blockSize * (branches * (blockSize - 1) + 1);
  if (remasking === "tree" && treeRows > MAX_TREE_WINDOW) {
    const withLookup = lookupNgram > 0 ? " with lookupNgram" : "";
    throw new InvalidDecodeParamError("treeWidth", `${treeWidth}${withLookup} at block size ${blockSize} needs windows of ${treeRows} rows, more than a tree window's ${MAX_TREE_WINDOW}; lower treeWidth or blockSize (docs/decoding.md, "Tree")`);
  }
  if (confirming && commit !== "fused") {
    throw new InvalidDecodeParamError("commit", `must be 'fused' with remasking '${remasking}' (confirmed tokens are committed in the next window's forward)`);
  }
  return {
    maxTokens: checkInteger("maxTokens", p.maxTokens, 0, Number.MAX_SAFE_INTEGER),
    blockSize,
    threshold: checkNumber("threshold", p.threshold ?? d.threshold, 0, 1),
    // A model default above a smaller requested block size is clamped rather than rejected.
    minPerStep: checkInteger("minPerStep", p.minPerStep ?? Math.min(d.minPerStep, blockSize), 1, blockSize),
    steps: checkInteger("steps", p.steps ?? Math.min(d.steps, blockSize), 0, blockSize),
    temperature: checkNumber("temperature", p.temperature ?? d.temperature, 0, 2),
    topP: checkNumber("topP", p.topP ?? d.topP, 0, 1, true),
    remasking,
    commit,
    treeWidth,
    lookupNgram,
    seed: checkSeed(p.seed),
    eosTokenIds: Array.from(checkTokenIds("eosTokenIds", p.eosTokenIds ?? info.eosTokenIds, info.vocabSize)),
    trace: p.trace === true,
  };
}

function toResult(native: NativeResult, traced: boolean): GenerateResult {
  const { trace, ...rest } = native;
  const result: GenerateResult = { ...rest, finishReason: native.finishReason as FinishReason };
  if (traced) result.trace = trace.map((s): TraceStep => ({ ...s }));
  return result;
}

/**
 * The addon's refusals of a request (decode.cpp, check_request, and the parameter checks of config.cpp)
 * as InvalidDecodeParamError, so that callers can tell the caller's mistake from a failure of the engine.
 * The checks here come first and should catch all of them; this is for any rule they have not caught up with.
 */
function fromNativeError(error: unknown): unknown {
  if (!(error instanceof Error)) return error;
  const message = error.message;
  if (/^prompt \(\d+ tokens\) \+ max_tokens/.test(message)) return new InvalidDecodeParamError("maxTokens", message);
  if (message.startsWith("invalid decoding parameter: ")) return new InvalidDecodeParamError("params", message.slice("invalid decoding parameter: ".length));
  if (message.startsWith("the prompt must hold") || message.startsWith("prompt token id ")) return new InvalidDecodeParamError("promptIds", message);
  return error;
}

class NativeBackedEngine implements Engine {
  private nextToken = 1;

  constructor(private readonly native: NativeEngine) {}

  get info(): ModelInfo {
    return this.native.info;
  }

  checkRequest(request: GenerateRequest): void {
    this.nativeRequest(request);
  }

  /** The request checked as the addon will check it, in the addon's types. */
  private nativeRequest(request: GenerateRequest): { params: NativeParams; prompt: Int32Array } {
    const info = this.info;
    const params = nativeParams(request, info);
    const prompt = checkTokenIds("promptIds", request.promptIds, info.vocabSize);
    if (prompt.length === 0) throw new InvalidDecodeParamError("promptIds", "the prompt must hold at least one token");
    const needed = positionsNeeded(prompt.length, params.maxTokens, params.blockSize);
    if (params.maxTokens > 0 && needed > info.maxContext) {
      throw new InvalidDecodeParamError(
        "maxTokens",
        `the prompt (${prompt.length} tokens) + maxTokens (${params.maxTokens}) need ${needed} positions at block size ${params.blockSize}, ` +
          `more than the engine's context of ${info.maxContext}; lower maxTokens to at most ${info.maxContext - positionsNeeded(prompt.length, 0, params.blockSize)} ` +
          "or load the model with a larger maxContext",
      );
    }
    if (request.onBlock !== undefined && typeof request.onBlock !== "function") {
      throw new InvalidDecodeParamError("onBlock", "must be a function");
    }
    return { params, prompt };
  }

  async generate(request: GenerateRequest): Promise<GenerateResult> {
    const { params, prompt } = this.nativeRequest(request);
    const signal = request.signal;
    // Already aborted: nothing runs (the engine thread might otherwise finish before the flag lands).
    if (signal?.aborted) {
      return { tokenIds: [], finishReason: "cancelled", promptTokens: prompt.length, completionTokens: 0, forwardPasses: 0, tokensPerForward: 0, ms: 0, ...(params.trace ? { trace: [] } : {}) };
    }
    const token = this.nextToken++;
    const pending = this.native.generate(prompt, params, request.onBlock, token);
    const onAbort = (): void => this.native.cancel(token);
    signal?.addEventListener("abort", onAbort, { once: true });
    try {
      return toResult(await pending, params.trace);
    } catch (error) {
      throw fromNativeError(error);
    } finally {
      signal?.removeEventListener("abort", onAbort);
    }
  }

  async forwardLogits(cachedIds: number[], commitIds: number[], windowIds: number[]): Promise<Float32Array> {
    const vocab = this.info.vocabSize;
    const cached = checkTokenIds("cachedIds", cachedIds, vocab);
    const commit = checkTokenIds("commitIds", commitIds, vocab);
    const window = checkTokenIds("windowIds", windowIds, vocab);
    return this.native.forwardLogits(cached, commit, window);
  }

  totalForwardPasses(): number {
    return this.native.totalForwardPasses();
  }

  close(): Promise<void> {
    return this.native.close();
  }
}

/** Loads the model folder on a new engine thread; resolves once a generation can run. */
export async function loadEngine(opts: LoadOptions): Promise<Engine> {
  if (typeof opts.modelDir !== "string" || opts.modelDir === "") throw new TypeError("loadEngine: modelDir must be a folder path");
  const device = opts.device ?? "cpu";
  if (device !== "cpu" && device !== "cuda") throw new TypeError(`loadEngine: device must be 'cpu' or 'cuda', got ${String(device)}`);
  const threads = opts.threads ?? 0;
  if (!Number.isInteger(threads) || threads < 0 || threads > 1024) {
    throw new RangeError(`loadEngine: threads must be an integer in 1..1024, got ${threads}`);
  }
  const maxContext = opts.maxContext ?? 0;
  if (!Number.isInteger(maxContext) || maxContext < 0) {
    throw new RangeError(`loadEngine: maxContext must be a positive integer, got ${maxContext}`);
  }
  const native = await requireAddon(device).load(resolve(opts.modelDir), device, threads, maxContext);
  return new NativeBackedEngine(native);
}
