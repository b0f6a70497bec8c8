// The HTTP edge of `a2d serve`, byte for byte on raw sockets (test/server-fuzz.ts, exchange): the API key
// on every spelling of a /v1 path the router accepts, request lines and headers that only a raw socket can
// send, body and request time limits, and /health staying responsive while a large body is tokenized.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

import { afterAll, beforeAll, describe, expect, it } from "vitest";

import { exchange, isOpenAIError, type RawResponse } from "./server-fuzz.js";
import { makeTinyModel, type ServerProcess, startServer } from "./server-harness.js";

const work = mkdtempSync(join(tmpdir(), "a2d-server-http-"));
const KEY = "k-http";
let model: string;
let server: ServerProcess;
let url: string;
let host: string;

beforeAll(async () => {
  model = makeTinyModel(join(work, "tiny"), ["--seed", "8", "--layers", "2", "--hidden", "64"]);
  server = startServer(model, ["--model-name", "tiny", "--max-context", "256", "--request-timeout", "1"], { A2D_API_KEY: KEY });
  url = await server.url();
  host = new URL(url).host;
  await server.waitForLog("ready");
});

afterAll(async () => {
  expect(await server?.stop()).toBe(0);
  rmSync(work, { recursive: true, force: true });
});

const chatBody = JSON.stringify({ messages: [{ role: "user", content: "hi" }], max_tokens: 4 });

/** A request with exactly this request target; a body goes with POST. */
function request(method: string, target: string, headers: string[] = [], body = ""): string {
  const lines = [`${method} ${target} HTTP/1.1`, `Host: ${host}`, ...headers, "Connection: close"];
  if (method === "POST") lines.push("Content-Type: application/json", `Content-Length: ${Buffer.byteLength(body)}`);
  return `${lines.join("\r\n")}\r\n\r\n${body}`;
}

async function answer(bytes: string | Buffer): Promise<RawResponse> {
  const { response, hung } = await exchange(url, bytes);
  expect(hung, String(bytes).slice(0, 120)).toBe(false);
  expect(response, String(bytes).slice(0, 120)).not.toBeNull();
  return response!;
}

function errorOf(response: RawResponse): { code: string; message: string } {
  const body = JSON.parse(response.body) as unknown;
  expect(isOpenAIError(body), response.body).toBe(true);
  return (body as { error: { code: string; message: string } }).error;
}

