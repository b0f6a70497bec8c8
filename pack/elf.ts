// What an ELF file asks of the machine that loads it: the libraries it names (DT_NEEDED), its run-time
// search path, and the symbol versions it needs from each library (.gnu.version_r). That last list is the
// compatibility floor: a binary that needs GLIBC_2.36 fails to load on glibc 2.35 with "version
// `GLIBC_2.36' not found", whatever it does at run time. Read here directly (no binutils on a bare machine).
import { readFile } from "node:fs/promises";

export class ElfError extends Error {}

export interface ElfNeeds {
  /** DT_NEEDED sonames, in order. */
  needed: string[];
  /** DT_RUNPATH, else DT_RPATH; null when neither. */
  runpath: string | null;
  /** Required versions per library file, e.g. { "libc.so.6": ["GLIBC_2.2.5", "GLIBC_2.17"] }. */
  versions: Record<string, string[]>;
  /** Undefined dynamic symbols that are not weak and carry no version: resolved by whoever loads the file. */
  unversionedUndefined: string[];
}

const SHT_DYNAMIC = 6;
const SHT_DYNSYM = 11;
const SHT_GNU_VERNEED = 0x6ffffffe;
const SHT_GNU_VERSYM = 0x6fffffff;
const DT_NEEDED = 1;
const DT_RPATH = 15;
const DT_RUNPATH = 29;
const STB_WEAK = 2;

export function isElf(bytes: Buffer): boolean {
  return bytes.length >= 4 && bytes.readUInt32BE(0) === 0x7f454c46;
}

export function parseElfNeeds(elf: Buffer, name = "the file"): ElfNeeds {
  if (!isElf(elf)) throw new ElfError(`${name} is not an ELF file`);
  if (elf[4] !== 2 || elf[5] !== 1) throw new ElfError(`${name} is not a little-endian 64-bit ELF file`);
  const sectionOffset = Number(elf.readBigUInt64LE(0x28));
  const sectionSize = elf.readUInt16LE(0x3a);
  const sectionCount = elf.readUInt16LE(0x3c);
  const sections = Array.from({ length: sectionCount }, (_, i) => {
    const at = sectionOffset + i * sectionSize;
    return {
      type: elf.readUInt32LE(at + 4),
      offset: Number(elf.readBigUInt64LE(at + 0x18)),
      size: Number(elf.readBigUInt64LE(at + 0x20)),
      link: elf.readUInt32LE(at + 0x28),
      info: elf.readUInt32LE(at + 0x2c),
    };
  });
  const string = (table: number, offset: number) => {
    const start = sections[table]!.offset + offset;
    return elf.toString("latin1", start, elf.indexOf(0, start));
  };

  const needs: ElfNeeds = { needed: [], runpath: null, versions: {}, unversionedUndefined: [] };
  const dynamic = sections.find((s) => s.type === SHT_DYNAMIC);
  if (dynamic) {
    let rpath: string | null = null;
    for (let at = dynamic.offset; at + 16 <= dynamic.offset + dynamic.size; at += 16) {
      const tag = Number(elf.readBigInt64LE(at));
      const value = Number(elf.readBigUInt64LE(at + 8));
      if (tag === 0) break;
      if (tag === DT_NEEDED) needs.needed.push(string(dynamic.link, value));
      else if (tag === DT_RUNPATH) needs.runpath = string(dynamic.link, value);
      else if (tag === DT_RPATH) rpath = string(dynamic.link, value);
    }
    needs.runpath ??= rpath;
  }

  // Verneed: a chain of files, each with a chain of versions (vna_other is the index .gnu.version uses).
  const versionNames = new Map<number, string>();
  const verneed = sections.find((s) => s.type === SHT_GNU_VERNEED);
  if (verneed) {
    let file = verneed.offset;
    for (let i = 0; i < verneed.info; i++) {
      const count = elf.readUInt16LE(file + 2);
      const fileName = string(verneed.link, elf.readUInt32LE(file + 4));
      const list = (needs.versions[fileName] ??= []);
      let aux = file + elf.readUInt32LE(file + 8);
      for (let j = 0; j < count; j++) {
        const version = string(verneed.link, elf.readUInt32LE(aux + 8));
        versionNames.set(elf.readUInt16LE(aux + 6), version);
        if (!list.includes(version)) list.push(version);
        const next = elf.readUInt32LE(aux + 12);
        if (next === 0) break;
        aux += next;
      }
      const nextFile = elf.readUInt32LE(file + 12);
      if (nextFile === 0) break;
      file += nextFile;
    }
  }

  const dynsym = sections.find((s) => s.type === SHT_DYNSYM);
  const versym = sections.find((s) => s.type === SHT_GNU_VERSYM);
  if (dynsym) {
    const count = dynsym.size / 24;
    for (let i = 1; i < count; i++) {
      const at = dynsym.offset + i * 24;
      const info = elf[at + 4]!;
      const sectionIndex = elf.readUInt16LE(at + 6);
      if (sectionIndex !== 0 || info >> 4 === STB_WEAK) continue;
      const version = versym ? elf.readUInt16LE(versym.offset + i * 2) & 0x7fff : 0;
      if (version <= 1 || !versionNames.has(version)) needs.unversionedUndefined.push(string(dynsym.link, elf.readUInt32LE(at)));
    }
  }
  return needs;
}

