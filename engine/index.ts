// The only module that touches the native addon. It finds the addon, validates every parameter at this
// boundary (the ranges and rules of engine/decoding-params.json, through ./params.ts), fills decoding
// defaults from the model, and turns the native callbacks into the Promise/AbortSignal surface of ./types.ts.
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
import { brokenRule, camelName, paramSpec, positionsNeeded, roomForTokens, valueProblem } from "./params.js";

export type * from "./types.js";
export { positionsNeeded, roomForTokens } from "./params.js";

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
  load(modelDir: string, device: Device, threads: number, maxContext: number, maxBatch: number): Promise<NativeEngine>;
}

const ADDON_FILES: Record<Device, { file: string; buildDir: string; build: string }> = {
  cpu: { file: "a2d_cpu.node", buildDir: "engine", build: "npm run build:engine" },
  cuda: { file: "a2d_cuda.node", buildDir: "engine-cuda", build: "npm run build:cuda" },
};

/**
 * Where the addon for `device` is: `$A2D_ADDON_DIR/<file>` when that variable is set; else, in a packed
 * folder (this module at <folder>/app/dist/engine/index.js, MANIFEST.json at <folder>), `<folder>/engine/<file>`,
 * so that every command of the folder finds its engine whether serve.sh started it or not; else
 * `build/<engine|engine-cuda>/<file>` of the repository this module sits in (compiled: dist/engine/index.js;
 * run from source by vitest: engine/index.ts).
 */
export function addonPath(device: Device): string {
  const { file, buildDir } = ADDON_FILES[device];
  const override = process.env.A2D_ADDON_DIR;
  if (override !== undefined && override !== "") return resolve(override, file);
  const here = dirname(fileURLToPath(import.meta.url));
  const root = basename(dirname(here)) === "dist" ? resolve(here, "..", "..") : resolve(here, "..");
  const folder = dirname(root);
  if (basename(root) === "app" && existsSync(join(folder, "MANIFEST.json"))) return join(folder, "engine", file);
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

/** `value` checked against the table entry `name` (snake_case); errors name the camelCase parameter. */
function checked<T>(name: string, value: unknown, blockSize: number): T {
  const problem = valueProblem(paramSpec(name), value, blockSize);
  if (problem !== null) throw new InvalidDecodeParamError(camelName(name), `must be ${problem}, got ${String(value)}`);
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
  const blockSize = checked<number>("block_size", p.blockSize ?? d.blockSize, 64);
  const params: NativeParams = {
    maxTokens: checked<number>("max_tokens", p.maxTokens, blockSize),
    blockSize,
    threshold: checked<number>("threshold", p.threshold ?? d.threshold, blockSize),
    // A model default above a smaller requested block size is clamped rather than rejected.
    minPerStep: checked<number>("min_per_step", p.minPerStep ?? Math.min(d.minPerStep, blockSize), blockSize),
    steps: checked<number>("steps", p.steps ?? Math.min(d.steps, blockSize), blockSize),
    temperature: checked<number>("temperature", p.temperature ?? d.temperature, blockSize),
    topP: checked<number>("top_p", p.topP ?? d.topP, blockSize),
    remasking: checked<NativeParams["remasking"]>("remasking", p.remasking ?? d.remasking, blockSize),
    advance: checked<NativeParams["advance"]>("advance", p.advance ?? d.advance, blockSize),
    commit: checked<NativeParams["commit"]>("commit", p.commit ?? d.commit, blockSize),
    revealOrder: checked<NativeParams["revealOrder"]>("reveal_order", p.revealOrder ?? d.revealOrder, blockSize),
    seed: checkSeed(p.seed),
    eosTokenIds: Array.from(checkTokenIds("eosTokenIds", p.eosTokenIds ?? info.eosTokenIds, info.vocabSize)),
    trace: p.trace === true,
  };
  const rule = brokenRule(params);
  if (rule !== null) throw new InvalidDecodeParamError(rule.id, rule.message);
  return params;
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
          `more than the engine's context of ${info.maxContext}; lower maxTokens to at most ${roomForTokens(prompt.length, params.blockSize, info.maxContext)} ` +
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
      return {
        tokenIds: [], finishReason: "cancelled", promptTokens: prompt.length, completionTokens: 0, forwardPasses: 0, tokensPerForward: 0,
        prefillForwards: 0, steps: 0, revealed: 0, toppedUp: 0, ms: 0, ...(params.trace ? { trace: [] } : {}),
      };
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

/** The most generations one engine decodes at once (LoadOptions.maxBatch). */
export const MAX_BATCH = 256;

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
  const maxBatch = opts.maxBatch ?? 1;
  if (!Number.isInteger(maxBatch) || maxBatch < 1 || maxBatch > MAX_BATCH) {
    throw new RangeError(`loadEngine: maxBatch must be an integer in 1..${MAX_BATCH}, got ${maxBatch}`);
  }
  const native = await requireAddon(device).load(resolve(opts.modelDir), device, threads, maxContext, maxBatch);
  return new NativeBackedEngine(native);
}
