// `a2d pack`: the model, the server, the engine and a Node runtime as one offline folder (docs/packing.md).
import type { Command } from "commander";


interface PackFlags {
  model: string;
  out: string;
  device?: string;
  node?: string;
  cpuAddon?: string;
  cudaAddon?: string;
  modelName?: string;
  withWheels?: boolean;
  wheels?: string;
  force?: boolean;
}

export function register(program: Command): void {
  program
    .command("pack")
    .description("Pack a model into one self-contained offline folder started by its serve.sh")
    .requiredOption("--model <dir>", "a2d model folder (docs/model-format.md)")
    .requiredOption("--out <dir>", "output folder (built beside it, renamed into place when complete)")
    .option("--device <device>", "cuda or cpu (default: cuda when the CUDA addon is built)")
    .option("--node <path>", "Node binary to ship (default: the one running this command)")
    .option("--cpu-addon <path>", "CPU engine addon (default: build/engine/a2d_cpu.node)")
    .option("--cuda-addon <path>", "CUDA engine addon (default: build/engine-cuda/a2d_cuda.node)")
    .option("--model-name <id>", "model id in /v1/models (default: the model folder's name)")
    .option("--with-wheels", "also ship the converter's Python wheels (wheels/)")
    .option("--wheels <dir>", "where the wheels are (default: the project's wheels/)")
    .option("--force", "replace --out if it exists")
    .action(async (flags: PackFlags) => {
      if (flags.device !== undefined && flags.device !== "cuda" && flags.device !== "cpu") {
        throw new Error(`--device must be cuda or cpu, not "${flags.device}"`);
      }
      // Loaded here, not at the top: `a2d serve` must not pay for arborist and pacote at start.
      const { formatSizeReport, pack } = await import("../../pack/pack.js");
      const started = performance.now();
      const result = await pack({
        modelDir: flags.model,
        outDir: flags.out,
        device: flags.device as "cuda" | "cpu" | undefined,
        nodeBinary: flags.node,
        cpuAddon: flags.cpuAddon,
        cudaAddon: flags.cudaAddon,
        modelName: flags.modelName,
        withWheels: flags.withWheels,
        wheelsDir: flags.wheels,
        force: flags.force,
      });
      const seconds = ((performance.now() - started) / 1000).toFixed(1);
      process.stdout.write(`\npacked ${result.outDir} (device ${result.device}) in ${seconds} s\n${formatSizeReport(result)}\n`);
      for (const warning of result.warnings) process.stdout.write(`\n!!! ${warning}\n`);
      process.stdout.write(`\nstart it:   bash ${result.outDir}/serve.sh\ncheck it:   npx a2d verify ${result.outDir}\n`);
    });
}
