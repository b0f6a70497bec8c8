// `a2d selfcheck DIR | --url URL [DIR]`: start a packed folder as a user would (or use a running server) and
// check readiness, the listening address, /health, chat in the OpenAI shape (non-stream, stream, reasoning),
// that the answers are text, and single-stream speed counted with the folder's tokenizer.
import type { Command } from "commander";

import { positiveNumber } from "../parse.js";

interface SelfcheckFlags {
  url?: string;
  json?: boolean;
  budget: string;
  minTps?: string;
  maxTokens: string;
  timeout: string;
}

export function register(program: Command): void {
  program
    .command("selfcheck")
    .description("Start a packed folder's serve.sh (or use --url) and check readiness, API shapes and speed")
    .argument("[dir]", "folder made by `a2d pack` (with --url: the packed or model folder whose tokenizer counts the tokens)")
    .option("--url <url>", "check a running server instead of starting DIR, e.g. http://127.0.0.1:8000")
    .option("--json", "print the report as JSON")
    .option("--budget <seconds>", "readiness budget", "300")
    .option("--min-tps <n>", "fail below this single-stream tokens/s (default: 450 on a CUDA server, not judged on the CPU)")
    .option("--max-tokens <n>", "length of the long generation that measures tokens/s", "1024")
    .option("--timeout <seconds>", "longest wait for any one request", "120")
    .action(async (dir: string | undefined, flags: SelfcheckFlags) => {
      if (dir === undefined && flags.url === undefined) throw new Error("give a packed folder to start, or --url of a running server (and the folder, for its tokenizer)");
      const { formatSelfcheck, selfcheck } = await import("../../simulate/selfcheck.js");
      const report = await selfcheck({
        folder: flags.url === undefined ? dir : undefined,
        url: flags.url,
        tokenizerFrom: flags.url === undefined ? undefined : dir,
        budgetS: positiveNumber("--budget", flags.budget),
        minTps: flags.minTps === undefined ? undefined : Number(flags.minTps),
        maxTokens: Math.round(positiveNumber("--max-tokens", flags.maxTokens)),
        requestTimeoutS: positiveNumber("--timeout", flags.timeout),
        log: flags.json ? undefined : (line) => process.stderr.write(`${line}\n`),
      });
      process.stdout.write(flags.json ? `${JSON.stringify(report, null, 2)}\n` : `${formatSelfcheck(report)}\n`);
      if (!report.ok) process.exitCode = 1;
    });
}
