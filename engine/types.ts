// The typed surface of the a2d engine as TypeScript sees it. engine/index.ts implements it over the
// native addon and is the only module that touches the addon; everything else imports from there.
// Decoding parameters and their exact meaning: docs/decoding.md. Model folder: docs/model-format.md.

export type Device = "cpu" | "cuda";
// The choices of engine/decoding-params.json (test/decoding-params.test.ts holds these types to it).
export type Remasking = "low_confidence" | "random" | "leftmost";
export type Advance = "block" | "slide";
export type CommitPolicy = "fused" | "separate";
export type RevealOrder = "any" | "prefix";
export type FinishReason = "stop" | "length" | "cancelled";

export interface LoadOptions {
  /** Model folder (docs/model-format.md). */
  modelDir: string;
  device: Device;
  /** CPU worker threads; default: the machine's cores. */
  threads?: number;
  /** Longest prompt + completion the engine must hold (KV cache is sized for it). Default: min(max_position_embeddings, 32768 + 4096). */
  maxContext?: number;
  /**
   * Generations decoded together, one forward serving them all, each with a KV cache of maxContext positions
   * (continuous batching); default 1. A backend without batching holds one: ModelInfo.maxBatch says what it got.
   */
  maxBatch?: number;
}

export interface DecodingDefaults {
  blockSize: number;
  threshold: number;
  minPerStep: number;
  steps: number;
  temperature: number;
  topP: number;
  remasking: Remasking;
  /** "block": the window moves on once wholly revealed; "slide": past every revealed prefix (docs/decoding.md). */
  advance: Advance;
  commit: CommitPolicy;
  /** "prefix": a step reveals only the run that continues the window's revealed start (docs/decoding.md, step 3). */
  revealOrder: RevealOrder;
}

export interface ModelInfo {
  architecture: string; // e.g. "LlamaForCausalLM"
  modelType: string; // "llama" | "qwen2" | "qwen3"
  numLayers: number;
  hiddenSize: number;
  numHeads: number;
  numKvHeads: number;
  headDim: number;
  vocabSize: number;
  numParameters: number;
  maskTokenId: number;
  shiftLogits: boolean;
  eosTokenIds: number[];
  maxContext: number;
  /** Generations the engine decodes at once (LoadOptions.maxBatch, or 1 where the backend does not batch). */
  maxBatch: number;
  device: Device;
  trained: boolean;
  /** The weight format (config.json's a2d.precision): "fp8-e4m3" streams e4m3 projections with per-row scales. */
  precision: "bf16" | "fp8-e4m3";
  decoding: DecodingDefaults;
}

export interface DecodeParams {
  maxTokens: number;
  blockSize?: number;
  threshold?: number;
  minPerStep?: number;
  steps?: number;
  temperature?: number;
  topP?: number;
  remasking?: Remasking;
  advance?: Advance;
  commit?: CommitPolicy;
  revealOrder?: RevealOrder;
  /** Unsigned 64-bit seed, as a bigint or a safe integer. */
  seed?: bigint | number;
  eosTokenIds?: number[];
  /** Record every denoising step (docs/decoding.md, "The trace"). Costs memory; for tests. */
  trace?: boolean;
}

/** Tokens a step made final: the revealed run that starts the window, past what earlier steps handed out (EOS and
 * anything after it excluded), so a block's first tokens arrive before the block is done. */
export interface BlockEvent {
  tokens: number[];
  forwardPasses: number;
}

export interface TraceStep {
  forward: number;
  blockStart: number;
  step: number;
  candidates: number[];
  revealed: Array<[position: number, token: number, confidence: number]>;
}

export interface GenerateResult {
  tokenIds: number[];
  finishReason: FinishReason;
  promptTokens: number;
  completionTokens: number;
  /** Every forward but the prompt's commit-only chunks. */
  forwardPasses: number;
  tokensPerForward: number;
  /** The prompt's commit-only chunks before the first denoising forward (long prompts). */
  prefillForwards: number;
  /** Denoising steps, the tokens they revealed (an EOS's cut-off included), and how many of those the per-step floor forced. */
  steps: number;
  revealed: number;
  toppedUp: number;
  /** Wall time of the decode on the engine thread, milliseconds. */
  ms: number;
  trace?: TraceStep[];
}

export interface GenerateRequest {
  promptIds: number[];
  params: DecodeParams;
  /** Called on the JS thread as each step makes tokens final. */
  onBlock?: (event: BlockEvent) => void;
  /** Aborting cancels the generation within one denoising step; the promise resolves with finishReason "cancelled". */
  signal?: AbortSignal;
}

export interface Engine {
  readonly info: ModelInfo;
  /**
   * Queue a generation on the engine thread: up to info.maxBatch run at once, each joining the next forward
   * once a place is free; the rest wait in FIFO order. A generation's tokens do not depend on what runs beside it.
   */
  generate(request: GenerateRequest): Promise<GenerateResult>;
  /**
   * Throws what `generate` would reject this request with (an InvalidDecodeParamError naming the
   * parameter), without running anything: a server can refuse before it answers 200.
   */
  checkRequest(request: GenerateRequest): void;
  /**
   * One forward of the model for tests and benchmarks: commit `commitIds` after `cachedIds` and return the
   * fp32 logits of every row (commit rows then window rows), row-major [rows, vocab]. Starts from an empty
   * cache: `cachedIds` are committed first (causal), then one forward of `commitIds` + `windowIds`.
   */
  forwardLogits(cachedIds: number[], commitIds: number[], windowIds: number[]): Promise<Float32Array>;
  /** Total forward passes since load (reported by /health). */
  totalForwardPasses(): number;
  close(): Promise<void>;
}
