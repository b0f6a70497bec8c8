// A scripted OpenAI-compatible endpoint on a real port for the eval runner's suites: it streams the
// answers a test chooses (reasoning in `reasoning_content`, the answer split mid-word across chunks as a
// detokenizer would), serves /v1/models and /health as the test sets them, and can behave like a server
// that runs one generation at a time: later requests get their headers at once and then wait, silent
// or sending SSE comment heartbeats, until the ones ahead of them finish.
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";

export interface Scripted {
  reasoning?: string;
  content: string;
}

export interface ChatBody {
  model: string;
  messages: { role: string; content: string }[];
  max_tokens: number;
  [field: string]: unknown;
}

export interface ScriptedServerOptions {
  answer: (body: ChatBody) => Scripted | { status: number; message: string };
  /** One generation at a time; the rest wait in FIFO order. */
  serial?: boolean;
  /** While waiting in the queue, send `: waiting` every this many ms (none when undefined). */
  heartbeatMs?: number;
  /** Delay before the first token of each generation. */
  firstTokenMs?: number;
  /** Delay between the chunks of a generation. */
  chunkGapMs?: number;
  /** After the first chunk, go silent this long (a stalled generation). */
  stallAfterFirstChunkMs?: number;
}

export class ScriptedServer {
  url = "";
  requests = 0;
  inFlight = 0;
  maxInFlight = 0;
  bodies: ChatBody[] = [];
  card: Record<string, unknown> = { id: "scripted", object: "model", owned_by: "tests" };
  health: Record<string, unknown> | null = null;
  private readonly server: Server;
  private queue: Promise<void> = Promise.resolve();

  constructor(readonly options: ScriptedServerOptions) {
    this.server = createServer((req, res) => void this.handle(req, res));
  }

  async start(): Promise<this> {
    await new Promise<void>((resolve) => this.server.listen(0, "127.0.0.1", resolve));
    this.url = `http://127.0.0.1:${(this.server.address() as AddressInfo).port}`;
    return this;
  }

  stop(): Promise<void> {
    this.server.closeAllConnections();
    return new Promise((resolve) => this.server.close(() => resolve()));
  }

  private async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    res.on("error", () => undefined); // a client that gave up
    if (req.method === "GET" && req.url === "/v1/models") {
      // `created` changes on every call, as on servers that stamp the request time: it must not matter.
      res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ object: "list", data: [{ ...this.card, created: Date.now() }] }));
      return;
    }
    if (req.method === "GET" && req.url === "/health") {
      if (this.health === null) res.writeHead(404).end();
      else res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify(this.health));
      return;
    }
    let text = "";
    for await (const chunk of req) text += (chunk as Buffer).toString("utf8");
    this.requests += 1;
    const body = JSON.parse(text) as ChatBody;
    this.bodies.push(body);
    const scripted = this.options.answer(body);
    if ("status" in scripted) {
      res.writeHead(scripted.status, { "content-type": "application/json" }).end(JSON.stringify({ error: { message: scripted.message, type: "invalid_request_error" } }));
      return;
    }
    res.writeHead(200, { "content-type": "text/event-stream" });
    res.flushHeaders();
    const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
    let turn: Promise<void> = Promise.resolve();
    let release = () => {};
    if (this.options.serial) {
      const ahead = this.queue;
      this.queue = new Promise<void>((resolve) => (release = resolve));
      turn = ahead;
    }
    let heartbeat: NodeJS.Timeout | undefined;
    if (this.options.heartbeatMs !== undefined) heartbeat = setInterval(() => res.write(": waiting\n\n"), this.options.heartbeatMs);
    await turn;
    clearInterval(heartbeat);
    this.inFlight += 1;
    this.maxInFlight = Math.max(this.maxInFlight, this.inFlight);
    try {
      const send = (value: unknown) => res.write(`data: ${JSON.stringify(value)}\n\n`);
      await sleep(this.options.firstTokenMs ?? 0);
      send({ choices: [{ index: 0, delta: { role: "assistant", reasoning_content: scripted.reasoning ?? "" } }] });
      for (let at = 0; at < scripted.content.length; at += 7) {
        send({ choices: [{ index: 0, delta: { content: scripted.content.slice(at, at + 7) } }] });
        if (at === 0 && this.options.stallAfterFirstChunkMs) await sleep(this.options.stallAfterFirstChunkMs);
        if (this.options.chunkGapMs) await sleep(this.options.chunkGapMs);
      }
      send({ choices: [{ index: 0, delta: {}, finish_reason: "stop" }] });
      send({ choices: [], usage: { prompt_tokens: 10, completion_tokens: 20, total_tokens: 30 } });
      res.end("data: [DONE]\n\n");
    } finally {
      this.inFlight -= 1;
      release();
    }
  }
}
