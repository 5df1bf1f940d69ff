import { defineConfig } from "vitest/config";

/**
 * Three projects, run one file at a time (the crash tests spawn processes and this box has 2 cores),
 * except the integration project under `npm test` and `npm run test:integration`, two files at a
 * time (scripts/test.mjs says why):
 * - `unit`: pure code next to the source, no services.
 * - `integration`: real Redis + real Postgres, one database per file.
 * - `python`: the files whose time goes to Python processes: the trainer's own suite, a real vLLM
 *   server, a run on the real stack (`npm run test:python` runs just these).
 */
const PYTHON_FILES = [
  "test/integration/trainer-torch-python.test.ts",
  "test/integration/real-stack.test.ts",
  "test/integration/real-vllm.test.ts",
  "test/integration/vllm-faults.test.ts",
  "test/integration/real-vllm-in-place.test.ts",
  "test/integration/colocate-torch.test.ts",
  "test/integration/opd-teacher-vllm.test.ts",
  "test/integration/onnx-reward-model.test.ts",
  "test/integration/lora-resume.test.ts",
  "test/integration/lora-adapter-sync.test.ts",
  "test/integration/sft-conversation.test.ts",
  "test/integration/vlm-prompt-parity.test.ts",
  "test/integration/vlm-run.test.ts",
  "test/integration/real-vllm-images.test.ts",
];

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
          exclude: ["test/lint/**", "test/replay/**", ...PYTHON_FILES],
          environment: "node",
          testTimeout: 240_000,
          hookTimeout: 120_000,
          globalSetup: ["test/helpers/global-setup.ts"],
        },
      },
      {
        test: {
          name: "python",
          include: PYTHON_FILES,
          environment: "node",
          testTimeout: 600_000,
          hookTimeout: 900_000,
          globalSetup: ["test/helpers/global-setup.ts"],
        },
      },
    ],
  },
});