describe("the API key", () => {
  // Spellings the router takes to a /v1 route: without the key each is a 401, with it a 200.
  const completionBody = JSON.stringify({ prompt: "hi", max_tokens: 4 });
  const routed: Array<[string, string, string]> = [
    ["GET", "/v1/models", ""],
    ["GET", "/%76%31/models", ""],
    ["GET", "/%761/models", ""],
    ["GET", "/v%31/models", ""],
    ["GET", "/v1/%6dodels", ""],
    ["GET", "/v1/models/%74iny", ""],
    ["GET", "/v1/models?x=1", ""],
    ["GET", "/v1/models/tiny#fragment", ""],
    ["POST", "/%76%31/chat/completions", chatBody],
    ["POST", "/v1/chat/%63ompletions", chatBody],
    ["POST", "/%76%31/completions", completionBody],
  ];

  it("is wanted on every spelling of a /v1 path that reaches a route, absolute-form request lines included", async () => {
    // (A fragment is not allowed in an absolute-form target: Node refuses those with a 400.)
    const targets = routed.flatMap(([method, path, body]): Array<[string, string, string]> =>
      path.includes("#")
        ? [[method, path, body]]
        : [[method, path, body], [method, `http://${host}${path}`, body], [method, `http://elsewhere.example${path}`, body]],
    );
    for (const [method, target, body] of targets) {
      const withoutKey = await answer(request(method, target, [], body));
      expect(withoutKey.status, `${method} ${target}`).toBe(401);
      expect(errorOf(withoutKey).code).toBe("invalid_api_key");
      const wrongKey = await answer(request(method, target, ["Authorization: Bearer nope"], body));
      expect(wrongKey.status, `${method} ${target}`).toBe(401);
      const withKey = await answer(request(method, target, [`Authorization: Bearer ${KEY}`], body));
      expect(withKey.status, `${method} ${target} with the key: ${withKey.body}`).toBe(200);
    }
  });

  it("refuses a request carrying two different credentials with 400, whichever comes first", async () => {
    // Node keeps the first Authorization header in request.headers; a proxy may check the other one.
    for (const [first, second] of [[KEY, "nope"], ["nope", KEY]]) {
      for (const [method, body] of [["GET", ""], ["POST", chatBody]] as const) {
        const target = method === "GET" ? "/v1/models" : "/v1/chat/completions";
        const response = await answer(request(method, target, [`Authorization: Bearer ${first}`, `authorization: Bearer ${second}`], body));
        expect(response.status, `${method} ${first}, ${second}`).toBe(400);
        const error = errorOf(response);
        expect(error.code).toBe("malformed_request");
        expect(error.message).toContain("Authorization");
      }
    }
    // The same credential twice is one credential.
    const twice = await answer(request("GET", "/v1/models", [`Authorization: Bearer ${KEY}`, `AUTHORIZATION: Bearer ${KEY}`]));
    expect(twice.status).toBe(200);
  });

  it("is wanted on HEAD too, and no other spelling, case or method reaches a route without it", async () => {
    const head = await answer(request("HEAD", "/%76%31/models"));
    expect(head.status).toBe(401);
    expect(head.body).toBe("");
    expect((await answer(request("HEAD", "/v1/models", [`Authorization: Bearer ${KEY}`]))).status).toBe(200);
    const others = [
      "//v1/models", "/v1//models", "/V1/models", "/v1/Models", "/v1/models/", "/./v1/models", "/v1/./models", "/x/../v1/models",
      "/v1/x/../models", "/%2e%2e/v1/models", "/v1%2Fmodels", "/%2Fv1/models", "/v1/chat/completions/", "/v1/chat%2Fcompletions",
    ];
    for (const method of ["GET", "POST", "OPTIONS", "PUT", "DELETE"]) {
      for (const target of others) {
        const response = await answer(request(method, target, [], method === "POST" ? chatBody : ""));
        expect(response.status, `${method} ${target}: ${response.body}`).toBeGreaterThanOrEqual(400);
        expect(response.status, `${method} ${target}`).toBeLessThan(500);
        errorOf(response);
      }
    }
    // /health needs no key, however spelled.
    expect((await answer(request("GET", "/%68ealth"))).status).toBe(200);
  });
});

describe("what Node would answer by itself comes in OpenAI's error shape", () => {
  const cases: Array<[string, string | Buffer, number, string]> = [
    ["no Host header", `GET /v1/models HTTP/1.1\r\nAuthorization: Bearer ${KEY}\r\nConnection: close\r\n\r\n`, 400, "malformed_request"],
    ["a request line that is not HTTP", "HELLO THERE\r\n\r\n", 400, "malformed_request"],
    ["an HTTP/2 preface", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 400, "malformed_request"],
    ["a control byte in the path", `GET /v1/\x01 HTTP/1.1\r\nHost: x\r\n\r\n`, 400, "malformed_request"],
    ["a header without a colon", `GET /health HTTP/1.1\r\nHost: x\r\nbroken\r\n\r\n`, 400, "malformed_request"],
    ["a bad chunk size", `POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Type: application/json\r\n\r\nzz\r\n`, 400, "malformed_request"],
    ["Content-Length and chunked together", `POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n0\r\n\r\n`, 400, "malformed_request"],
    ["20 kB of headers", `GET /health HTTP/1.1\r\nHost: x\r\nX-Pad: ${"a".repeat(20_000)}\r\n\r\n`, 431, "headers_too_large"],
    ["an Expect header it cannot meet", `POST /v1/completions HTTP/1.1\r\nHost: x\r\nExpect: teapot\r\nContent-Length: 2\r\n\r\n{}`, 417, "expectation_failed"],
    ["a '%' that starts no escape", `GET /v1/%zz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n`, 400, "malformed_request"],
    ["a path segment past the router's limit", `GET /v1/models/${"a".repeat(500)} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${KEY}\r\nConnection: close\r\n\r\n`, 414, "uri_too_long"],
  ];

  it.each(cases)("%s", async (_name, bytes, status, code) => {
    const response = await answer(bytes);
    expect(response.status).toBe(status);
    expect(errorOf(response).code).toBe(code);
  });

  it("HTTP/1.0 needs no Host", async () => {
    const response = await answer("GET /health HTTP/1.0\r\n\r\n");
    expect(response.status).toBe(200);
  });

  it("answers a request whose body stops coming with 408 once --request-timeout (1 s) has passed", async () => {
    const partial = `POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nAuthorization: Bearer ${KEY}\r\nContent-Length: 500\r\n\r\n{"messages":`;
    const { response, hung, ms } = await exchange(url, partial, 10_000);
    expect(hung).toBe(false);
    expect(response!.status).toBe(408);
    expect(errorOf(response!).code).toBe("request_timeout");
    // Node looks for late requests once a second here, so the answer comes 1-2 s in.
    expect(ms).toBeGreaterThan(900);
    expect(ms).toBeLessThan(4000);
    // Headers that never end are timed out alike.
    const { response: headers } = await exchange(url, "GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: 1\r\n", 10_000);
    expect(headers!.status).toBe(408);
  });
});

