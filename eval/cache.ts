// The response cache: one JSON line per finished chat completion, keyed by everything that determines
// the response: the server (its URL and the stable parts of what it says about its model), the model
// id, the messages and the sampling parameters. An interrupted run leaves at most one torn last line, which
// is skipped on reload; re-running the same command sends only the requests that have no line yet.
import { createHash } from "node:crypto";
import { appendFile, mkdir, readFile } from "node:fs/promises";
import { dirname } from "node:path";

import type { ChatRequest } from "./client.js";

export interface CachedResponse {
  content: string;
  reasoning: string;
  finishReason: string | null;
  completionTokens: number | null;
  /** Time to first token and total time when the response was fetched; null in lines from older runs. */
  ttftMs: number | null;
  totalMs: number | null;
}

interface CacheLine extends CachedResponse {
  key: string;
}

/** `server` is eval/run-eval.ts's serverIdentity: the same request to another server is another response. */
export function cacheKey(chat: ChatRequest, server: unknown): string {
  const identity = [server, chat.model, chat.messages, chat.maxTokens, chat.temperature ?? null, chat.topP ?? null, chat.seed ?? null, chat.extra ?? null];
  return createHash("sha256").update(JSON.stringify(identity)).digest("hex");
}

export class ResponseCache {
  private writes: Promise<void> = Promise.resolve();

  private constructor(
    readonly file: string,
    private readonly entries: Map<string, CachedResponse>,
    /** Lines that could not be parsed (a torn write from an interrupted run). */
    readonly skippedLines: number,
    private needsNewline: boolean,
  ) {}

  static async open(file: string): Promise<ResponseCache> {
    let text = "";
    try {
      text = await readFile(file, "utf8");
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== "ENOENT") {
        throw new Error(`cannot read the cache file ${file}: ${(error as Error).message}`);
      }
      await mkdir(dirname(file), { recursive: true });
    }
    const entries = new Map<string, CachedResponse>();
    let skipped = 0;
    for (const line of text.split("\n")) {
      if (line.trim() === "") continue;
      const entry = parseLine(line);
      if (entry === null) {
        skipped += 1;
        continue;
      }
      const { key, ...response } = entry;
      entries.set(key, response);
    }
    return new ResponseCache(file, entries, skipped, text.length > 0 && !text.endsWith("\n"));
  }

  get size(): number {
    return this.entries.size;
  }

  get(key: string): CachedResponse | undefined {
    return this.entries.get(key);
  }

  /** Records a response; writes are appended in call order. */
  put(key: string, response: CachedResponse): Promise<void> {
    this.entries.set(key, response);
    const line: CacheLine = { key, ...response };
    // A torn last line from an earlier run must not swallow this one.
    const prefix = this.needsNewline ? "\n" : "";
    this.needsNewline = false;
    this.writes = this.writes.then(() => appendFile(this.file, `${prefix}${JSON.stringify(line)}\n`));
    return this.writes;
  }

  /** Resolves when every write so far is on disk. */
  flush(): Promise<void> {
    return this.writes;
  }
}

function parseLine(line: string): CacheLine | null {
  try {
    const value = JSON.parse(line) as Partial<CacheLine>;
    if (typeof value.key !== "string" || typeof value.content !== "string") return null;
    return {
      key: value.key,
      content: value.content,
      reasoning: typeof value.reasoning === "string" ? value.reasoning : "",
      finishReason: typeof value.finishReason === "string" ? value.finishReason : null,
      completionTokens: typeof value.completionTokens === "number" ? value.completionTokens : null,
      ttftMs: typeof value.ttftMs === "number" ? value.ttftMs : null,
      totalMs: typeof value.totalMs === "number" ? value.totalMs : null,
    };
  } catch {
    return null;
  }
}
