// Reading a finished server-sent-events body of the OpenAI stream format: every `data:` event's JSON, whether the
// `[DONE]` event came, and the starts of events that were not JSON. The events are framed by eval's SseDecoder.

import { SseDecoder } from "../eval/sse.js";

export interface StreamEvents {
  chunks: unknown[];
  done: boolean;
  malformed: string[];
}

export function parseEvents(text: string): StreamEvents {
  const result: StreamEvents = { chunks: [], done: false, malformed: [] };
  const decoder = new SseDecoder();
  for (const payload of [...decoder.push(text), ...decoder.end()]) {
    // As the probes have read them: leading white space dropped, empty events passed over.
    const data = payload.trimStart();
    if (!data) continue;
    if (data === "[DONE]") {
      result.done = true;
      continue;
    }
    try {
      result.chunks.push(JSON.parse(data));
    } catch {
      result.malformed.push(data.slice(0, 80));
    }
  }
  return result;
}
