// `a2d generate` (the built CLI, real addon) against `python -m a2d_convert generate` (the PyTorch
// reference) on a tiny model made here and nowhere else: same token ids, same text, same counts.
import { execFile } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";

import { afterAll, beforeAll, describe, expect, it } from "vitest";

import { CLI, ensureBuilt, makeTinyModel, PYTHON, ROOT } from "./server-harness.js";

const run = promisify(execFile);
const work = mkdtempSync(join(tmpdir(), "a2d-cli-generate-"));
let model: string;

beforeAll(() => {
  ensureBuilt();
  // A shape no other suite uses: 3 layers, 4:1 GQA, tied embeddings, QKV bias, seed 7.
  model = makeTinyModel(join(work, "tiny"), [
    "--seed", "7", "--layers", "3", "--hidden", "96", "--intermediate", "160", "--heads", "4", "--kv-heads", "1",
    "--tie-embeddings", "--attention-bias",
  ]);
});
afterAll(() => rmSync(work, { recursive: true, force: true }));

interface GenerateJson {
  token_ids: number[];
  text: string;
  completion_tokens: number;
  forward_passes: number;
  tokens_per_forward: number;
  steps: number;
  revealed: number;
  topped_up: number;
  ms: number;
  finish_reason: string;
  prompt_tokens: number;
}

const cases: Array<[string, string[]]> = [
  ["greedy, model defaults", ["--prompt", "The quick brown fox", "--max-tokens", "40"]],
  ["greedy, big blocks, low threshold, 2 per step, separate commits", ["--prompt", "What is two plus two?", "--max-tokens", "37", "--block-size", "8", "--threshold", "0.3", "--min-per-step", "2", "--commit", "separate"]],
  ["sampled with a seed, top-p, random remasking", ["--prompt", "Once upon a time", "--max-tokens", "32", "--temperature", "0.9", "--top-p", "0.8", "--seed", "1234", "--remasking", "random"]],
  ["leftmost remasking, two per step", ["--prompt", "Count to ten:", "--max-tokens", "28", "--remasking", "leftmost", "--min-per-step", "2", "--threshold", "0.6"]],
  ["sliding window, greedy", ["--prompt", "Count to ten:", "--max-tokens", "30", "--advance", "slide", "--threshold", "0.3"]],
  ["sliding window, sampled, separate commits", ["--prompt", "Once upon a time", "--max-tokens", "29", "--advance", "slide", "--threshold", "0.5", "--temperature", "0.7", "--seed", "3", "--commit", "separate"]],
  ["chat, no thinking, step schedule", ["--prompt", "Hello! How are you?", "--chat", "--no-think", "--max-tokens", "24", "--steps", "2", "--threshold", "1"]],
  ["chat with a 64-bit seed", ["--prompt", "def add(a, b):", "--chat", "--max-tokens", "24", "--temperature", "1.0", "--seed", "18446744073709551615"]],
];

/** The reference CLI's own entry point, called once per case in one process: torch is imported once. */
async function referenceRuns(): Promise<GenerateJson[]> {
  const argvs = cases.map(([, flags]) => JSON.stringify(["generate", "--model", model, "--json", ...flags]));
  const script = "import json, sys\nfrom a2d_convert.__main__ import main\nfor argv in sys.argv[1:]:\n    assert main(json.loads(argv)) == 0\n";
  const { stdout } = await run(PYTHON, ["-c", script, ...argvs], { cwd: ROOT });
  return stdout.trim().split("\n").map((line) => JSON.parse(line) as GenerateJson);
}

describe("a2d generate against the PyTorch reference", () => {
  let references: GenerateJson[];
  beforeAll(async () => {
    references = await referenceRuns();
    expect(references).toHaveLength(cases.length);
  });

  it.each(cases.map((c, index) => [...c, index] as const))("%s", async (_name, flags, index) => {
    const reference = references[index]!;
    const { stdout } = await run(process.execPath, [CLI, "generate", "--model", model, "--json", ...flags, "--threads", "1"], { cwd: work });
    const ours = JSON.parse(stdout) as GenerateJson;
    expect(ours.token_ids).toEqual(reference.token_ids);
    expect(ours.text).toBe(reference.text);
    expect(ours.completion_tokens).toBe(reference.completion_tokens);
    expect(ours.forward_passes).toBe(reference.forward_passes);
    expect(ours.tokens_per_forward).toBeCloseTo(reference.tokens_per_forward, 12);
    expect([ours.steps, ours.revealed, ours.topped_up]).toEqual([reference.steps, reference.revealed, reference.topped_up]);
    expect(ours.finish_reason).toBe(reference.finish_reason);
    expect(ours.prompt_tokens).toBe(reference.prompt_tokens);
    expect(Object.keys(ours)).toEqual(Object.keys(reference));
    expect(ours.ms).toBeGreaterThan(0);
  });
});