describe("the log", () => {
  it("holds no credential: query api_key or key, Authorization, x-api-key", async () => {
    const secrets = ["q-secret-1", "q-secret-2", "q-secret-3", "q-secret-4", "h-secret-5", "h-secret-6"];
    const sent = [
      request("GET", `/v1/models?api_key=${secrets[0]}`, [`Authorization: Bearer ${KEY}`]),
      request("GET", `/v1/models?x=1&key=${secrets[1]}&y=2`),
      request("GET", `/%76%31/models?%61pi_%6Bey=${secrets[2]}`),
      request("GET", `/nowhere?API_KEY=${secrets[3]}`),
      request("GET", "/v1/models", [`Authorization: Bearer ${secrets[4]}`, `x-api-key: ${secrets[5]}`]),
      request("POST", `/v1/chat/completions?key=${KEY}`, [`Authorization: Bearer ${KEY}`], chatBody),
      request("GET", "/v1/models?last=1"),
    ];
    for (const bytes of sent) await answer(bytes);
    const deadline = Date.now() + 5000;
    while (!server.logs.some((line) => JSON.stringify(line).includes("last=1")) && Date.now() < deadline) {
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    const text = server.logs.map((line) => JSON.stringify(line)).join("\n");
    for (const secret of [...secrets, KEY]) expect(text).not.toContain(secret);
    // The URLs are still there, with their credentials replaced.
    expect(text).toContain("/v1/models?api_key=[redacted]");
    expect(text).toContain("/v1/models?x=1&key=[redacted]&y=2");
    expect(text).toContain("/%76%31/models?%61pi_%6Bey=[redacted]");
  });
});

describe("request bodies", () => {
  it("refuses a body over the 2 MiB default limit with 413, naming the limit and the flag, also while the client still sends", async () => {
    // 12 MB is still on its way when the answer is ready: the server reads it off before answering, as
    // closing with data unread would reset the connection and lose the answer.
    for (const megabytes of [3, 12]) {
      const body = JSON.stringify({ messages: [{ role: "user", content: "x".repeat(megabytes * 1024 * 1024) }] });
      const response = await answer(request("POST", "/v1/chat/completions", [`Authorization: Bearer ${KEY}`], body));
      expect(response.status).toBe(413);
      const error = errorOf(response);
      expect(error.code).toBe("payload_too_large");
      expect(error.message).toContain(String(2 * 1024 * 1024));
      expect(error.message).toContain("--body-limit");
    }
  });

  it("keeps refusing a chunked body that streams past the limit with 413", async () => {
    const text = JSON.stringify({ messages: [{ role: "user", content: "x".repeat(3 * 1024 * 1024) }] });
    const chunks = [];
    for (let at = 0; at < text.length; at += 64 * 1024) {
      const part = text.slice(at, at + 64 * 1024);
      chunks.push(`${Buffer.byteLength(part).toString(16)}\r\n${part}\r\n`);
    }
    const head = `POST /v1/chat/completions HTTP/1.1\r\nHost: ${host}\r\nAuthorization: Bearer ${KEY}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n`;
    const response = await answer(`${head}${chunks.join("")}0\r\n\r\n`);
    expect(response.status).toBe(413);
    expect(errorOf(response).code).toBe("payload_too_large");
  });

  /** Headers that declare a body of `length` bytes, then `body` (all of what is sent of it). */
  function declared(length: number, headers: string[], body = ""): string {
    const lines = ["POST /v1/chat/completions HTTP/1.1", `Host: ${host}`, "Content-Type: application/json", ...headers, `Content-Length: ${length}`];
    return `${lines.join("\r\n")}\r\n\r\n${body}`;
  }

  it("refuses a Content-Length over the limit at once, with or without the key, before reading the body", async () => {
    for (const length of [3_000_000, 99_999_999_999]) {
      for (const headers of [[`Authorization: Bearer ${KEY}`], []]) {
        const { response, hung, ms } = await exchange(url, declared(length, headers, '{"messages":'), 10_000);
        expect(hung).toBe(false);
        expect(response!.status, `${length} ${headers.join()}`).toBe(413);
        const error = errorOf(response!);
        expect(error.code).toBe("payload_too_large");
        expect(error.message).toContain(String(2 * 1024 * 1024));
        expect(response!.headers.connection).toBe("close");
        // Not a wait for a body that is not coming (the 408 after --request-timeout, 1 s here).
        expect(ms, `${length} ${headers.join()}`).toBeLessThan(500);
      }
    }
  });

  it("sends no 100 Continue for a declared body over the limit, and one for a body within it", async () => {
    const big = await exchange(url, declared(100 * 1024 ** 3, [`Authorization: Bearer ${KEY}`, "Expect: 100-continue"]), 10_000);
    expect(big.hung).toBe(false);
    expect(big.raw).not.toContain("100 Continue");
    expect(big.response!.status).toBe(413);
    expect(errorOf(big.response!).code).toBe("payload_too_large");
    expect(big.ms).toBeLessThan(500);

    const small = await exchange(url, request("POST", "/v1/chat/completions", [`Authorization: Bearer ${KEY}`, "Expect: 100-continue"], chatBody));
    expect(small.raw.startsWith("HTTP/1.1 100 Continue\r\n\r\n")).toBe(true);
    expect(small.response!.status).toBe(200);
  });

  it("keeps /health answering while a body near the limit is tokenized", async () => {
    // 1.9 MB of text: about a second of tokenizing, then a 400 (it is far longer than the context).
    const body = JSON.stringify({ messages: [{ role: "user", content: "many words ".repeat(180_000) }] });
    const big = exchange(url, request("POST", "/v1/chat/completions", [`Authorization: Bearer ${KEY}`], body), 60_000);
    let done = false;
    void big.then(() => (done = true));
    const latencies: number[] = [];
    while (!done) {
      const started = performance.now();
      expect((await fetch(`${url}/health`)).status).toBe(200);
      latencies.push(performance.now() - started);
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
    const { response, ms } = await big;
    expect(response!.status).toBe(400);
    expect(errorOf(response!).code).toBe("context_length_exceeded");
    expect(ms, "the big request took too little time to show anything").toBeGreaterThan(300);
    // Tokenized on the main thread, this body held /health for about 2.5 s on the 2-core test machine.
    expect(latencies.length).toBeGreaterThan(5);
    expect(Math.max(...latencies)).toBeLessThan(600);
  });

  it("takes its limit from --body-limit", async () => {
    const small = startServer(model, ["--body-limit", "10000"]);
    try {
      const smallUrl = await small.url();
      await small.waitForLog("ready");
      const body = JSON.stringify({ messages: [{ role: "user", content: "x".repeat(20_000) }] });
      const response = await fetch(`${smallUrl}/v1/chat/completions`, { method: "POST", headers: { "content-type": "application/json" }, body });
      expect(response.status).toBe(413);
      expect(((await response.json()) as { error: { message: string } }).error.message).toContain("10000 bytes");
    } finally {
      expect(await small.stop()).toBe(0);
    }
  });
});
