// The worker thread of prompt-encoder.ts: its own copy of the model's tokenizer, encoding one prompt at
// a time and handing the ids back as a transferred Int32Array.
import { parentPort, workerData } from "node:worker_threads";

import type { EncodeReply, EncodeRequest } from "./prompt-encoder.js";
import { ModelTokenizer, type TokenizerFiles } from "./tokenizer.js";

const port = parentPort!;
// The files come from the main thread, which has read them already (once: tokenizer.json may be a pipe).
const tokenizer = ModelTokenizer.fromFiles(workerData as TokenizerFiles);

port.on("message", ({ id, text, kind }: EncodeRequest) => {
  let reply: EncodeReply;
  try {
    const ids = Int32Array.from(kind === "prompt" ? tokenizer.encodePrompt(text) : tokenizer.encodeRendered(text));
    reply = { id, ids };
    port.postMessage(reply, [ids.buffer]);
  } catch (error) {
    reply = { id, error: error instanceof Error ? error.message : String(error) };
    port.postMessage(reply);
  }
});
port.postMessage({ ready: true });
