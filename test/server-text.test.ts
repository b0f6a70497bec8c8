// The server's text pipeline without a model: stop strings, the reasoning split, streaming
// detokenization (on a real tokenizer folder) and the admission queue.
import { execFileSync } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

import { afterAll, describe, expect, it } from "vitest";

import { IncrementalDecoder } from "../server/detokenizer.js";
import { ApiError } from "../server/errors.js";
import { GenerationQueue } from "../server/queue.js";
import { ReasoningSplitter } from "../server/reasoning.js";
import { StopMatcher } from "../server/stop.js";
import { ModelTokenizer } from "../server/tokenizer.js";

/** Feeds `pieces` through `push` then `flush`, returning everything released. */
function runStops(stops: string[], pieces: string[]): { text: string; stopped: boolean; releases: string[] } {
  const matcher = new StopMatcher(stops);
  const releases = pieces.map((piece) => matcher.push(piece));
  releases.push(matcher.flush());
  return { text: releases.join(""), stopped: matcher.stopped, releases };
}

describe("stop strings", () => {
  it("cuts before a stop string split across pieces and sends nothing after it", () => {
    const { text, stopped, releases } = runStops(["STOP"], ["abc S", "TO", "P and more", "never"]);
    expect(text).toBe("abc ");
    expect(stopped).toBe(true);
    // The partial "S" was held back, not sent and taken back.
    expect(releases[0]).toBe("abc ");
    expect(releases[3]).toBe("");
  });

  it("releases a held-back partial match that turns out not to be a stop", () => {
    const { text, stopped, releases } = runStops(["\n\n", "END"], ["one\n", "two E", "N", "x"]);
    expect(releases.slice(0, 2)).toEqual(["one", "\ntwo "]);
    expect(text).toBe("one\ntwo ENx");
    expect(stopped).toBe(false);
  });

  it("picks the earliest of several stop strings, and a stop at the very start", () => {
    expect(runStops(["b", "a"], ["xxab"]).text).toBe("xx");
    expect(runStops(["hello"], ["hello world"]).text).toBe("");
    expect(runStops([], ["free", " text"]).text).toBe("free text");
  });
});

function split(pieces: string[], opens = false): { reasoning: string; content: string } {
  const splitter = new ReasoningSplitter(opens);
  const out = { reasoning: "", content: "" };
  for (const delta of [...pieces.map((piece) => splitter.push(piece)), splitter.flush()]) {
    out.reasoning += delta.reasoning;
    out.content += delta.content;
  }
  return out;
}

describe("reasoning split", () => {
  it("separates a think block from the answer, with tags cut across pieces", () => {
    expect(split(["<thi", "nk>\nLet me", " think.</th", "ink>\n\nThe answer", " is 4."])).toEqual({
      reasoning: "\nLet me think.",
      content: "The answer is 4.",
    });
  });

  it("starts inside reasoning when the prompt opened the block", () => {
    expect(ReasoningSplitter.promptOpensReasoning("<|im_start|>assistant\n<think>\n")).toBe(true);
    expect(ReasoningSplitter.promptOpensReasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n")).toBe(false);
    expect(split(["why", "</think>so"], true)).toEqual({ reasoning: "why", content: "so" });
  });

  it("leaves text without a leading think block as content, and an unclosed block as reasoning", () => {
    expect(split(["Plain <think> answer"])).toEqual({ reasoning: "", content: "Plain <think> answer" });
    expect(split(["<", "b>bold"])).toEqual({ reasoning: "", content: "<b>bold" });
    expect(split(["<think>still going"])).toEqual({ reasoning: "still going", content: "" });
    expect(split(["<thi"])).toEqual({ reasoning: "", content: "<thi" });
  });
});

describe("streaming detokenization", () => {
  const work = mkdtempSync(join(tmpdir(), "a2d-detok-"));
  afterAll(() => rmSync(work, { recursive: true, force: true }));
  const python = join(import.meta.dirname, "..", ".venv", "bin", "python");
  const reference = join(import.meta.dirname, "tokenizer-reference.py");

  it.each(["byte-level", "metaspace"])("%s: deltas concatenate to the full decode, whatever the block size", async (flavour) => {
    const dir = join(work, flavour);
    execFileSync(python, [reference, "make", "--flavour", flavour, "--out", dir]);
    const tokenizer = await ModelTokenizer.load(dir);
    // Multi-byte characters split over several byte tokens are the case that needs care.
    const ids = tokenizer.encodePrompt("Hello World naïve 你好世界 🙂🚀 déjà vu, the quick brown fox <think>x</think>");
    const full = tokenizer.decode(ids);
    for (const block of [1, 2, 3, 4, 7]) {
      const decoder = new IncrementalDecoder((part) => tokenizer.decode(part));
      const deltas: string[] = [];
      for (let i = 0; i < ids.length; i += block) deltas.push(decoder.push(ids.slice(i, i + block)));
      deltas.push(decoder.flush());
      expect(deltas.join("")).toBe(full);
      // An incomplete character is never sent and then corrected.
      expect(deltas.some((delta) => delta.includes("\uFFFD"))).toBe(false);
    }
  });
});

describe("admission queue", () => {
  it("runs one at a time in order, refuses past the bound with Retry-After, and drops a waiter whose client left", async () => {
    const queue = new GenerationQueue(2);
    const order: string[] = [];
    const first = queue.enter(new AbortController().signal);
    const second = queue.enter(new AbortController().signal);
    const leaving = new AbortController();
    const third = queue.enter(leaving.signal);
    expect(queue.runningCount).toBe(1);
    expect(queue.waitingCount).toBe(2);

    let refusal: unknown;
    try {
      queue.enter(new AbortController().signal);
    } catch (error) {
      refusal = error;
    }
    expect(refusal).toBeInstanceOf(ApiError);
    expect((refusal as ApiError).status).toBe(429);
    expect(Number((refusal as ApiError).headers["retry-after"])).toBeGreaterThanOrEqual(1);

    leaving.abort("client");
    await expect(third.turn).rejects.toBe("client");
    expect(queue.waitingCount).toBe(1);

    void second.turn.then(() => order.push("second"));
    await first.turn;
    order.push("first");
    first.done();
    await second.turn;
    second.done();
    second.done(); // a second call must not release someone else's turn
    expect(order).toEqual(["first", "second"]);
    expect(queue.runningCount).toBe(0);
  });

  it("runs up to maxRunning at once, starts a waiter as each finishes, and counts rounds for Retry-After", async () => {
    const queue = new GenerationQueue(1, 2);
    const a = queue.enter(new AbortController().signal);
    const b = queue.enter(new AbortController().signal);
    const c = queue.enter(new AbortController().signal);
    await Promise.all([a.turn, b.turn]);
    expect(queue.runningCount).toBe(2);
    expect(queue.waitingCount).toBe(1);
    expect(() => queue.enter(new AbortController().signal)).toThrow(ApiError);
    let started = false;
    void c.turn.then(() => (started = true));
    b.done();
    await c.turn;
    expect(started).toBe(true);
    expect(queue.runningCount).toBe(2);
    a.done();
    c.done();
    expect(queue.runningCount).toBe(0);

    // Raising the bound starts waiters at once (the server does so when the engine has loaded).
    const narrow = new GenerationQueue(4);
    const first = narrow.enter(new AbortController().signal);
    const second = narrow.enter(new AbortController().signal);
    expect(narrow.waitingCount).toBe(1);
    narrow.setMaxRunning(3);
    await Promise.all([first.turn, second.turn]);
    expect([narrow.runningCount, narrow.waitingCount]).toEqual([2, 0]);
  });
});
