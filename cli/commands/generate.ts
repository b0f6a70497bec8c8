// `a2d generate`: one decode from the command line, same flags and JSON as `python -m a2d_convert generate`.
import type { Command } from "commander";

export function register(program: Command): void {
  program
    .command("generate")
    .description("Generate a completion for one prompt with the block-diffusion decoder")
    .requiredOption("--model <dir>", "model folder (docs/model-format.md)")
    .requiredOption("--prompt <text>", "prompt text")
    .action(() => {
      throw new Error("generate is not wired to the engine yet");
    });
}
