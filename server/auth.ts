// Optional API key: every /v1 route wants `Authorization: Bearer <key>`; /health stays open so that
// load balancers and readiness probes need no secret. The hook goes on the scope that holds the /v1
// routes (app.ts), so it runs for every request routed to one of them and for no other.
import { timingSafeEqual } from "node:crypto";

import type { App } from "./app.js";
import { ApiError } from "./errors.js";

export function requireApiKey(scope: App, apiKey: string): void {
  const expected = Buffer.from(apiKey);
  scope.addHook("onRequest", async (request) => {
    // Node keeps only the first of several Authorization headers; a proxy in front may have checked
    // another, so two that differ are refused rather than one of them picked.
    if (new Set(authorizationHeaders(request.raw.rawHeaders)).size > 1) {
      throw new ApiError("malformed_request", "The request carries two different Authorization headers; send one.");
    }
    const header = request.headers.authorization ?? "";
    const match = /^Bearer\s+(.+)$/i.exec(header);
    if (match === null) {
      throw new ApiError("invalid_api_key", "Missing API key: send it as 'Authorization: Bearer <key>'.");
    }
    const given = Buffer.from(match[1]!.trim());
    if (given.length !== expected.length || !timingSafeEqual(given, expected)) {
      throw new ApiError("invalid_api_key", "Incorrect API key provided.");
    }
  });
}

/** The values of every Authorization header, as sent (rawHeaders: name, value, name, value, ...). */
function authorizationHeaders(rawHeaders: readonly string[]): string[] {
  const values: string[] = [];
  for (let i = 0; i + 1 < rawHeaders.length; i += 2) {
    if (rawHeaders[i]!.toLowerCase() === "authorization") values.push(rawHeaders[i + 1]!.trim());
  }
  return values;
}
