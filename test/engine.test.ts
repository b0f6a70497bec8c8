// The engine through engine/index.ts and the real CPU addon: golden parity with the PyTorch reference,
// streaming, cancellation, and clear rejections for bad model folders and parameters.
import { execFileSync } from "node:child_process";
import { cpSync, existsSync, mkdtempSync, readFileSync, rmSync, truncateSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { InvalidDecodeParamError, loadEngine, type DecodeParams, type Engine } from "../engine/index.js";
import { camelName, DECODING_TABLE } from "../engine/params.js";

const root = resolve(import.meta.dirname, "..");
const goldenDir = join(root, "build", "golden");

interface GoldenDecode {
  name: string;
  prompt_ids: number[];
  params: {
    max_tokens: number;
    block_size: number;
    threshold: number;
    min_per_step: number;
    steps: number;
    temperature: number;
    top_p: number;
    remasking: "low_confidence" | "random" | "leftmost";
    advance: "block" | "slide";
    commit: "fused" | "separate";
    reveal_order: "any" | "prefix";
    seed: number;
    eos_token_ids: number[];
  };
  token_ids: number[];
  finish_reason: string;
  forward_passes: number;
  trace: Array<{
    forward: number;
    block_start: number;
    step: number;
    candidates: number[];
    revealed: Array<[number, number, number]>;
  }>;
}

interface Golden {
  model: string;
  tolerance: { logits_max_rel: number; confidence_abs: number };
  forwards: Array<{ name: string; cached_ids: number[]; commit_ids: number[]; window_ids: number[] }>;
  decodes: GoldenDecode[];
}

function readGolden(caseName: string): Golden {
  return JSON.parse(readFileSync(join(goldenDir, caseName, "golden.json"), "utf8")) as Golden;
}

/** The F32 tensors of a safetensors file (u64 header length, JSON header, little-endian data). */
function readF32Tensors(path: string): Map<string, { shape: number[]; data: Float32Array }> {
  const bytes = readFileSync(path);
  const headerLength = Number(bytes.readBigUInt64LE(0));
  const header = JSON.parse(bytes.subarray(8, 8 + headerLength).toString("utf8")) as Record<
    string,
    { dtype: string; shape: number[]; data_offsets: [number, number] }
  >;
  const out = new Map<string, { shape: number[]; data: Float32Array }>();
  for (const [name, t] of Object.entries(header)) {
    if (name === "__metadata__" || t.dtype !== "F32") continue;
    const [begin, end] = t.data_offsets;
    const slice = bytes.subarray(8 + headerLength + begin, 8 + headerLength + end);
    out.set(name, { shape: t.shape, data: new Float32Array(slice.buffer.slice(slice.byteOffset, slice.byteOffset + slice.byteLength)) });
  }
  return out;
}

function decodeParams(p: GoldenDecode["params"]): DecodeParams {
  return {
    maxTokens: p.max_tokens,
    blockSize: p.block_size,
    threshold: p.threshold,
    minPerStep: p.min_per_step,
    steps: p.steps,
    temperature: p.temperature,
    topP: p.top_p,
    remasking: p.remasking,
    advance: p.advance,
    commit: p.commit,
    revealOrder: p.reveal_order,
    seed: BigInt(p.seed),
    eosTokenIds: p.eos_token_ids,
    trace: true,
  };
}

let cases: string[] = [];

beforeAll(() => {
  // `npm test` writes the golden files in the C++ step; alone, this suite writes them itself.
  if (!existsSync(join(goldenDir, "index.json"))) {
    execFileSync(join(root, ".venv", "bin", "python"), ["-m", "a2d_convert", "golden", "--out", goldenDir, "--force"], {
      cwd: root,
      stdio: "inherit",
    });
  }
  cases = (JSON.parse(readFileSync(join(goldenDir, "index.json"), "utf8")) as { cases: string[] }).cases;
});

describe("golden parity through the addon", () => {
  it("matches the reference logits and every decode run of every case", async () => {
    expect(cases.length).toBeGreaterThanOrEqual(3);
    for (const caseName of cases) {
      const golden = readGolden(caseName);
      const modelDir = join(goldenDir, caseName, golden.model);
      const engine = await loadEngine({ modelDir, device: "cpu", threads: 2 });
      try {
        const config = JSON.parse(readFileSync(join(modelDir, "config.json"), "utf8")) as { a2d: { precision?: string } };
        expect(engine.info.precision, `${caseName}: precision`).toBe(config.a2d.precision ?? "bf16");
        const tensors = readF32Tensors(join(goldenDir, caseName, "golden.safetensors"));
        for (const f of golden.forwards) {
          const want = tensors.get(`logits_${f.name}`);
          expect(want, `${caseName}: logits_${f.name}`).toBeDefined();
          const got = await engine.forwardLogits(f.cached_ids, f.commit_ids, f.window_ids);
          expect(got.length).toBe(want!.data.length);
          let diff = 0;
          let scale = 0;
          got.forEach((x, i) => {
            diff = Math.max(diff, Math.abs(x - want!.data[i]!));
            scale = Math.max(scale, Math.abs(want!.data[i]!));
          });
          expect(diff / scale, `${caseName}/${f.name} max relative error`).toBeLessThanOrEqual(golden.tolerance.logits_max_rel);
        }
        for (const run of golden.decodes) {
          const label = `${caseName}/${run.name}`;
          const result = await engine.generate({ promptIds: run.prompt_ids, params: decodeParams(run.params) });
          expect(result.tokenIds, label).toEqual(run.token_ids);
          expect(result.finishReason, label).toBe(run.finish_reason);
          expect(result.forwardPasses, label).toBe(run.forward_passes);
          expect(result.completionTokens, label).toBe(run.token_ids.length);
          expect(result.promptTokens, label).toBe(run.prompt_ids.length);
          expect(result.trace?.length, label).toBe(run.trace.length);
          result.trace!.forEach((step, i) => {
            const want = run.trace[i]!;
            expect([step.forward, step.blockStart, step.step], `${label} step ${i}`).toEqual([want.forward, want.block_start, want.step]);
            expect(step.candidates, `${label} step ${i}`).toEqual(want.candidates);
            expect(step.revealed.map(([j, t]) => [j, t]), `${label} step ${i}`).toEqual(want.revealed.map(([j, t]) => [j, t]));
            step.revealed.forEach(([, , confidence], k) => {
              expect(Math.abs(confidence - want.revealed[k]![2])).toBeLessThanOrEqual(golden.tolerance.confidence_abs);
            });
          });
        }
      } finally {
        await engine.close();
      }
    }
  });
});

describe("generation on the engine thread", () => {
  let engine: Engine;
  let golden: Golden;

  beforeAll(async () => {
    golden = readGolden(cases[0]!);
    engine = await loadEngine({ modelDir: join(goldenDir, cases[0]!, golden.model), device: "cpu", threads: 1 });
  });
  afterAll(async () => {
    await engine.close();
  });

  it("reports the model and its decoding defaults", () => {
    const config = JSON.parse(readFileSync(join(goldenDir, cases[0]!, golden.model, "config.json"), "utf8"));
    expect(engine.info.architecture).toBe(config.architectures[0]);
    expect(engine.info.vocabSize).toBe(config.vocab_size);
    expect(engine.info.maskTokenId).toBe(config.a2d.mask_token_id);
    expect(engine.info.decoding.blockSize).toBe(config.a2d.block_size);
    expect(engine.info.eosTokenIds).toEqual(config.a2d.eos_token_ids);
    expect(engine.info.device).toBe("cpu");
    expect(engine.info.numParameters).toBeGreaterThan(0);
  });

  it("streams the completion's final tokens, in order, before the promise resolves", async () => {
    const run = golden.decodes.find((d) => d.name === "greedy_fused")!;
    const events: Array<{ tokens: number[]; forwardPasses: number }> = [];
    const before = engine.totalForwardPasses();
    const result = await engine.generate({ promptIds: run.prompt_ids, params: decodeParams(run.params), onBlock: (e) => events.push(e) });
    expect(result.tokenIds).toEqual(run.token_ids);
    expect(events.flatMap((e) => e.tokens)).toEqual(result.tokenIds);
    // A block's revealed run goes out after each step: at least one event a block, none empty.
    expect(events.length).toBeGreaterThanOrEqual(Math.ceil(run.token_ids.length / run.params.block_size));
    expect(events.every((e) => e.tokens.length > 0)).toBe(true);
    expect(events.at(-1)!.forwardPasses).toBe(result.forwardPasses);
    expect(engine.totalForwardPasses() - before).toBe(result.forwardPasses);
  });

  it("cancels through an AbortSignal between denoising steps", async () => {
    const prompt = golden.decodes[0]!.prompt_ids;
    const controller = new AbortController();
    const streamed: number[] = [];
    // As long as the context allows, so the engine is still running when the abort arrives.
    const maxTokens = engine.info.maxContext - prompt.length - 1;
    const result = await engine.generate({
      promptIds: prompt,
      params: { maxTokens, blockSize: 2, threshold: 1 },
      onBlock: (e) => {
        streamed.push(...e.tokens);
        controller.abort();
      },
      signal: controller.signal,
    });
    expect(result.finishReason).toBe("cancelled");
    expect(result.tokenIds.length).toBeGreaterThan(0);
    expect(result.tokenIds.length).toBeLessThan(maxTokens);
    expect(result.tokenIds).toEqual(streamed);

    const aborted = AbortSignal.abort();
    const early = await engine.generate({ promptIds: prompt, params: { maxTokens: 16 }, signal: aborted });
    expect(early).toMatchObject({ finishReason: "cancelled", tokenIds: [], forwardPasses: 0 });
  });

  it("runs queued generations one at a time, first in first out", async () => {
    const run = golden.decodes.find((d) => d.name === "greedy_fused")!;
    const order: string[] = [];
    const [a, b] = await Promise.all([
      engine.generate({ promptIds: run.prompt_ids, params: decodeParams(run.params) }).then((r) => (order.push("a"), r)),
      engine.generate({ promptIds: run.prompt_ids, params: { ...decodeParams(run.params), seed: 5 } }).then((r) => (order.push("b"), r)),
    ]);
    expect(order).toEqual(["a", "b"]);
    expect(a.tokenIds).toEqual(run.token_ids);
    expect(b.tokenIds).toEqual(run.token_ids); // temperature 0: the seed does not matter
  });

  it("rejects parameters outside docs/decoding.md ranges by name", async () => {
    const promptIds = [1, 2, 3];
    const bad: Array<[Partial<DecodeParams>, string]> = [
      [{ blockSize: 0 }, "blockSize"],
      [{ blockSize: 1 }, "blockSize"],
      [{ advance: "jump" as never }, "advance"],
      [{ remasking: "verify" as never }, "remasking"],
      [{ remasking: "leftmost", threshold: 1 }, "left_to_right"],
      [{ advance: "slide", steps: 2 }, "schedule_needs_blocks"],
      [{ blockSize: 65 }, "blockSize"],
      [{ threshold: 1.5 }, "threshold"],
      [{ minPerStep: 9, blockSize: 8 }, "minPerStep"],
      [{ steps: 5, blockSize: 4 }, "steps"],
      [{ temperature: -0.1 }, "temperature"],
      [{ topP: 0 }, "topP"],
      [{ remasking: "sometimes" as never }, "remasking"],
      [{ commit: "later" as never }, "commit"],
      [{ revealOrder: "skip" as never }, "revealOrder"],
      [{ seed: -1 }, "seed"],
      [{ seed: 1n << 64n }, "seed"],
      [{ seed: 2 ** 60 }, "seed"],
      [{ eosTokenIds: [engine.info.vocabSize] }, "eosTokenIds"],
      [{ maxTokens: 1.5 }, "maxTokens"],
    ];
    for (const [params, name] of bad) {
      const error = await engine.generate({ promptIds, params: { maxTokens: 4, ...params } }).catch((e: unknown) => e);
      expect(error, name).toBeInstanceOf(InvalidDecodeParamError);
      expect((error as InvalidDecodeParamError).param).toBe(name);
    }
    await expect(engine.generate({ promptIds: [], params: { maxTokens: 4 } })).rejects.toThrow(/at least one token/);
    await expect(engine.generate({ promptIds: [engine.info.vocabSize], params: { maxTokens: 4 } })).rejects.toThrow(/promptIds/);
    await expect(engine.generate({ promptIds, params: { maxTokens: engine.info.maxContext } })).rejects.toThrow(/larger maxContext/);
    // The largest seed is valid.
    const ok = await engine.generate({ promptIds, params: { maxTokens: 4, seed: (1n << 64n) - 1n, temperature: 1 } });
    expect(ok.tokenIds.length).toBe(4);
  });

  it("holds the decoding table's shared cases, and reports every table parameter's model default", async () => {
    const promptIds = [1, 2, 3];
    for (const c of DECODING_TABLE.cases) {
      const snake = { ...DECODING_TABLE.case_defaults, ...c.params } as Record<string, unknown>;
      const params = Object.fromEntries(Object.entries(snake).map(([k, v]) => [camelName(k), v])) as unknown as DecodeParams;
      const label = JSON.stringify(c.params);
      if (c.ok) {
        expect((await engine.generate({ promptIds, params })).tokenIds.length, label).toBe(params.maxTokens);
      } else {
        const error = await engine.generate({ promptIds, params }).catch((e: unknown) => e);
        expect(error, label).toBeInstanceOf(InvalidDecodeParamError);
        // A broken cross-field rule is named by its id; a parameter by its camelCase name.
        const rule = DECODING_TABLE.rules.some((r) => r.id === c.error);
        expect((error as InvalidDecodeParamError).param, label).toBe(rule ? c.error : camelName(c.error!));
      }
    }
    expect(Object.keys(engine.info.decoding).sort()).toEqual(DECODING_TABLE.parameters.map((p) => camelName(p.name)).sort());
  });

  it("rejects the promise when onBlock throws, and keeps serving", async () => {
    await expect(
      engine.generate({
        promptIds: [1, 2, 3],
        params: { maxTokens: 40 },
        onBlock: () => {
          throw new Error("listener failed");
        },
      }),
    ).rejects.toThrow(/onBlock threw: listener failed/);
    expect((await engine.generate({ promptIds: [1, 2, 3], params: { maxTokens: 4 } })).tokenIds.length).toBe(4);
  });
});

describe("continuous batching through the addon", () => {
  let batched: Engine;
  let alone: Engine;
  let golden: Golden;

  beforeAll(async () => {
    golden = readGolden(cases[0]!);
    const modelDir = join(goldenDir, cases[0]!, golden.model);
    batched = await loadEngine({ modelDir, device: "cpu", threads: 1, maxBatch: 4 });
    alone = await loadEngine({ modelDir, device: "cpu", threads: 1 });
  });
  afterAll(async () => {
    await batched.close();
    await alone.close();
  });

  it("reports its batch size and refuses one outside 1..MAX_BATCH", async () => {
    expect(batched.info.maxBatch).toBe(4);
    expect(alone.info.maxBatch).toBe(1);
    const modelDir = join(goldenDir, cases[0]!, golden.model);
    await expect(loadEngine({ modelDir, device: "cpu", maxBatch: 0 })).rejects.toThrow(/maxBatch must be an integer in 1\.\.256/);
    await expect(loadEngine({ modelDir, device: "cpu", maxBatch: 2.5 })).rejects.toThrow(/maxBatch/);
  });

  it("decodes every golden run submitted at once as it decodes alone, bit for bit", async () => {
    const runs = golden.decodes;
    const together = await Promise.all(runs.map((run) => batched.generate({ promptIds: run.prompt_ids, params: decodeParams(run.params) })));
    for (const [i, run] of runs.entries()) {
      const single = await alone.generate({ promptIds: run.prompt_ids, params: decodeParams(run.params) });
      expect(together[i]!.tokenIds, run.name).toEqual(run.token_ids);
      expect(together[i]!.forwardPasses, run.name).toBe(run.forward_passes);
      // The same confidences to the last bit: the same logits whatever ran beside it.
      expect(together[i]!.trace, run.name).toEqual(single.trace);
    }
  });

  it("a generation submitted while another runs joins the next forward and can finish first", async () => {
    const run = golden.decodes.find((d) => d.name === "greedy_fused")!;
    const order: string[] = [];
    let joined: Promise<unknown> | null = null;
    const long = batched.generate({
      promptIds: run.prompt_ids,
      params: { maxTokens: 200, blockSize: 2, threshold: 1 },
      onBlock: () => {
        joined ??= batched.generate({ promptIds: run.prompt_ids, params: decodeParams(run.params) }).then((r) => (order.push("short"), r));
      },
    }).then((r) => (order.push("long"), r));
    const longResult = await long;
    const shortResult = (await joined) as Awaited<ReturnType<Engine["generate"]>>;
    expect(order).toEqual(["short", "long"]);
    expect(shortResult.tokenIds).toEqual(run.token_ids);
    expect(longResult.completionTokens).toBe(200);
  });

  it("cancels one generation of a batch and leaves the others as they were", async () => {
    const run = golden.decodes.find((d) => d.name === "sample_top_p")!;
    const controller = new AbortController();
    const long = batched.generate({
      promptIds: run.prompt_ids,
      params: { maxTokens: 300, blockSize: 2, threshold: 1 },
      signal: controller.signal,
      onBlock: () => controller.abort(),
    });
    const [cancelled, kept] = await Promise.all([long, batched.generate({ promptIds: run.prompt_ids, params: decodeParams(run.params) })]);
    expect(cancelled.finishReason).toBe("cancelled");
    expect(cancelled.completionTokens).toBeLessThan(300);
    expect(kept.tokenIds).toEqual(run.token_ids);
  });

  it("runs forwardLogits between generations, with the logits it gives alone", async () => {
    const f = golden.forwards[0]!;
    const want = await alone.forwardLogits(f.cached_ids, f.commit_ids, f.window_ids);
    const run = golden.decodes[0]!;
    const [, got] = await Promise.all([
      batched.generate({ promptIds: run.prompt_ids, params: { maxTokens: 40, blockSize: 2 } }),
      batched.forwardLogits(f.cached_ids, f.commit_ids, f.window_ids),
      batched.generate({ promptIds: run.prompt_ids, params: { maxTokens: 40, blockSize: 2 } }),
    ]);
    expect(got).toEqual(want);
  });
});

describe("bad model folders are rejected with the file and the fix", () => {
  let scratch: string;
  let source: string;

  beforeAll(() => {
    scratch = mkdtempSync(join(tmpdir(), "a2d-engine-test-"));
    const golden = readGolden(cases[0]!);
    source = join(goldenDir, cases[0]!, golden.model);
  });
  afterAll(() => rmSync(scratch, { recursive: true, force: true }));

  function copyModel(name: string): string {
    const dir = join(scratch, name);
    cpSync(source, dir, { recursive: true });
    return dir;
  }

  it("a missing folder", async () => {
    await expect(loadEngine({ modelDir: join(scratch, "nope"), device: "cpu" })).rejects.toThrow(/nope\/config\.json: cannot open the model config/);
  });

  it("missing weights", async () => {
    const dir = copyModel("no-weights");
    rmSync(join(dir, "model.safetensors"));
    await expect(loadEngine({ modelDir: dir, device: "cpu" })).rejects.toThrow(/no weights: expected model\.safetensors/);
  });

  it("a truncated safetensors file", async () => {
    const dir = copyModel("truncated");
    const weights = join(dir, "model.safetensors");
    truncateSync(weights, readFileSync(weights).length - 100);
    await expect(loadEngine({ modelDir: dir, device: "cpu" })).rejects.toThrow(/model\.safetensors: truncated or corrupt safetensors file/);
  });

  it("a corrupt safetensors header", async () => {
    const dir = copyModel("corrupt");
    const weights = join(dir, "model.safetensors");
    const bytes = readFileSync(weights);
    bytes.write("#", 9);
    writeFileSync(weights, bytes);
    await expect(loadEngine({ modelDir: dir, device: "cpu" })).rejects.toThrow(/corrupt safetensors header \(not valid JSON/);
  });

  it("a config that does not match the tensors", async () => {
    const dir = copyModel("mismatch");
    const config = JSON.parse(readFileSync(join(dir, "config.json"), "utf8"));
    config.intermediate_size += 8;
    writeFileSync(join(dir, "config.json"), JSON.stringify(config));
    await expect(loadEngine({ modelDir: dir, device: "cpu" })).rejects.toThrow(/mlp\.gate_proj\.weight' has shape .* the weights do not match the config/);
  });

  it("an unknown architecture", async () => {
    const dir = copyModel("arch");
    const config = JSON.parse(readFileSync(join(dir, "config.json"), "utf8"));
    config.architectures = ["MambaForCausalLM"];
    writeFileSync(join(dir, "config.json"), JSON.stringify(config));
    await expect(loadEngine({ modelDir: dir, device: "cpu" })).rejects.toThrow(/config\.json: field 'architectures' names 'MambaForCausalLM'.*supported: LlamaForCausalLM/);
  });

  it("close cancels a running generation and frees the model", async () => {
    const engine = await loadEngine({ modelDir: source, device: "cpu", threads: 1 });
    const maxTokens = engine.info.maxContext - 4;
    const running = engine.generate({ promptIds: [1, 2, 3], params: { maxTokens, blockSize: 2, threshold: 1 } });
    const queued = engine.generate({ promptIds: [1, 2, 3], params: { maxTokens, blockSize: 2, threshold: 1 } });
    await engine.close();
    for (const result of await Promise.all([running, queued])) {
      expect(result.finishReason).toBe("cancelled");
      expect(result.tokenIds.length).toBeLessThan(maxTokens);
    }
  });

  it("a closed engine refuses new work", async () => {
    const engine = await loadEngine({ modelDir: source, device: "cpu", threads: 1 });
    await engine.close();
    await expect(engine.generate({ promptIds: [1], params: { maxTokens: 1 } })).rejects.toThrow(/closed/);
    await expect(engine.close()).resolves.toBeUndefined();
  });
});
