import { defineConfig } from "vitest/config";

// Two projects: `unit` (pure code next to the source, no services) and
// `integration` (real Redis + real Postgres, one database per file, run one file
// at a time because the crash tests spawn processes and this box has 2 cores).
export default defineConfig({
  test: {
    fileParallelism: false,
    projects: [
      {
        test: {
          name: "unit",
          include: ["src/**/*.test.ts", "examples/**/*.test.ts", "test/lint/**/*.test.ts", "test/replay/**/*.test.ts"],
          testTimeout: 60_000,
          environment: "node",
        },
      },
      {
        test: {
          name: "integration",
          include: ["test/**/*.test.ts"],
          exclude: ["test/lint/**", "test/replay/**"],
          environment: "node",
          testTimeout: 240_000,
          hookTimeout: 120_000,
          globalSetup: ["test/helpers/global-setup.ts"],
        },
      },
    ],
  },
});
