/**
 * Kept for the command quoted in docs/embedded-model.md: the benchmark now
 * lives in bench/embedded-model.ts (prints JSON, writes bench/results/embedded-model.json).
 *
 *   npx tsx scripts/bench-embedded-model.ts [--reps 5]
 */
await import("../bench/embedded-model.ts");
