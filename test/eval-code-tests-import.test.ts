// The CLI imports eval/code-tests.ts for every command, so importing it must read no file: a packed
// `a2d serve` starts without eval's Python helpers. The driver is read when a test first needs it.
import { expect, it, vi } from "vitest";

vi.mock("../eval/paths.js", () => ({
  evalFile: (name: string) => `/nonexistent/a2d-eval/${name}`,
  venvPython: () => "/nonexistent/a2d-eval/.venv/bin/python",
}));

it("imports without eval's Python files and reads sandbox_driver.py on first use", async () => {
  const { runCodeTests } = await import("../eval/code-tests.js");
  await expect(
    runCodeTests("print(1)", [{ input: "", output: "1", testtype: "stdin" }], null, { python: "/usr/bin/python3" }),
  ).rejects.toThrow("/nonexistent/a2d-eval/sandbox_driver.py");
});
