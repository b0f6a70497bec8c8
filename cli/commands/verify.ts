// `a2d verify DIR`: re-hash a packed folder against its MANIFEST.json and name every missing, extra or
// changed file. Exit 1 on any difference.
import type { Command } from "commander";

import { verifyFolder } from "../../pack/manifest.js";

export function register(program: Command): void {
  program
    .command("verify")
    .description("Check a packed folder against its MANIFEST.json")
    .argument("<dir>", "folder made by `a2d pack`")
    .option("--json", "print the result as JSON")
    .action(async (dir: string, flags: { json?: boolean }) => {
      const result = await verifyFolder(dir);
      if (flags.json) {
        process.stdout.write(`${JSON.stringify(result, null, 2)}\n`);
      } else {
        for (const path of result.missing) process.stdout.write(`missing  ${path}\n`);
        for (const path of result.extra) process.stdout.write(`extra    ${path}\n`);
        for (const change of result.changed) process.stdout.write(`changed  ${change.path}: ${change.reason}\n`);
        process.stdout.write(
          result.ok
            ? `ok: ${result.checked} files match MANIFEST.json\n`
            : `FAILED: ${result.missing.length} missing, ${result.extra.length} extra, ${result.changed.length} changed of ${result.checked} files\n`,
        );
      }
      if (!result.ok) process.exitCode = 1;
    });
}
