// The typed surface of the a2d engine as TypeScript sees it. engine/index.ts implements it over the
// native addon and is the only module that touches the addon; everything else imports from there.
// Decoding parameters and their exact meaning: docs/decoding.md. Model folder: docs/model-format.md.

export type Device = "cpu" | "cuda";
export type Remasking = "low_confidence" | "random" | "leftmost" | "verify" | "tree";
export type CommitPolicy = "fused" | "separate";
export type FinishReason = "stop" | "length" | "cancelled";

export interface LoadOptions {
  /** Model folder (docs/model-format.md). */
  modelDir: string;
  device: Device;
  /** CPU worker threads; default: the machine's cores. */
  threads?: number;
  /** Longest prompt + completion the engine must hold (KV cache is sized for it). Default: min(max_position_embeddings, 32768 + 4096). */
  maxContext?: number;
}

export interface DecodingDefaults {
  blockSize: number;
  threshold: number;
  minPerStep: number;
  steps: number;
  temperature: number;
  topP: number;
  remasking: Remasking;
  commit: CommitPolicy;
  /** remasking "tree": guesses for the first position (docs/decoding.md, "Tree"). */
  treeWidth: number;
  /** remasking "verify" / "tree": drafts from the context's latest match of its last 1..n tokens; 0: none. */
  lookupNgram: number;
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
  commit?: CommitPolicy;
  /** remasking "tree": guesses for the first position, 1..8. */
  treeWidth?: number;
  /** remasking "verify" / "tree": drafts from the context's own earlier text, matching its last 1..n tokens; 0..8, 0: none. */
  lookupNgram?: number;
  /** Unsigned 64-bit seed, as a bigint or a safe integer. */
  seed?: bigint | number;
  eosTokenIds?: number[];
  /** Record every denoising step (docs/decoding.md, "The trace"). Costs memory; for tests. */
  trace?: boolean;
}

/** Tokens appended to the completion when a block is done (EOS and anything after it excluded). */
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
  /**
   * remasking "verify": the drafts this forward made, positions relative to the next window; "tree":
   * [branch, depth, token, confidence] each.
   */
  drafts?: Array<[position: number, token: number, confidence: number] | [branch: number, depth: number, token: number, confidence: number]>;
}

export interface GenerateResult {
  tokenIds: number[];
  finishReason: FinishReason;
  promptTokens: number;
  completionTokens: number;
  forwardPasses: number;
  tokensPerForward: number;
  /** Wall time of the decode on the engine thread, milliseconds. */
  ms: number;
  trace?: TraceStep[];
}

export interface GenerateRequest {
  promptIds: number[];
  params: DecodeParams;
  /** Called on the JS thread as each block is committed. */
  onBlock?: (event: BlockEvent) => void;
  /** Aborting cancels the generation within one denoising step; the promise resolves with finishReason "cancelled". */
  signal?: AbortSignal;
}

export interface Engine {
  readonly info: ModelInfo;
  /** Queue a generation on the engine thread (one at a time, FIFO). */
  generate(request: GenerateRequest): Promise<GenerateResult>;
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
