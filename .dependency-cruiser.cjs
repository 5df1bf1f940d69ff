// Import rules that ESLint cannot check, run by `npm run lint` (test/lint/dependency-rules.test.ts
// probes each one). ESLint's import-x/no-cycle skips type-only imports by design; a cycle of types
// is still a cycle of concepts, so cycles are checked here with TypeScript's pre-compilation
// dependencies (type-only imports included). Folder layering beyond the package rules of
// eslint.config.js lives here too: each rule names the direction it forbids and why.
/** @type {import('dependency-cruiser').IConfiguration} */
module.exports = {
  forbidden: [
    {
      name: "no-cycle",
      comment: "No import cycle in src/, type-only imports included (STYLE.md, Boundaries).",
      severity: "error",
      from: { path: "^src/" },
      to: { circular: true },
    },
    {
      name: "queue-below-observability",
      comment: "queue/ is the transport: it reports through what its caller passes in, never by importing observability/, the dashboard or the store.",
      severity: "error",
      from: { path: "^src/queue/" },
      to: { path: "^src/(observability|dashboard|store|controller|runtime|jobs|cli)/" },
    },
    {
      name: "observability-beside-dashboard",
      comment: "observability/ (/metrics, TensorBoard, W&B) reads facts through store/ and shares helpers through lib/, never the dashboard's modules.",
      severity: "error",
      from: { path: "^src/observability/" },
      to: { path: "^src/dashboard/" },
    },
    {
      name: "runtime-below-jobs",
      comment:
        "runtime/ wires services the job processors use; the processes that host the processors live in jobs/, so jobs/ imports runtime/ and never the reverse.",
      severity: "error",
      from: { path: "^src/runtime/" },
      to: { path: "^src/jobs/" },
    },
  ],
  options: {
    tsConfig: { fileName: "tsconfig.json" },
    tsPreCompilationDeps: true,
    doNotFollow: { path: "node_modules" },
    exclude: { path: "\\.test\\.ts$" },
  },
};
