// Which packages and files the packed folder's node_modules keeps: the import graph of the compiled CLI for
// the commands a folder runs, and the pruning of a real (arborist-loaded) node_modules tree, where a file
// that code names survives whatever its folder is called.
import Arborist from "@npmcli/arborist";
import { existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";

import { afterAll, beforeAll, describe, expect, it } from "vitest";

import { FOLDER_COMMANDS, importGraph } from "../pack/import-graph.js";
import { pruneModules } from "../pack/prune-modules.js";
import { ensureDistFresh } from "./pack-build.js";
import { ROOT } from "./server-harness.js";

const work = mkdtempSync(join(tmpdir(), "a2d-pack-prune-"));
afterAll(() => rmSync(work, { recursive: true, force: true }));

describe("the import graph of the compiled CLI", () => {
  beforeAll(() => ensureDistFresh());

  it("reaches the server's and the start checks' packages, and the packer's only when pack runs", async () => {
    expect(FOLDER_COMMANDS).toEqual(["serve", "verify", "simulate-startup", "selfcheck"]);
    const folder = await importGraph(join(ROOT, "dist"));
    for (const name of ["fastify", "pino", "@huggingface/tokenizers", "@huggingface/jinja", "@fastify/type-provider-typebox", "commander", "cli-progress"]) {
      expect(folder.packages, name).toContain(name);
    }
    for (const name of ["execa", "undici"]) expect(folder.packages, name).toContain(name); // simulate-startup, selfcheck
    for (const name of ["@npmcli/arborist", "pacote", "tar"]) expect(folder.packages, name).not.toContain(name);
    expect(folder.files).toContain("server/server.js");
    expect(folder.files).toContain("pack/manifest.js"); // verify
    expect(folder.files).not.toContain("pack/pack.js");

    const packing = await importGraph(join(ROOT, "dist"), undefined, [...FOLDER_COMMANDS, "pack"]);
    for (const name of ["@npmcli/arborist", "pacote", "tar"]) expect(packing.packages, name).toContain(name);
  });
});

describe("pruning node_modules", () => {
  function write(path: string, text: string): void {
    mkdirSync(dirname(path), { recursive: true });
    writeFileSync(path, text);
  }

  it("keeps what is imported and its dependencies, drops the rest, tests, docs and maps, but never a file code names", async () => {
    const app = join(work, "app");
    const pkg = (name: string, extra: Record<string, unknown> = {}) => JSON.stringify({ name, version: "1.0.0", ...extra });
    write(join(app, "package.json"), pkg("app", { dependencies: { served: "1.0.0", packer: "1.0.0" } }));
    const m = join(app, "node_modules");
    // served: its entry point lives in docs/, its core reads its README at run time; it depends on helper.
    write(join(m, "served/package.json"), pkg("served", { main: "docs/index.js", dependencies: { helper: "1.0.0" } }));
    write(join(m, "served/docs/index.js"), 'module.exports = require("../lib/core");');
    write(join(m, "served/lib/core.js"), 'module.exports = require("fs").readFileSync(require.resolve("../README.md"), "utf8");');
    write(join(m, "served/lib/core.js.map"), "{}");
    write(join(m, "served/lib/core.d.ts"), "export {};");
    write(join(m, "served/README.md"), "# served, read at run time");
    write(join(m, "served/CHANGELOG.md"), "# changes");
    write(join(m, "served/LICENSE.md"), "MIT");
    write(join(m, "served/test/core.test.js"), 'require("./fixtures/x");');
    write(join(m, "served/test/fixtures/x.js"), "");
    write(join(m, "helper/package.json"), pkg("helper"));
    write(join(m, "helper/index.js"), "module.exports = 2;");
    write(join(m, "helper/.github/workflows/ci.yml"), "on: push");
    // packer: a production dependency no folder command imports, with a scoped one of its own.
    write(join(m, "packer/package.json"), pkg("packer", { dependencies: { "@scope/tool": "1.0.0" } }));
    write(join(m, "packer/index.js"), "");
    write(join(m, "@scope/tool/package.json"), pkg("@scope/tool"));
    write(join(m, "@scope/tool/index.js"), "");

    const tree = await new Arborist({ path: app }).loadActual();
    const result = await pruneModules(app, tree, new Set(["served"]));
    expect(result).toMatchObject({ packagesBefore: 4, packagesKept: 2, removedPackages: ["node_modules/@scope/tool", "node_modules/packer"] });
    const kept = (rel: string) => existsSync(join(m, rel));
    for (const rel of ["served/docs/index.js", "served/lib/core.js", "served/README.md", "served/LICENSE.md", "helper/index.js"]) expect(kept(rel), rel).toBe(true);
    for (const rel of ["packer", "@scope", "served/test", "served/CHANGELOG.md", "served/lib/core.js.map", "served/lib/core.d.ts", "helper/.github"]) expect(kept(rel), rel).toBe(false);
    expect(result.after.files).toBeLessThan(result.before.files);

    await expect(pruneModules(app, tree, new Set(["not-listed"]))).rejects.toThrow(/imports not-listed, but package.json does not list it in dependencies/);
  });
});
