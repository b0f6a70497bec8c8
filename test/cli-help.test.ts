// Every command's --help prints its usage and exits 0 (a default commander cannot render, such as a
// BigInt, once made `a2d generate --help` crash).
import { execFileSync, spawnSync } from "node:child_process";

import { beforeAll, describe, expect, it } from "vitest";

import { CLI, ensureBuilt, ROOT } from "./server-harness.js";

beforeAll(() => ensureBuilt());

function commands(): string[] {
  const help = execFileSync("node", [CLI, "--help"], { cwd: ROOT, encoding: "utf8" });
  const listed = help.slice(help.indexOf("Commands:")).split("\n").slice(1);
  return listed.map((line) => /^ {2}([a-z][a-z-]*)/.exec(line)?.[1]).filter((name): name is string => name !== undefined && name !== "help");
}

describe("a2d <command> --help", () => {
  it("lists the commands", () => {
    expect(commands()).toEqual(expect.arrayContaining(["generate", "serve", "pack", "eval", "bench"]));
  });

  it.each(commands())("%s --help prints its usage and exits 0", (command) => {
    const done = spawnSync("node", [CLI, command, "--help"], { cwd: ROOT, encoding: "utf8" });
    expect(done.stderr).toBe("");
    expect(done.status).toBe(0);
    expect(done.stdout).toContain(`Usage: a2d ${command}`);
  });

  it("generate --help shows the seed's default as a number", () => {
    const done = spawnSync("node", [CLI, "generate", "--help"], { cwd: ROOT, encoding: "utf8" });
    expect(done.stdout).toMatch(/--seed <s>[\s\S]*\(default: 0\)/);
  });
});
