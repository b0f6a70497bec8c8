// The header of a safetensors file (8-byte little-endian header length, a JSON header, then the tensor
// bytes), read without touching the tensor bytes: enough to tell a complete file from a truncated one, a
// Git LFS pointer or something else, and to read every tensor's shape. The layout is the format's own
// (https://github.com/huggingface/safetensors, "Format").
import { open } from "node:fs/promises";

export const DTYPE_BYTES: Record<string, number> = {
  BOOL: 1, U8: 1, I8: 1, F8_E4M3: 1, F8_E5M2: 1, F8_E8M0: 1,
  U16: 2, I16: 2, F16: 2, BF16: 2,
  U32: 4, I32: 4, F32: 4,
  U64: 8, I64: 8, F64: 8,
};

/** The safetensors reference refuses headers above 100 MB; a MiniCPM5-2B header is about 50 KB. */
const MAX_HEADER = 100_000_000;

export interface TensorInfo {
  dtype: string;
  shape: number[];
  /** Absolute byte range in the file. */
  begin: number;
  end: number;
}

export interface SafetensorsHeader {
  tensors: Map<string, TensorInfo>;
  /** Bytes the header says the file holds: 8 + header + the furthest tensor end. */
  expectedBytes: number;
  fileBytes: number;
}

export class SafetensorsError extends Error {}

const LFS_POINTER = /^version https:\/\/git-lfs\.github\.com\/spec\/v1\n/;

/** A Git LFS pointer (the small text file a clone without `git lfs` leaves) instead of the real file. */
export function lfsPointer(head: Buffer): { oid: string | null; size: number | null } | null {
  const text = head.toString("utf8");
  if (!LFS_POINTER.test(text)) return null;
  return {
    oid: /^oid sha256:([0-9a-f]{64})$/m.exec(text)?.[1] ?? null,
    size: Number(/^size (\d+)$/m.exec(text)?.[1] ?? NaN) || null,
  };
}

export async function readFileHead(path: string, bytes: number): Promise<{ head: Buffer; size: number }> {
  const handle = await open(path, "r");
  try {
    const size = (await handle.stat()).size;
    const head = Buffer.alloc(Math.min(bytes, size));
    await handle.read(head, 0, head.length, 0);
    return { head, size };
  } finally {
    await handle.close();
  }
}

/** Reads and checks the header; throws SafetensorsError saying what is wrong (not naming the file: callers do). */
export async function readSafetensorsHeader(path: string): Promise<SafetensorsHeader> {
  const handle = await open(path, "r");
  try {
    const fileBytes = (await handle.stat()).size;
    const prefix = Buffer.alloc(Math.min(8, fileBytes));
    await handle.read(prefix, 0, prefix.length, 0);
    if (fileBytes < 8) throw new SafetensorsError(`it is ${fileBytes} bytes long, too short for a safetensors header`);
    const headerBytes = Number(prefix.readBigUInt64LE(0));
    if (headerBytes < 2 || headerBytes > MAX_HEADER) {
      throw new SafetensorsError(`its first 8 bytes give a header of ${headerBytes} bytes, which no safetensors file has: it is not a safetensors file`);
    }
    if (8 + headerBytes > fileBytes) {
      throw new SafetensorsError(`it is truncated: its header alone needs ${8 + headerBytes} bytes, the file holds ${fileBytes}`);
    }
    const raw = Buffer.alloc(headerBytes);
    await handle.read(raw, 0, headerBytes, 8);
    let header: Record<string, unknown>;
    try {
      header = JSON.parse(raw.toString("utf8")) as Record<string, unknown>;
    } catch (error) {
      throw new SafetensorsError(`its header is not valid JSON (${(error as Error).message}): the file is damaged`);
    }
    if (typeof header !== "object" || header === null || Array.isArray(header)) throw new SafetensorsError("its header is not a JSON object: the file is damaged");
    const tensors = new Map<string, TensorInfo>();
    let dataBytes = 0;
    for (const [name, value] of Object.entries(header)) {
      if (name === "__metadata__") continue;
      const entry = value as { dtype?: unknown; shape?: unknown; data_offsets?: unknown };
      const size = typeof entry?.dtype === "string" ? DTYPE_BYTES[entry.dtype] : undefined;
      const shape = entry?.shape;
      const offsets = entry?.data_offsets;
      if (
        size === undefined ||
        !Array.isArray(shape) ||
        !shape.every((d) => Number.isSafeInteger(d) && d >= 0) ||
        !Array.isArray(offsets) ||
        offsets.length !== 2 ||
        !offsets.every((o) => Number.isSafeInteger(o) && o >= 0)
      ) {
        throw new SafetensorsError(`its header entry for ${name} is malformed (${JSON.stringify(value).slice(0, 120)}): the file is damaged`);
      }
      const [begin, end] = offsets as [number, number];
      const want = (shape as number[]).reduce((n, d) => n * d, size);
      if (end - begin !== want) {
        throw new SafetensorsError(`its header gives ${name} (${entry.dtype as string} ${JSON.stringify(shape)}, ${want} bytes) ${end - begin} bytes: the file is damaged`);
      }
      tensors.set(name, { dtype: entry.dtype as string, shape: shape as number[], begin: 8 + headerBytes + begin, end: 8 + headerBytes + end });
      dataBytes = Math.max(dataBytes, end);
    }
    const expectedBytes = 8 + headerBytes + dataBytes;
    if (fileBytes < expectedBytes) {
      throw new SafetensorsError(`it is truncated: its header describes ${expectedBytes} bytes, the file holds ${fileBytes} (${expectedBytes - fileBytes} missing)`);
    }
    if (fileBytes > expectedBytes) {
      throw new SafetensorsError(`it has ${fileBytes - expectedBytes} bytes after the last tensor its header describes (${expectedBytes} bytes): the file is damaged or two files were joined`);
    }
    return { tensors, expectedBytes, fileBytes };
  } finally {
    await handle.close();
  }
}
