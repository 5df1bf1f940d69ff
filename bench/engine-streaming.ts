/**
 * Control-plane CPU per generated token at long responses (issue 15, point 5):
 * SGLang's stream repeats every token so far in each event at
 * --stream-interval 1, so a streamed response of n tokens costs the client
 * O(n^2) bytes to read and parse. rlq now defaults to non-streaming (one batch
 * /generate per group, as slime does) and reads --incremental-streaming-output
 * deltas as deltas.
 *
 * One fake SGLang process (--model instant: a few hash rounds per token, so the
 * fake is not what is measured; --stop-prob 0: every response runs to its
 * length). This process (the control plane: the SGLang adapter, as the rollout
 * worker uses it) sends `requests` requests of `tokens` tokens, `concurrency`
 * at a time, in each mode, and measures its own CPU time (process.cpuUsage,
 * user + system) and the bytes the fake sent:
 *   batch        non-streaming (the default; requests of one turn share one batch /generate)
 *   cumulative   streaming against a server at --stream-interval 1 (SGLang's default)
 *   incremental  streaming against a server with --incremental-streaming-output
 * For each mode and length: CPU µs per token and bytes per token. A linear
 * cost shows as a flat per-token figure across lengths; a quadratic one grows
 * with the length. Medians over `reps`.
 *
 *   npx tsx bench/engine-streaming.ts [--tokens 1024,4096] [--requests 16] [--concurrency 8] [--reps 3]
 */
import { parseArgs } from "node:util";
import { createSglangServer } from "../src/engines/sglang.ts";
import { fakeStats, request, startFake, type FakeServer } from "../test/fakes/fake-engine-control.ts";
import { median, writeResult } from "./lib.ts";

const { values } = parseArgs({
  options: {
    tokens: { type: "string", default: "1024,4096" },
    requests: { type: "string", default: "16" },
    concurrency: { type: "string", default: "8" },
    reps: { type: "string", default: "3" },
  },
});
const lengths = values.tokens.split(",").map(Number);
const requests = Number(values.requests);
const concurrency = Number(values.concurrency);
const reps = Number(values.reps);

type Mode = "batch" | "cumulative" | "incremental";
const fakes: Record<"plain" | "incremental", FakeServer> = {
  plain: await startFake("sglang", ["--model", "instant", "--stop-prob", "0", "--context-length", "1000000"]),
  incremental: await startFake("sglang", ["--model", "instant", "--stop-prob", "0", "--context-length", "1000000", "--incremental-streaming-output"]),
};

async function once(mode: Mode, tokens: number, rep: number): Promise<{ cpuUsPerToken: number; bytesPerToken: number; wallS: number }> {
  const f = mode === "incremental" ? fakes.incremental : fakes.plain;
  const engine = createSglangServer({ url: f.url, requestTimeoutMs: 600_000, isStreaming: mode !== "batch" });
  const bytes0 = (await fakeStats(f.url)).bytesSent;
  const t0 = performance.now();
  const cpu0 = process.cpuUsage();
  let next = 0;
  let generated = 0;
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      while (next < requests) {
        const i = next++;
        const r = await engine.generate(request(`bs-${mode}-${tokens}-${rep}-${i}`, { maxNewTokens: tokens, stopTokenIds: [], seed: i }));
        generated += r.tokenIds.length;
      }
    }),
  );
  const cpu = process.cpuUsage(cpu0);
  const wallS = (performance.now() - t0) / 1000;
  const bytes = (await fakeStats(f.url)).bytesSent - bytes0;
  if (generated !== requests * tokens) throw new Error(`${mode}: ${generated} tokens generated, expected ${requests * tokens}`);
  return { cpuUsPerToken: (cpu.user + cpu.system) / generated, bytesPerToken: bytes / generated, wallS };
}

const results: Array<Record<string, unknown>> = [];
try {
  // Warm-up: JIT and sockets.
  for (const mode of ["batch", "cumulative", "incremental"] as const) await once(mode, 256, -1);
  for (const tokens of lengths) {
    for (const mode of ["batch", "cumulative", "incremental"] as const) {
      const runs = [];
      for (let rep = 0; rep < reps; rep++) runs.push(await once(mode, tokens, rep));
      results.push({
        mode,
        tokens,
        cpu_us_per_token: Number(median(runs.map((r) => r.cpuUsPerToken)).toFixed(3)),
        bytes_per_token: Number(median(runs.map((r) => r.bytesPerToken)).toFixed(1)),
        wall_s: Number(median(runs.map((r) => r.wallS)).toFixed(3)),
      });
      process.stderr.write(`${JSON.stringify(results.at(-1))}\n`);
    }
  }
} finally {
  fakes.plain.kill("SIGTERM");
  fakes.incremental.kill("SIGTERM");
}
await writeResult("engine-streaming", {
  what: "control-plane CPU per generated token (this process: the SGLang adapter), by response length and /generate mode; fake SGLang --model instant",
  requests,
  concurrency,
  reps,
  results,
});
