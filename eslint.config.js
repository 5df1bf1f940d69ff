// Typed lint. Boundaries from STYLE.md are enforced here, not in review:
// bullmq/ioredis only in queue/ and workers/, pg/drizzle only in store/,
// onnxruntime-node only in engines/ (and reward/ for reward models),
// no I/O in core/ and algorithms/; rollout/, reward/ and trainer/ do not import store/, runtime/,
// controller/, jobs/ or cli/ (the job processors in jobs/ join them to the store).
import js from "@eslint/js";
import tseslint from "typescript-eslint";
import { importX } from "eslint-plugin-import-x";

// Each list is what only one folder may import.
const queueOnly = ["bullmq", "ioredis"]; // queue/ (and workers/)
const pgOnly = ["pg", "pg-copy-streams", "pg-cursor"]; // store/
const drizzle = ["drizzle-orm", "drizzle-orm/*"]; // store/
const onnx = ["onnxruntime-node"]; // engines/ and reward/
// Pure code reaches no layer that does I/O.
const layersAbove = [
  "**/store/**",
  "**/queue/**",
  "**/controller/**",
  "**/runtime/**",
  "**/engines/**",
  "**/trainer/**",
  "**/rollout/**",
  "**/reward/**",
  "**/cli/**",
  "**/plugins/**",
  "**/data/**",
  "**/observability/**",
];
// Capability folders (rollout/, reward/, trainer/) reach no layer that wires processes or reads facts:
// the job processors that join a capability to the store live in jobs/ (issue 21).
const wiringAbove = ["**/store/**", "**/runtime/**", "**/controller/**", "**/jobs/**", "**/cli/**"];
const io = [
  "bullmq",
  "ioredis",
  "pg",
  "pg-copy-streams",
  "drizzle-orm",
  "drizzle-orm/*",
  "onnxruntime-node",
  "node:fs",
  "node:fs/promises",
  "node:http",
  "node:net",
  "node:child_process",
  "fs",
  "http",
];

export default tseslint.config(
  {
    ignores: [
      "dist/**",
      "node_modules/**",
      ".venv/**",
      ".venv-peers/**",
      "migrations/**",
      "coverage/**",
      ".rlq/**",
      "bin/**",
      "workers/trainer-torch/**",
      "eslint.config.js",
      ".dependency-cruiser.cjs",
      "test-artifacts/**",
      "**/*.mjs",
    ],
  },
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
  // No import cycles among value imports in src/, and every import before the first statement.
  // import-x/no-cycle skips type-only imports by design; .dependency-cruiser.cjs (also run by
  // `npm run lint`) catches the cycles made of types.
  {
    files: ["src/**/*.ts"],
    plugins: { "import-x": importX },
    settings: { "import-x/extensions": [".ts", ".js"], "import-x/resolver-next": [importX.createNodeResolver({ extensions: [".ts", ".js"] })] },
    rules: { "import-x/no-cycle": ["error", { ignoreExternal: true }], "import-x/first": "error" },
  },
  // One block per folder group, with disjoint file sets: in a flat config a later
  // no-restricted-imports replaces an earlier one for the same file, so each group's block lists
  // everything that group may not import (issue 21: core/ was checked for pg/drizzle only).
  {
    files: ["src/core/**/*.ts", "src/algorithms/**/*.ts"],
    rules: {
      "no-restricted-imports": [
        "error",
        { paths: [...new Set([...io, ...pgOnly, ...queueOnly, "node:os", "os", "node:worker_threads"])], patterns: [...drizzle, ...layersAbove] },
      ],
    },
  },
  {
    files: ["src/queue/**/*.ts"],
    rules: { "no-restricted-imports": ["error", { paths: [...pgOnly, ...onnx], patterns: drizzle }] },
  },
  {
    files: ["src/store/**/*.ts"],
    rules: { "no-restricted-imports": ["error", { paths: [...queueOnly, ...onnx] }] },
  },
  {
    files: ["src/engines/**/*.ts"],
    rules: { "no-restricted-imports": ["error", { paths: [...queueOnly, ...pgOnly], patterns: drizzle }] },
  },
  {
    files: ["src/reward/**/*.ts"],
    rules: { "no-restricted-imports": ["error", { paths: [...queueOnly, ...pgOnly], patterns: [...drizzle, ...wiringAbove] }] },
  },
  {
    files: ["src/rollout/**/*.ts", "src/trainer/**/*.ts"],
    rules: { "no-restricted-imports": ["error", { paths: [...queueOnly, ...pgOnly, ...onnx], patterns: [...drizzle, ...wiringAbove] }] },
  },
  {
    files: ["src/**/*.ts"],
    ignores: ["src/core/**", "src/algorithms/**", "src/queue/**", "src/store/**", "src/engines/**", "src/reward/**", "src/rollout/**", "src/trainer/**"],
    rules: { "no-restricted-imports": ["error", { paths: [...queueOnly, ...pgOnly, ...onnx], patterns: drizzle }] },
  },
);
