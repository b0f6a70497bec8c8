// Readers for the published file layouts, with errors that name the file, the row and the fix.
import { createReadStream } from "node:fs";
import { createInterface } from "node:readline";

export type Row = Record<string, unknown>;

/** The objects of a JSON-lines file; blank lines are skipped. */
export async function readJsonl(file: string): Promise<Row[]> {
  const rows: Row[] = [];
  const lines = createInterface({ input: createReadStream(file, "utf8"), crlfDelay: Infinity });
  let lineNumber = 0;
  try {
    for await (const line of lines) {
      lineNumber += 1;
      if (line.trim() === "") continue;
      let value: unknown;
      try {
        value = JSON.parse(line);
      } catch (error) {
        throw new Error(`${file}:${lineNumber}: not valid JSON (${(error as Error).message}); each line must be one JSON object`);
      }
      if (typeof value !== "object" || value === null || Array.isArray(value)) {
        throw new Error(`${file}:${lineNumber}: each line must be one JSON object`);
      }
      rows.push(value as Row);
    }
  } finally {
    lines.close();
  }
  return rows;
}

/** A required string field; `where` names the file and row for the error. */
export function stringField(row: Row, field: string, where: string): string {
  const value = row[field];
  if (typeof value !== "string") {
    throw new Error(`${where}: field "${field}" must be a string, found ${value === undefined ? "nothing" : typeof value}`);
  }
  return value;
}

/** An optional id field (string or number), else the 1-based row number. */
export function idField(row: Row, field: string, rowNumber: number): string {
  const value = row[field];
  return typeof value === "string" || typeof value === "number" || typeof value === "bigint" ? String(value) : String(rowNumber);
}
