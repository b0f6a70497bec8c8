import { defineConfig } from "vitest/config";

export default defineConfig({
  test: {
    include: ["test/**/*.test.ts"],
    testTimeout: 120_000,
    hookTimeout: 300_000,
    // The suites share one CPU engine build and spawn real servers; keep files serial on 2-core machines.
    fileParallelism: false,
  },
});
