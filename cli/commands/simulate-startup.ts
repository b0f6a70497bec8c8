// `a2d simulate-startup DIR`: prove a packed folder starts offline, cold and in budget (docs/cold-start.md).
import type { Command } from "commander";

import { positiveNumber } from "../parse.js";

interface SimulateFlags {
  json?: boolean;
  budget: string;
  gpu: string;
  figures?: string;
  diskMbps?: string;
  gpuRun?: boolean;
}

export function register(program: Command): void {
  program
    .command("simulate-startup")
    .description("Start a packed folder's serve.sh offline, cold and traced; name every problem; predict the GPU start time")
    .argument("<dir>", "folder made by `a2d pack`")
    .option("--json", "print the report as JSON")
    .option("--budget <seconds>", "readiness budget", "300")
    .option("--gpu <card>", "target card for the prediction: h100 (3.35 TB/s) or h200 (4.8 TB/s)", "h100")
    .option("--figures <file>", "markdown file with the a2d-startup-figures block (default: bench/NOTES.md)")
    .option("--disk-mbps <MBps>", "the target's cold disk read rate: predict the weights read at it instead of the rate measured here")
    .option("--gpu-run", "also start on this machine's GPU and time the first 200")
    .action(async (dir: string, flags: SimulateFlags) => {
      if (flags.gpu !== "h100" && flags.gpu !== "h200") throw new Error(`--gpu must be h100 or h200, not "${flags.gpu}"`);
      const { formatReport, simulateStartup } = await import("../../simulate/simulate.js");
      const report = await simulateStartup({
        folder: dir,
        budgetS: positiveNumber("--budget", flags.budget),
        gpu: flags.gpu,
        figuresPath: flags.figures,
        diskMBps: flags.diskMbps === undefined ? undefined : positiveNumber("--disk-mbps", flags.diskMbps),
        gpuRun: flags.gpuRun,
        log: flags.json ? undefined : (line) => process.stderr.write(`${line}\n`),
      });
      process.stdout.write(flags.json ? `${JSON.stringify(report, null, 2)}\n` : `${formatReport(report)}\n`);
      if (report.verdict !== "pass") process.exitCode = 1;
    });
}
