// Start a packed a2d folder's serve.sh, wait until /health says ready, ask one chat question with the
// official OpenAI client, and print the answer with the tokens committed per forward pass and tokens/s.
// Usage: node scripts/demo-chat.mjs PACKED_DIR [question]
import { spawn } from "node:child_process";
import { once } from "node:events";
import path from "node:path";
import OpenAI from "openai";

const [dir, question = "What is the capital of France? Answer in one sentence."] = process.argv.slice(2);
if (!dir) {
  console.error("usage: node scripts/demo-chat.mjs PACKED_DIR [question]");
  process.exit(2);
}
const port = 18000 + Math.floor(Math.random() * 1000);
const base = `http://127.0.0.1:${port}`;
const server = spawn("bash", [path.join(dir, "serve.sh")], {
  env: { PATH: "/usr/bin:/bin", PORT: String(port), A2D_DEVICE: "cpu" },
  stdio: ["ignore", "pipe", "pipe"],
});
let log = "";
server.stdout.on("data", (b) => (log += b));
server.stderr.on("data", (b) => (log += b));
const stop = async () => {
  if (server.exitCode === null) {
    server.kill("SIGTERM");
    await once(server, "exit");
  }
};

async function health() {
  try {
    const res = await fetch(`${base}/health`);
    return { status: res.status, body: await res.json() };
  } catch {
    return { status: 0, body: null };
  }
}

try {
  const started = performance.now();
  let ready = await health();
  while (ready.status !== 200) {
    if (server.exitCode !== null) throw new Error(`serve.sh exited with ${server.exitCode}:\n${log}`);
    if (performance.now() - started > 300_000) throw new Error(`not ready within 300 s:\n${log}`);
    await new Promise((r) => setTimeout(r, 200));
    ready = await health();
  }
  console.log(`ready in ${((performance.now() - started) / 1000).toFixed(1)} s: ${JSON.stringify(ready.body.decoding ?? ready.body)}`);

  const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: "none" });
  const model = (await client.models.list()).data[0].id;
  const before = ready.body.forward_passes ?? 0;
  const t0 = performance.now();
  const stream = await client.chat.completions.create({
    model,
    messages: [{ role: "user", content: question }],
    max_tokens: 256,
    temperature: 0,
    stream: true,
    stream_options: { include_usage: true },
  });
  let answer = "";
  let usage;
  for await (const chunk of stream) {
    answer += chunk.choices[0]?.delta?.content ?? "";
    if (chunk.usage) usage = chunk.usage;
  }
  const seconds = (performance.now() - t0) / 1000;
  const after = (await health()).body.forward_passes ?? 0;
  const tokens = usage?.completion_tokens ?? 0;
  console.log(`\nQ: ${question}\nA: ${answer.trim()}\n`);
  console.log(
    `${tokens} tokens in ${seconds.toFixed(2)} s = ${(tokens / seconds).toFixed(1)} tokens/s; ` +
      `${after - before} forward passes = ${(tokens / Math.max(after - before, 1)).toFixed(2)} tokens/forward (CPU backend)`,
  );
} finally {
  await stop();
}
