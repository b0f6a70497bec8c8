// Prompt encoding off the event loop. tokenizers.js encodes about a megabyte of text per second; on the
// main thread a long conversation would hold up /health, the running stream and every other request
// for that long. A worker thread holds its own copy of the tokenizer and encodes prompts in turn, while
// the main thread goes on serving.
import { Worker } from "node:worker_threads";

import { ApiError } from "./errors.js";
import type { ModelTokenizer, TokenizerFiles } from "./tokenizer.js";

/** "prompt": a plain prompt, with the tokenizer's own special tokens; "rendered": a chat the template rendered. */
export type EncodeKind = "prompt" | "rendered";

export interface EncodeRequest {
  id: number;
  text: string;
  kind: EncodeKind;
}

export type EncodeReply = { id: number; ids: Int32Array } | { id: number; error: string };

export interface PromptEncoder {
  encode(text: string, kind: EncodeKind): Promise<number[]>;
  close(): Promise<void>;
}

/** A tokenizer that refuses a text refuses the request, not the server. */
function refused(message: string): ApiError {
  return new ApiError("invalid_value", `The prompt cannot be tokenized: ${message}`, null);
}

/** Encodes on the calling thread: for the CLI, and for tests that drive the app in-process. */
export function inlineEncoder(tokenizer: ModelTokenizer): PromptEncoder {
  return {
    async encode(text, kind) {
      try {
        return kind === "prompt" ? tokenizer.encodePrompt(text) : tokenizer.encodeRendered(text);
      } catch (error) {
        throw refused(error instanceof Error ? error.message : String(error));
      }
    },
    async close() {},
  };
}

class WorkerEncoder implements PromptEncoder {
  private nextId = 1;
  private readonly pending = new Map<number, { resolve: (ids: number[]) => void; reject: (error: Error) => void }>();
  private worker: Worker;
  private closed = false;

  private constructor(
    private readonly files: TokenizerFiles,
    first: Worker,
  ) {
    this.worker = first;
    this.watch(first);
  }

  static async start(files: TokenizerFiles): Promise<WorkerEncoder> {
    return new WorkerEncoder(files, await WorkerEncoder.spawn(files));
  }

  private static newWorker(files: TokenizerFiles): Worker {
    const worker = new Worker(new URL("./encoder-worker.js", import.meta.url), { workerData: files });
    // A server that is shutting down does not wait for its encoder.
    worker.unref();
    return worker;
  }

  /** A worker that has loaded the tokenizer. */
  private static spawn(files: TokenizerFiles): Promise<Worker> {
    const worker = WorkerEncoder.newWorker(files);
    return new Promise((resolve, reject) => {
      const onError = (error: Error) => reject(new Error(`the prompt encoder's worker thread could not start: ${error.message}`));
      worker.once("error", onError);
      worker.once("message", () => {
        worker.off("error", onError);
        resolve(worker);
      });
    });
  }

  private watch(worker: Worker): void {
    worker.on("message", (reply: EncodeReply) => {
      const waiter = this.pending.get(reply.id);
      if (waiter === undefined) return;
      this.pending.delete(reply.id);
      if ("error" in reply) waiter.reject(refused(reply.error));
      else waiter.resolve(Array.from(reply.ids));
    });
    // An uncaught error in the worker ends it (the exit handler below); it must not end the server.
    worker.on("error", () => {});
    worker.on("exit", (code) => {
      for (const waiter of this.pending.values()) waiter.reject(new Error(`the prompt encoder's worker thread exited (code ${code})`));
      this.pending.clear();
      if (this.closed) return;
      // Out of memory on one huge prompt, say: the next request gets a fresh worker (its messages wait
      // in its port until it has loaded the tokenizer).
      this.worker = WorkerEncoder.newWorker(this.files);
      this.watch(this.worker);
    });
  }

  encode(text: string, kind: EncodeKind): Promise<number[]> {
    const id = this.nextId++;
    return new Promise((resolve, reject) => {
      this.pending.set(id, { resolve, reject });
      const request: EncodeRequest = { id, text, kind };
      this.worker.postMessage(request);
    });
  }

  async close(): Promise<void> {
    this.closed = true;
    await this.worker.terminate();
  }
}

/** Starts the worker thread, which builds its tokenizer from a copy of `files`; resolves once it can encode. */
export function startEncoderWorker(files: TokenizerFiles): Promise<PromptEncoder> {
  return WorkerEncoder.start(files);
}
