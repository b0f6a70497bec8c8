// `a2d selfcheck DIR | --url URL`: start a packed folder as a user would (or use a running server) and check
// readiness, /health, chat in the OpenAI shape (non-stream, stream, reasoning) and single-stream speed.
import type { Command } from "commander";

import { positiveNumber } from "../parse.js";

interface SelfcheckFlags {
  url?: string;
  json?: boolean;
  budget: string;
  minTps?: string;
  maxTokens: string;
}

export function register(program: Command): void {
  program
    .command("selfcheck")
    .description("Start a packed folder's serve.sh (or use --url) and check readiness, API shapes and speed")
    .argument("[dir]", "folder made by `a2d pack`")
    .option("--url <url>", "check a running server instead, e.g. http://127.0.0.1:8000")
    .option("--json", "print the report as JSON")
    .option("--budget <seconds>", "readiness budget", "300")
    .option("--min-tps <n>", "fail below this single-stream tokens/s (default: 450 on a CUDA server, not judged on the CPU)")
    .option("--max-tokens <n>", "length of the long generation that measures tokens/s", "1024")
    .action(async (dir: string | undefined, flags: SelfcheckFlags) => {
      if ((dir === undefined) === (flags.url === undefined)) throw new Error("give a packed folder or --url, one of the two");
      const { formatSelfcheck, selfcheck } = await import("../../simulate/selfcheck.js");
      const report = await selfcheck({
        folder: dir,
        url: flags.url,
        budgetS: positiveNumber("--budget", flags.budget),
        minTps: flags.minTps === undefined ? undefined : Number(flags.minTps),
        maxTokens: Math.round(positiveNumber("--max-tokens", flags.maxTokens)),
        log: flags.json ? undefined : (line) => process.stderr.write(`${line}\n`),
      });
      process.stdout.write(flags.json ? `${JSON.stringify(report, null, 2)}\n` : `${formatSelfcheck(report)}\n`);
      if (!report.ok) process.exitCode = 1;
    });
}
