#!/usr/bin/env node
// The `a2d` command line. Each command lives in cli/commands/<name>.ts and exports register(program);
// adding a command is one import and one register call below.
import { Command } from "commander";

import { register as registerGenerate } from "./commands/generate.js";
import { register as registerGenerateBatch } from "./commands/generate-batch.js";
import { register as registerServe } from "./commands/serve.js";
import { register as registerPack } from "./commands/pack.js";
import { register as registerVerify } from "./commands/verify.js";
import { register as registerSimulateStartup } from "./commands/simulate-startup.js";
import { register as registerSelfcheck } from "./commands/selfcheck.js";
import { register as registerEval } from "./commands/eval.js";
import { register as registerBenchServe } from "./commands/bench-serve.js";
import { register as registerBench } from "./commands/bench.js";

const program = new Command();
program
  .name("a2d")
  .description("Turn an autoregressive LLM into a block-diffusion LLM and serve it offline.")
  .showHelpAfterError()
  .version("0.1.0");

registerGenerate(program);
registerGenerateBatch(program);
registerServe(program);
registerPack(program);
registerVerify(program);
registerSimulateStartup(program);
registerSelfcheck(program);
registerEval(program);
registerBenchServe(program);
registerBench(program);

program.parseAsync(process.argv).catch((error: unknown) => {
  process.stderr.write(`a2d: ${error instanceof Error ? error.message : String(error)}\n`);
  process.exit(1);
});
