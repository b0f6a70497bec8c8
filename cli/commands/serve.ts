// `a2d serve`: the OpenAI-compatible HTTP server over one loaded model.
import type { Command } from "commander";

export function register(program: Command): void {
  program
    .command("serve")
    .description("Serve a model through an OpenAI-compatible HTTP API")
    .requiredOption("--model <dir>", "model folder (docs/model-format.md)")
    .action(() => {
      throw new Error("serve is not wired to the engine yet");
    });
}
