// Every error the server answers with comes from this one registry of named codes, rendered in OpenAI's
// shape: {"error": {"message", "type", "param", "code"}}.
import type { FastifyError, FastifyReply, FastifyRequest } from "fastify";

import { InvalidDecodeParamError } from "../engine/index.js";

interface ErrorKind {
  status: number;
  type: string;
}

/** Named error codes; the name is also the `code` field clients see. Types follow OpenAI's. */
export const ERRORS = {
  malformed_request: { status: 400, type: "invalid_request_error" },
  invalid_json: { status: 400, type: "invalid_request_error" },
  invalid_request: { status: 400, type: "invalid_request_error" },
  invalid_type: { status: 400, type: "invalid_request_error" },
  invalid_value: { status: 400, type: "invalid_request_error" },
  missing_required_parameter: { status: 400, type: "invalid_request_error" },
  unsupported_parameter: { status: 400, type: "invalid_request_error" },
  unsupported_value: { status: 400, type: "invalid_request_error" },
  unsupported_content: { status: 400, type: "invalid_request_error" },
  context_length_exceeded: { status: 400, type: "invalid_request_error" },
  invalid_api_key: { status: 401, type: "invalid_request_error" },
  not_found: { status: 404, type: "invalid_request_error" },
  uri_too_long: { status: 414, type: "invalid_request_error" },
  model_not_found: { status: 404, type: "invalid_request_error" },
  method_not_allowed: { status: 405, type: "invalid_request_error" },
  request_timeout: { status: 408, type: "invalid_request_error" },
  payload_too_large: { status: 413, type: "invalid_request_error" },
  unsupported_media_type: { status: 415, type: "invalid_request_error" },
  expectation_failed: { status: 417, type: "invalid_request_error" },
  headers_too_large: { status: 431, type: "invalid_request_error" },
  rate_limit_exceeded: { status: 429, type: "requests" },
  internal_error: { status: 500, type: "server_error" },
  model_loading: { status: 503, type: "server_error" },
  shutting_down: { status: 503, type: "server_error" },
} as const satisfies Record<string, ErrorKind>;

export type ErrorCode = keyof typeof ERRORS;

export interface OpenAIErrorBody {
  error: { message: string; type: string; param: string | null; code: ErrorCode };
}

export class ApiError extends Error {
  readonly status: number;

  constructor(
    readonly code: ErrorCode,
    message: string,
    readonly param: string | null = null,
    /** Extra response headers (Retry-After for 429, say). */
    readonly headers: Readonly<Record<string, string>> = {},
  ) {
    super(message);
    this.status = ERRORS[code].status;
  }

  body(): OpenAIErrorBody {
    return { error: { message: this.message, type: ERRORS[this.code].type, param: this.param, code: this.code } };
  }
}

export function sendError(reply: FastifyReply, error: ApiError): FastifyReply {
  return reply.code(error.status).headers(error.headers).send(error.body());
}

export function payloadTooLarge(bodyLimit: number): ApiError {
  return new ApiError("payload_too_large", `The request body is larger than this server's limit of ${bodyLimit} bytes (a2d serve --body-limit).`);
}

/** One Ajv error as fastify hands it over (only the fields used here). */
interface ValidationIssue {
  keyword: string;
  instancePath: string;
  message?: string;
  params: Record<string, unknown>;
  parentSchema?: { description?: string };
}

/**
 * Maps whatever fastify or a route threw to an ApiError: schema failures name the offending field as
 * `param` (OpenAI writes `messages[0].content`), body-parser failures get their own codes, and anything
 * unexpected is a 500 whose detail goes to the log, not the client.
 */
export function toApiError(error: FastifyError | ApiError | Error, request: FastifyRequest): ApiError {
  if (error instanceof ApiError) return error;
  // The engine re-checks every decoding parameter; a value that got past the schema is still the client's.
  if (error instanceof InvalidDecodeParamError) {
    // The engine names its parameters in camelCase (maxTokens); the API in snake_case (max_tokens).
    const param = ["params", "promptIds"].includes(error.param) ? null : error.param.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`);
    return new ApiError("invalid_value", error.message, param);
  }
  const fastifyError = error as FastifyError;
  if (fastifyError.validation) return fromValidation(fastifyError.validation as unknown as ValidationIssue[]);
  switch (fastifyError.code) {
    case "FST_ERR_CTP_INVALID_JSON_BODY":
    case "FST_ERR_CTP_EMPTY_JSON_BODY":
      return new ApiError("invalid_json", `The request body is not valid JSON: ${error.message}`);
    case "FST_ERR_CTP_BODY_TOO_LARGE":
      return payloadTooLarge(request.routeOptions.bodyLimit);
    case "FST_ERR_BAD_URL":
      return new ApiError("malformed_request", "The request path is not a valid URL: every '%' must start a %XX escape.");
    case "FST_ERR_MAX_PARAM_LENGTH":
      return new ApiError("uri_too_long", "A segment of the request path is too long.");
    case "FST_ERR_CTP_INVALID_MEDIA_TYPE":
    case "FST_ERR_CTP_INVALID_CONTENT_LENGTH":
      return new ApiError("unsupported_media_type", "Send the request body as JSON with Content-Type: application/json.");
  }
  // Body-parser syntax errors arrive as plain SyntaxErrors with a 400 status.
  if (error instanceof SyntaxError || fastifyError.statusCode === 400) {
    return new ApiError("invalid_json", `The request body is not valid JSON: ${error.message}`);
  }
  request.log.error({ err: error }, "unexpected error");
  return new ApiError("internal_error", "The server had an error while processing the request.");
}

function fromValidation(issues: ValidationIssue[]): ApiError {
  // Ajv lists the failed branches of a union before the union itself; the union's own description says
  // what the field may be, which reads better than "must be string" from one branch.
  const issue = issues.find((candidate) => candidate.keyword === "anyOf") ?? issues[0]!;
  const param = paramOf(issue);
  const field = param ?? "the request body";
  switch (issue.keyword) {
    case "required":
      return new ApiError("missing_required_parameter", `Missing required parameter: '${param}'.`, param);
    case "type":
      return new ApiError("invalid_type", `Invalid type for '${field}': expected ${String(issue.params.type)}.`, param);
    case "anyOf":
      return new ApiError(
        "invalid_type",
        `Invalid type for '${field}': expected ${issue.parentSchema?.description ?? "another type"}.`,
        param,
      );
    case "enum":
      return new ApiError(
        "invalid_value",
        `Invalid value for '${field}': must be one of ${(issue.params.allowedValues as unknown[]).map((v) => JSON.stringify(v)).join(", ")}.`,
        param,
      );
    default:
      return new ApiError("invalid_value", `Invalid value for '${field}': ${issue.message ?? "not allowed"}.`, param);
  }
}

/** Ajv's JSON pointer (/messages/0/content) in OpenAI's notation (messages[0].content). */
function paramOf(issue: ValidationIssue): string | null {
  const segments = issue.instancePath.split("/").slice(1);
  if (issue.keyword === "required") segments.push(String(issue.params.missingProperty));
  if (segments.length === 0) return null;
  return segments.reduce((path, segment) => (/^\d+$/.test(segment) ? `${path}[${segment}]` : path ? `${path}.${segment}` : segment), "");
}
