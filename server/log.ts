// The server's pino logger. No credential reaches the log: in a logged URL, the value of a query
// parameter that names a key (api_key, key, ...; some clients put the key there although this server
// reads only the Authorization header) is replaced, and so are the headers that carry one wherever a
// logged object holds headers.
import { type DestinationStream, type Logger, pino } from "pino";

const REDACTED = "[redacted]";

/** Query parameter names (lower case, %XX decoded) whose values are credentials. */
const CREDENTIAL_PARAMS = new Set(["api_key", "api-key", "apikey", "key", "access_token"]);

/** `url` with the value of every credential query parameter replaced by "[redacted]". */
export function redactUrl(url: string): string {
  const query = url.indexOf("?");
  if (query === -1) return url;
  const fields = url
    .slice(query + 1)
    .split("&")
    .map((field) => {
      const name = field.split("=", 1)[0]!;
      return CREDENTIAL_PARAMS.has(decodeName(name)) ? `${name}=${REDACTED}` : field;
    });
  return `${url.slice(0, query + 1)}${fields.join("&")}`;
}

/** A query name as the application reads it: each %XX decoded alone, so that a bad escape cannot hide a name. */
function decodeName(name: string): string {
  return name.replace(/%([0-9a-fA-F]{2})/g, (_, hex: string) => String.fromCharCode(parseInt(hex, 16))).toLowerCase();
}

/** What a request line says, as fastify's own serializer writes it, with the URL redacted. */
interface LoggedRequest {
  method?: string;
  url?: string;
  host?: string;
  ip?: string;
  socket?: { remotePort?: number };
}

export function serverLogger(level: string, destination?: DestinationStream): Logger {
  return pino(
    {
      level,
      base: { service: "a2d" },
      serializers: {
        req: (request: LoggedRequest) => ({
          method: request.method,
          url: request.url === undefined ? undefined : redactUrl(request.url),
          host: request.host,
          remoteAddress: request.ip,
          remotePort: request.socket?.remotePort,
        }),
      },
      redact: {
        paths: ["headers.authorization", 'headers["x-api-key"]', "*.headers.authorization", '*.headers["x-api-key"]'],
        censor: REDACTED,
      },
    },
    destination,
  );
}