describe("a2d generate on bad input", () => {
  async function fails(args: string[]): Promise<{ code: number; stderr: string }> {
    try {
      await run(process.execPath, [CLI, "generate", ...args], { cwd: work });
    } catch (error) {
      const failure = error as { code: number; stderr: string };
      return { code: failure.code, stderr: failure.stderr };
    }
    throw new Error(`a2d generate ${args.join(" ")} succeeded`);
  }

  it("names the missing model folder's file", async () => {
    const { code, stderr } = await fails(["--model", join(work, "missing"), "--prompt", "x"]);
    expect(code).not.toBe(0);
    expect(stderr).toContain(join(work, "missing"));
  });

  it("refuses --no-think without --chat, and out-of-range flags", async () => {
    expect((await fails(["--model", model, "--prompt", "x", "--no-think"])).stderr).toContain("add --chat");
    expect((await fails(["--model", model, "--prompt", "x", "--temperature", "3"])).stderr).toContain("--temperature must be in [0, 2]");
    expect((await fails(["--model", model, "--prompt", "x", "--seed", "-1"])).stderr).toContain("--seed");
    const verify = (await fails(["--model", model, "--prompt", "x", "--remasking", "verify"])).stderr;
    expect(verify).toContain("Allowed choices are low_confidence, random, leftmost");
    expect((await fails(["--model", model, "--prompt", "x", "--remasking", "leftmost", "--threshold", "1"])).stderr).toContain("autoregressive decoding, not denoising");
    expect((await fails(["--model", model, "--prompt", "x", "--block-size", "0"])).stderr).toContain("--block-size");
  });

  it("refuses an empty prompt", async () => {
    expect((await fails(["--model", model, "--prompt", ""])).stderr).toContain("--prompt encodes to no tokens");
  });
});

describe("a2d bench on the same tiny model (CPU)", () => {
  it("times every block size and KV length with finite numbers", async () => {
    const { stdout } = await run(process.execPath, [CLI, "bench", "--model", model, "--device", "cpu", "--blocks", "4,16", "--kv", "8,24", "--tokens", "24", "--json"], { cwd: work });
    const result = JSON.parse(stdout) as { rows: Array<{ blockSize: number; kv: number; msPerForward: number; tokensPerForward: number }> };
    expect(result.rows.map((r) => [r.blockSize, r.kv])).toEqual([[4, 8], [4, 24], [16, 8], [16, 24]]);
    for (const row of result.rows) {
      expect(Number.isFinite(row.msPerForward) && row.msPerForward > 0).toBe(true);
      expect(row.tokensPerForward).toBeGreaterThan(0);
    }
  });

  it("benches a random shape under the window rule: the shape's weights, a2d.window_rule in its config", async () => {
    const { stdout } = await run(process.execPath, [CLI, "bench", "--random-shape", "tiny", "--random-adapter", "window-rule", "--device", "cpu", "--blocks", "4", "--kv", "8", "--tokens", "16", "--json"], { cwd: work });
    const result = JSON.parse(stdout) as { model: string; rows: Array<{ msPerForward: number }> };
    expect(result.model.endsWith("-window-rule")).toBe(true);
    expect(JSON.parse(readFileSync(join(result.model, "config.json"), "utf8")).a2d.window_rule).toBe(true);
    expect(result.rows.length).toBe(1);
    expect(Number.isFinite(result.rows[0]?.msPerForward) && (result.rows[0]?.msPerForward ?? 0) > 0).toBe(true);
  });

  it("refuses --tokens that do not exceed the largest block, naming the fix", async () => {
    const failure = await run(process.execPath, [CLI, "bench", "--model", model, "--device", "cpu", "--blocks", "4,16", "--kv", "8", "--tokens", "16"], { cwd: work }).then(
      () => undefined,
      (error: { code: number; stderr: string }) => error,
    );
    expect(failure?.code).not.toBe(0);
    expect(failure?.stderr).toContain("--tokens 16 must be more than the largest block size (16)");
  });
});
