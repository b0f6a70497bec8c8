// Reading a finished server-sent-events body of the OpenAI stream format: every `data:` event's JSON, whether the
// `[DONE]` event came, and the starts of events that were not JSON.

export interface StreamEvents {
  chunks: unknown[];
  done: boolean;
  malformed: string[];
}

export function parseEvents(text: string): StreamEvents {
  const result: StreamEvents = { chunks: [], done: false, malformed: [] };
  for (const event of text.split(/\r?\n\r?\n/)) {
    const data = event
      .split(/\r?\n/)
      .filter((line) => line.startsWith("data:"))
      .map((line) => line.slice(5).trimStart())
      .join("\n");
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