export async function readElfNeeds(path: string): Promise<ElfNeeds> {
  return parseElfNeeds(await readFile(path), path);
}

/** "GLIBC_2.28" -> [2, 28]; a version name of another family -> null. */
export function versionOf(family: string, name: string): number[] | null {
  const match = new RegExp(`^${family}_(\\d+(?:\\.\\d+)*)$`).exec(name);
  return match ? match[1]!.split(".").map(Number) : null;
}

export function compareVersions(a: number[], b: number[]): number {
  for (let i = 0; i < Math.max(a.length, b.length); i++) {
    const d = (a[i] ?? 0) - (b[i] ?? 0);
    if (d !== 0) return d;
  }
  return 0;
}

/** The highest version of a family (GLIBC, GLIBCXX, CXXABI, GCC) a file needs, as "2.28"; null when none. */
export function highestVersion(needs: ElfNeeds, family: string): string | null {
  let best: number[] | null = null;
  for (const list of Object.values(needs.versions)) {
    for (const name of list) {
      const v = versionOf(family, name);
      if (v && (best === null || compareVersions(v, best) > 0)) best = v;
    }
  }
  return best?.join(".") ?? null;
}

export interface FatbinEntry {
  kind: "ptx" | "sass";
  sm: number;
}

/** The code entries of an ELF file's CUDA fat binaries (.nv_fatbin, __nv_relfatbin); null if it has none. */
export function fatbinEntries(elf: Buffer): FatbinEntry[] | null {
  if (elf.readUInt32BE(0) !== 0x7f454c46 || elf[4] !== 2) return null; // ELF64 only
  const sectionOffset = Number(elf.readBigUInt64LE(0x28));
  const sectionSize = elf.readUInt16LE(0x3a);
  const sectionCount = elf.readUInt16LE(0x3c);
  const namesIndex = elf.readUInt16LE(0x3e);
  const header = (i: number) => sectionOffset + i * sectionSize;
  const namesOffset = Number(elf.readBigUInt64LE(header(namesIndex) + 0x18));
  const entries: FatbinEntry[] = [];
  let found = false;
  for (let i = 0; i < sectionCount; i++) {
    const nameStart = namesOffset + elf.readUInt32LE(header(i));
    const name = elf.toString("latin1", nameStart, elf.indexOf(0, nameStart));
    if (name !== ".nv_fatbin" && name !== "__nv_relfatbin") continue;
    found = true;
    const start = Number(elf.readBigUInt64LE(header(i) + 0x18));
    const end = start + Number(elf.readBigUInt64LE(header(i) + 0x20));
    let container = start;
    while (container + 16 <= end) {
      const magic = elf.readUInt32LE(container);
      if (magic !== 0xba55ed50 && magic !== 0x466243b1) {
        container += 8; // containers are 8-byte aligned; padding between them is zero
        continue;
      }
      const headerSize = elf.readUInt16LE(container + 6);
      const containerEnd = container + headerSize + Number(elf.readBigUInt64LE(container + 8));
      let entry = container + headerSize;
      while (entry + 0x20 <= containerEnd) {
        const kind = elf.readUInt16LE(entry);
        const entryHeader = elf.readUInt32LE(entry + 4);
        const payload = Number(elf.readBigUInt64LE(entry + 8));
        const sm = elf.readUInt32LE(entry + 0x1c);
        if (kind === 1 || kind === 2) entries.push({ kind: kind === 1 ? "ptx" : "sass", sm });
        if (entryHeader === 0) break;
        entry += entryHeader + payload;
      }
      container = containerEnd;
    }
  }
  return found ? entries : null;
}

/** The compute capabilities (as 90 for sm_90) the file carries machine code for. */
export function sassArchitectures(elf: Buffer): number[] {
  return [...new Set((fatbinEntries(elf) ?? []).filter((e) => e.kind === "sass").map((e) => e.sm))].sort((a, b) => a - b);
}
