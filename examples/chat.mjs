#!/usr/bin/env node
// Talks to a running `a2d serve` with the official openai client: lists the model, asks one question
// without streaming and one with streaming, and prints what comes back.
//   node examples/chat.mjs [question]      (A2D_URL, default http://127.0.0.1:8000/v1; A2D_API_KEY)
import OpenAI from "openai";

const client = new OpenAI({ baseURL: process.env.A2D_URL ?? "http://127.0.0.1:8000/v1", apiKey: process.env.A2D_API_KEY ?? "none" });
const question = process.argv[2] ?? "What is two plus two?";

const models = await client.models.list();
const model = models.data[0].id;
console.log(`models: ${models.data.map((m) => m.id).join(", ")}`);

const reply = await client.chat.completions.create({
  model,
  messages: [{ role: "user", content: question }],
  max_tokens: 48,
  temperature: 0,
});
const message = reply.choices[0].message;
console.log(`\n> ${question}  (non-streaming)`);
if (message.reasoning_content) console.log(`reasoning: ${JSON.stringify(message.reasoning_content)}`);
console.log(`content:   ${JSON.stringify(message.content)}`);
console.log(`finish_reason: ${reply.choices[0].finish_reason}, usage: ${JSON.stringify(reply.usage)}`);

console.log(`\n> ${question}  (streaming, one chunk per committed block)`);
const stream = await client.chat.completions.create({
  model,
  messages: [{ role: "user", content: question }],
  max_tokens: 48,
  temperature: 0,
  stream: true,
  stream_options: { include_usage: true },
});
for await (const chunk of stream) {
  const delta = chunk.choices[0]?.delta ?? {};
  const parts = [];
  if (delta.role) parts.push(`role=${delta.role}`);
  if (delta.reasoning_content) parts.push(`reasoning=${JSON.stringify(delta.reasoning_content)}`);
  if (delta.content) parts.push(`content=${JSON.stringify(delta.content)}`);
  if (chunk.choices[0]?.finish_reason) parts.push(`finish_reason=${chunk.choices[0].finish_reason}`);
  if (chunk.usage) parts.push(`usage=${JSON.stringify(chunk.usage)}`);
  if (parts.length > 0) console.log(`  chunk: ${parts.join(" ")}`);
}
