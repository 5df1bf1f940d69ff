// Typed lint. Boundaries from STYLE.md are enforced here, not in review:
// bullmq/ioredis only in queue/ and workers/, pg/drizzle only in store/,
// onnxruntime-node only in engines/ (and reward/ for reward models),
// no I/O in core/ and algorithms/.
import js from "@eslint/js";
import tseslint from "typescript-eslint";

const io = ["bullmq", "ioredis", "pg", "pg-copy-streams", "drizzle-orm", "drizzle-orm/*", "onnxruntime-node", "node:fs", "node:fs/promises", "node:http", "node:net", "node:child_process", "fs", "http"];

export default tseslint.config(
  { ignores: ["dist/**", "node_modules/**", "migrations/**", "coverage/**", ".rlq/**", "bin/**", "workers/trainer-torch/**", "eslint.config.js", "**/*.mjs"] },
  js.configs.recommended,
  ...tseslint.configs.recommendedTypeChecked,
  {
    languageOptions: {
      parserOptions: { projectService: true, tsconfigRootDir: import.meta.dirname },
    },
    rules: {
      "@typescript-eslint/no-floating-promises": "error",
      "@typescript-eslint/no-misused-promises": "error",
      "@typescript-eslint/no-unused-vars": ["error", { argsIgnorePattern: "^_", varsIgnorePattern: "^_" }],
      "@typescript-eslint/restrict-template-expressions": "off",
      "@typescript-eslint/no-unsafe-assignment": "off",
      "@typescript-eslint/no-unsafe-member-access": "off",
      "@typescript-eslint/no-unsafe-argument": "off",
      "@typescript-eslint/no-unsafe-call": "off",
      "@typescript-eslint/no-unsafe-return": "off",
      "@typescript-eslint/require-await": "off",
      "@typescript-eslint/ban-ts-comment": ["error", { "ts-expect-error": "allow-with-description", "ts-ignore": true }],
    },
  },
  {
    files: ["src/core/**/*.ts", "src/algorithms/**/*.ts"],
    rules: { "no-restricted-imports": ["error", { paths: io, patterns: ["**/store/**", "**/queue/**"] }] },
  },
  {
    files: ["src/**/*.ts"],
    ignores: ["src/queue/**", "src/store/**", "src/engines/**", "src/reward/**", "src/trainer/**", "src/cli/**", "src/controller/**", "src/rollout/**", "src/plugins/**", "src/data/**", "src/model/**", "src/lib/**", "src/observability/**", "src/config/**", "src/index.ts", "src/runtime/**"],
    rules: { "no-restricted-imports": ["error", { paths: ["bullmq", "ioredis", "pg", "drizzle-orm"] }] },
  },
  {
    files: ["src/**/*.ts"],
    ignores: ["src/queue/**"],
    rules: { "no-restricted-imports": ["error", { paths: ["bullmq", "ioredis"] }] },
  },
  {
    files: ["src/**/*.ts"],
    ignores: ["src/store/**"],
    rules: { "no-restricted-imports": ["error", { paths: ["pg", "pg-copy-streams"], patterns: ["drizzle-orm", "drizzle-orm/*"] }] },
  },
);
