// The server's logger keeps credentials out of the log (model-free; test/server-http.test.ts checks the
// log of a real `a2d serve`).
import { Writable } from "node:stream";

import { describe, expect, it } from "vitest";

import { redactUrl, serverLogger } from "../server/log.js";

describe("redactUrl", () => {
  it.each([
    ["/v1/models", "/v1/models"],
    ["/v1/models?x=1", "/v1/models?x=1"],
    ["/v1/models?api_key=s", "/v1/models?api_key=[redacted]"],
    ["/v1/models?key=s&x=1", "/v1/models?key=[redacted]&x=1"],
    ["/v1/models?x=1&KEY=s&key=t", "/v1/models?x=1&KEY=[redacted]&key=[redacted]"],
    ["/v1/models?%61pi_%4Bey=s", "/v1/models?%61pi_%4Bey=[redacted]"],
    ["/v1/models?apikey=s&api-key=t&access_token=u", "/v1/models?apikey=[redacted]&api-key=[redacted]&access_token=[redacted]"],
    ["/v1/models?key", "/v1/models?key=[redacted]"],
    ["/v1/models?monkey=s&key_id=t", "/v1/models?monkey=s&key_id=t"],
    ["/v1/models#x?key=s", "/v1/models#x?key=[redacted]"],
  ])("%s", (url, redacted) => {
    expect(redactUrl(url)).toBe(redacted);
  });
});

describe("serverLogger", () => {
  it("writes no credential from a request's URL or from logged headers, at any level", () => {
    const lines: string[] = [];
    const sink = new Writable({
      write(chunk: Buffer, _encoding, done) {
        lines.push(chunk.toString());
        done();
      },
    });
    const log = serverLogger("trace", sink);
    const request = { method: "GET", url: "/v1/models?api_key=s1", host: "x", ip: "127.0.0.1", headers: { authorization: "Bearer s2" } };
    log.info({ req: request }, "incoming request");
    log.trace({ headers: { authorization: "Bearer s3", "x-api-key": "s4", accept: "*/*" } }, "headers");
    log.child({ reqId: "r" }).debug({ res: { headers: { authorization: "Bearer s5" } } }, "nested");
    const text = lines.join("");
    for (const secret of ["s1", "s2", "s3", "s4", "s5"]) expect(text).not.toMatch(new RegExp(`\\b${secret}\\b`));
    expect(text).toContain('"url":"/v1/models?api_key=[redacted]"');
    expect(text).toContain('"accept":"*/*"');
    expect(lines).toHaveLength(3);
  });
});
