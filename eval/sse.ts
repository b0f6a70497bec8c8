// Incremental Server-Sent Events decoding (the subset OpenAI-compatible servers use: `data:` fields,
// events ended by a blank line). Chunks may split lines and UTF-8 characters anywhere.
import { StringDecoder } from "node:string_decoder";

export class SseDecoder {
  private readonly utf8 = new StringDecoder("utf8");
  private pending = "";
  private dataLines: string[] = [];
  /** Comment lines seen so far (`: …`): servers send them as heartbeats while a request waits. */
  comments = 0;

  /** Feeds raw bytes; returns the data payloads of every event completed by them. */
  push(chunk: Buffer | string): string[] {
    this.pending += typeof chunk === "string" ? chunk : this.utf8.write(chunk);
    const events: string[] = [];
    let newline: number;
    while ((newline = this.pending.indexOf("\n")) >= 0) {
      const line = this.pending.slice(0, newline).replace(/\r$/, "");
      this.pending = this.pending.slice(newline + 1);
      this.takeLine(line, events);
    }
    return events;
  }

  /** Ends the stream: an event not yet closed by a blank line still counts. */
  end(): string[] {
    const events: string[] = [];
    const rest = (this.pending + this.utf8.end()).replace(/\r$/, "");
    this.pending = "";
    if (rest.length > 0) this.takeLine(rest, events);
    this.takeLine("", events);
    return events;
  }

  private takeLine(line: string, events: string[]): void {
    if (line === "") {
      if (this.dataLines.length > 0) events.push(this.dataLines.join("\n"));
      this.dataLines = [];
      return;
    }
    if (line.startsWith(":")) {
      this.comments += 1;
      return;
    }
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    if (field !== "data") return;
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    this.dataLines.push(value);
  }
}
