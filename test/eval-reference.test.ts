// The harness proved item by item: `a2d eval` runs every fixture benchmark (published file formats)
// against a scripted server that answers with the fixed answers of eval/fixtures/answers.jsonl (three
// rounds: plain, reasoning-model, hard cases), and its per-item grades must equal those of
// bench/reference_grader.py, written from the official harnesses' rules apart from eval/. Under the
// reference's `official` rules the grades may differ only where docs/eval.md lists a departure.
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";

import { BENCHMARKS } from "../eval/benchmarks/index.js";
import { V6_WINDOW } from "../eval/benchmarks/livecodebench.js";
import { venvPython } from "../eval/paths.js";
import { PythonWorker } from "../eval/python-worker.js";
import { findDataFiles, runEval, type ItemResult } from "../eval/run-eval.js";
import { ScriptedServer } from "./eval-scripted-server.js";

const ROOT = join(import.meta.dirname, "..");
const FIXTURES = join(ROOT, "eval", "fixtures");
const work = mkdtempSync(join(tmpdir(), "a2d-eval-reference-"));
afterAll(() => rmSync(work, { recursive: true, force: true }));

interface FixedAnswer {
  round: string;
  benchmark: string;
  id: string;
  content: string;
}
const answers = readFileSync(join(FIXTURES, "answers.jsonl"), "utf8").trim().split("\n").map((line) => JSON.parse(line) as FixedAnswer);
const rounds = [...new Set(answers.map((answer) => answer.round))];

function reference(details: string, rules: "a2d" | "official"): { benchmark: string; id: string; correct: boolean }[] {
  const out = execFileSync(venvPython(), [join(ROOT, "bench", "reference_grader.py"), "items", "--data", FIXTURES, "--details", details, "--rules", rules], {
    encoding: "utf8",
  });
  return out.trim().split("\n").map((line) => JSON.parse(line));
}

describe("a2d eval against the reference grader", () => {
  let server: ScriptedServer;
  let round = "";
  /** The last message of every item's prompt → "benchmark/id". */
  const itemOfPrompt = new Map<string, string>();

  beforeAll(async () => {
    const python = PythonWorker.start();
    try {
      for (const [name, file] of findDataFiles(FIXTURES)) {
        for (const item of await BENCHMARKS[name].load(file, { python, lcbWindow: V6_WINDOW, log: () => undefined })) {
          itemOfPrompt.set(item.messages[item.messages.length - 1]!.content, `${name}/${item.id}`);
        }
      }
    } finally {
      await python.close();
    }
    const byKey = new Map(answers.map((answer) => [`${answer.round}/${answer.benchmark}/${answer.id}`, answer.content]));
    server = await new ScriptedServer({
      answer: (body) => {
        const key = `${round}/${itemOfPrompt.get(body.messages[body.messages.length - 1]!.content)}`;
        const content = byKey.get(key);
        if (content === undefined) throw new Error(`no fixed answer for ${key}`);
        return { content };
      },
    }).start();
  });
  afterAll(() => server.stop());

  it("has a fixed answer for every item in every round", () => {
    expect(rounds).toEqual(["plain", "reasoning", "hard"]);
    for (const name of rounds) expect(answers.filter((answer) => answer.round === name).length).toBe(itemOfPrompt.size);
    expect(itemOfPrompt.size).toBe(26);
  });

  it.each(rounds)("grades the %s round item by item as the reference does", async (name) => {
    round = name;
    const details = join(work, `${name}.jsonl`);
    const run = await runEval({
      url: server.url,
      dataDir: FIXTURES,
      concurrency: 4,
      maxTokens: 1024,
      codePython: "/usr/bin/python3",
      progress: false,
      log: () => undefined,
      detailsFile: details,
    });
    const ours = readFileSync(details, "utf8").trim().split("\n").map((line) => JSON.parse(line) as ItemResult);
    expect(ours.length).toBe(26);
    const grades = (rows: { benchmark: string; id: string; correct: boolean }[]) => rows.map((row) => `${row.benchmark}/${row.id}: ${row.correct}`);
    expect(grades(ours)).toEqual(grades(reference(details, "a2d")));
    // Not a round that is all right or all wrong.
    const correct = ours.filter((item) => item.correct).length;
    expect(correct).toBeGreaterThan(3);
    expect(correct).toBeLessThan(23);
    expect(run.report.benchmarks.livecodebench_v6!.n).toBe(6);

    // The official rules disagree only on GPQA fallbacks, MMLU-Pro guesses and answers behind a <think>.
    const official = reference(details, "official");
    const departures = ours.filter((item, index) => item.correct !== official[index]!.correct);
    for (const item of departures) {
      const explained = item.benchmark === "gpqa_diamond" || (item.benchmark === "mmlu_pro" && item.extracted === null) || item.content.includes("<think>");
      expect(explained, `${item.benchmark}/${item.id}: ${JSON.stringify(item.content)}`).toBe(true);
    }
  });
});
