/**
 * Engine pool overhead (issue 6). Two fake SGLang servers, each its own
 * process (test/fakes/fake-sglang.ts), emit one token every `--token-delay-ms`
 * per request, independently of how many requests they hold: engines that
 * produce N = 1000 / delay tokens/s per request (streamed, as rlq asks for).
 * The pool is built the way a run builds it (createEnginesFromConfig with the
 * run-config defaults: least-outstanding routing, 512 per engine, log-prob
 * probe); the baseline is the same SGLang adapter (createSglangServer) called
 * directly, without the pool, against the same fakes in the same run. No stop
 * tokens in the request; the fake's EOS has probability 1e-6 per token, so
 * requests run to max_new_tokens (tokens are counted as returned).
 *
 * - overhead (concurrency 1, first delay only): `pairs` pairs of identical
 *   requests (same input, seed and tokens), one through the pool and one
 *   direct, interleaved, the order alternating. Overhead p50 / p99 = pool
 *   latency p50 / p99 minus direct latency p50 / p99 (a difference of
 *   percentiles, not a percentile of differences); also the median of the
 *   per-pair differences and this process's CPU time per request, pool vs direct.
 * - load (256 concurrent), per delay: 256 closed-loop clients (each sends its
 *   next request when the last returns; starts spread over one request's
 *   duration), a warm-up, then a window; achieved tokens/s = tokens credited to
 *   the window / window (see `load`). Capacity = 256 x the tokens/s of a
 *   request on an idle engine, sent directly (`soloRate`, measured in the same
 *   run; `nominal` = 256 x N).
 *   Direct at load: client i sends to engine i mod 2 (the ideal split).
 *   Latency p50 / p99 at load: requests sent and finished inside the window.
 *   At 2 cores the fakes themselves (timers, SSE events with the cumulative
 *   token list) saturate the machine at the higher rate: the direct run at the
 *   same load is the baseline that separates that from the pool.
 * Medians over `reps` repetitions.
 *
 *   npx tsx bench/engine-pool.ts [--reps 3] [--token-delay-ms 10,40] [--pairs 100] [--window-s 3] [--max-new-tokens 32]
 */
import { parseArgs } from "node:util";
import type { Engine, GenerateRequest } from "../src/engines/engine.ts";
import { sglangEngineConfigSchema, engineRuntimeDefaults } from "../src/engines/config-schema.ts";
import { createEnginesFromConfig } from "../src/engines/from-config.ts";
import { createSglangServer } from "../src/engines/sglang.ts";
import { startFake, type FakeServer } from "../test/fakes/fake-engine-control.ts";
import { median, writeResult } from "./lib.ts";

const { values } = parseArgs({
  options: {
    reps: { type: "string", default: "3" },
    "token-delay-ms": { type: "string", default: "10,40" },
    pairs: { type: "string", default: "100" },
    "window-s": { type: "string", default: "3" },
    "warmup-s": { type: "string", default: "1" },
    concurrency: { type: "string", default: "256" },
    "max-new-tokens": { type: "string", default: "32" },
  },
});
const reps = Number(values.reps);
const delays = String(values["token-delay-ms"]).split(",").map(Number);
const pairs = Number(values.pairs);
const windowS = Number(values["window-s"]);
const warmupS = Number(values["warmup-s"]);
const concurrency = Number(values.concurrency);
const ENGINES = 2;
const OVERHEAD_TOKENS = 4;
const LOAD_TOKENS = Number(values["max-new-tokens"]);

const round = (x: number, digits = 0): number => Math.round(x * 10 ** digits) / 10 ** digits;
/** Nearest-rank percentile. */
function pct(xs: readonly number[], p: number): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))] as number;
}

let nextId = 0;
function request(maxNewTokens: number, seed: number): GenerateRequest {
  return {
    requestId: `bench-${nextId++}`,
    inputIds: [256, 72, 105, 33],
    sampling: { temperature: 1, topP: 1, topK: -1, maxNewTokens, stopTokenIds: [], seed },
  };
}

async function timed(engine: Engine, req: GenerateRequest): Promise<{ ms: number; tokens: number }> {
  const t0 = performance.now();
  const r = await engine.generate(req);
  if (r.finishReason === "abort") throw new Error(`request ${req.requestId} ended with ${r.finishReason}`);
  return { ms: performance.now() - t0, tokens: r.tokenIds.length };
}

const cpuMs = (): number => {
  const u = process.cpuUsage();
  return (u.user + u.system) / 1000;
};

async function overhead(pool: Engine, direct: Engine[]): Promise<Record<string, number>> {
  const viaPool: number[] = [];
  const viaDirect: number[] = [];
  const diffs: number[] = [];
  for (let i = 0; i < 4; i++) {
    await timed(pool, request(OVERHEAD_TOKENS, i)); // warm-up: connections, jit
    await timed(direct[i % ENGINES] as Engine, request(OVERHEAD_TOKENS, i));
  }
  let poolCpu = 0;
  let directCpu = 0;
  for (let i = 0; i < pairs; i++) {
    const seed = 1000 + i;
    const d = direct[i % ENGINES] as Engine;
    const runPool = async () => {
      const c = cpuMs();
      const r = await timed(pool, request(OVERHEAD_TOKENS, seed));
      poolCpu += cpuMs() - c;
      return r.ms;
    };
    const runDirect = async () => {
      const c = cpuMs();
      const r = await timed(d, request(OVERHEAD_TOKENS, seed));
      directCpu += cpuMs() - c;
      return r.ms;
    };
    let p: number;
    let q: number;
    if (i % 2 === 0) {
      p = await runPool();
      q = await runDirect();
    } else {
      q = await runDirect();
      p = await runPool();
    }
    viaPool.push(p);
    viaDirect.push(q);
    diffs.push(p - q);
  }
  return {
    pool_p50_ms: pct(viaPool, 50),
    pool_p99_ms: pct(viaPool, 99),
    direct_p50_ms: pct(viaDirect, 50),
    direct_p99_ms: pct(viaDirect, 99),
    overhead_p50_ms: pct(viaPool, 50) - pct(viaDirect, 50),
    overhead_p99_ms: pct(viaPool, 99) - pct(viaDirect, 99),
    paired_diff_median_ms: median(diffs),
    pool_cpu_ms_per_request: poolCpu / pairs,
    direct_cpu_ms_per_request: directCpu / pairs,
  };
}

/**
 * Tokens/s of a request on an otherwise idle engine, sent directly: 4 requests
 * at once (2 per engine, far below load); median of their rates.
 */
async function soloRate(direct: Engine[]): Promise<number> {
  const rs = await Promise.all(Array.from({ length: 4 }, (_, i) => timed(direct[i % ENGINES] as Engine, request(LOAD_TOKENS, 50 + i))));
  return median(rs.map((r) => r.tokens / (r.ms / 1000)));
}

/**
 * `concurrency` closed-loop clients; `route(i)` is the engine client i sends to.
 * Client starts are spread over one request's duration so they do not run in
 * lockstep; each keeps sending until the window's end, so all `concurrency`
 * are in flight throughout the window. A request's tokens are credited to the
 * window in proportion to the part of its lifetime inside it (tokens stream
 * at a constant rate), which removes the quantisation of counting whole requests.
 */
async function load(route: (client: number) => Engine, requestMs: number): Promise<Record<string, number>> {
  const t0 = performance.now();
  const warmupMs = Math.max(warmupS * 1000, 1.5 * requestMs);
  const start = t0 + warmupMs;
  const end = start + windowS * 1000;
  const done: Array<{ sent: number; done: number; tokens: number }> = [];
  let cpuStart = 0;
  let cpuEnd = 0;
  const startTimer = setTimeout(() => (cpuStart = cpuMs()), warmupMs);
  const endTimer = setTimeout(() => (cpuEnd = cpuMs()), warmupMs + windowS * 1000);
  const client = async (i: number): Promise<void> => {
    await new Promise((r) => setTimeout(r, (i / concurrency) * requestMs));
    const engine = route(i);
    for (let k = 0; performance.now() < end; k++) {
      const sent = performance.now();
      const r = await timed(engine, request(LOAD_TOKENS, i * 100_000 + k));
      done.push({ sent, done: sent + r.ms, tokens: r.tokens });
    }
  };
  await Promise.all(Array.from({ length: concurrency }, (_, i) => client(i)));
  clearTimeout(startTimer);
  clearTimeout(endTimer);
  let tokens = 0;
  for (const d of done) {
    const overlap = Math.min(d.done, end) - Math.max(d.sent, start);
    if (overlap > 0) tokens += (d.tokens * overlap) / (d.done - d.sent);
  }
  const inside = done.filter((d) => d.sent >= start && d.done < end).map((d) => d.done - d.sent);
  return {
    tokens_per_s: tokens / windowS,
    requests_inside_window: inside.length,
    p50_ms: pct(inside, 50),
    p99_ms: pct(inside, 99),
    bench_process_cpu_share: (cpuEnd - cpuStart) / (windowS * 1000),
  };
}

type Stats = Record<string, number>;
const rounded = (o: Stats, digits: number): Stats => Object.fromEntries(Object.entries(o).map(([k, v]) => [k, round(v, digits)]));
const med = (runs: Stats[], key: string, digits: number): number => round(median(runs.map((r) => r[key] as number)), digits);

/** Two fakes at `delay` ms per token, the pool over them and the direct adapters; `reps` of each measure. */
async function atRate(delay: number, withOverhead: boolean): Promise<Record<string, unknown>> {
  const fakes: FakeServer[] = [];
  try {
    for (let i = 0; i < ENGINES; i++) fakes.push(await startFake("sglang", ["--token-delay-ms", String(delay), "--stop-prob", "0"]));
    const urls = fakes.map((f) => f.url);
    const pool = await createEnginesFromConfig(sglangEngineConfigSchema.parse({ kind: "sglang", urls }), engineRuntimeDefaults({}));
    const direct = urls.map((url) => createSglangServer({ url, requestTimeoutMs: 600_000 }));
    try {
      await pool.awaitReady(20_000);
      const over: Stats[] = [];
      const loads: Stats[] = [];
      for (let rep = 0; rep < reps; rep++) {
        if (withOverhead) over.push(await overhead(pool, direct));
        const solo = await soloRate(direct);
        const requestMs = (LOAD_TOKENS / solo) * 1000;
        // Alternate which goes first, so a drift in machine load does not favour one.
        const first = rep % 2 === 0 ? await load(() => pool, requestMs) : null;
        const viaDirect = await load((i) => direct[i % ENGINES] as Engine, requestMs);
        const viaPool = first ?? (await load(() => pool, requestMs));
        const capacity = concurrency * solo;
        loads.push({
          solo_tokens_per_s_per_request: solo,
          capacity_tokens_per_s: capacity,
          pool_tokens_per_s: viaPool.tokens_per_s as number,
          direct_tokens_per_s: viaDirect.tokens_per_s as number,
          fraction_of_capacity: (viaPool.tokens_per_s as number) / capacity,
          direct_fraction_of_capacity: (viaDirect.tokens_per_s as number) / capacity,
          pool_p50_ms: viaPool.p50_ms as number,
          pool_p99_ms: viaPool.p99_ms as number,
          direct_p50_ms: viaDirect.p50_ms as number,
          direct_p99_ms: viaDirect.p99_ms as number,
          pool_requests_inside_window: viaPool.requests_inside_window as number,
          bench_cpu_share_pool: viaPool.bench_process_cpu_share as number,
          bench_cpu_share_direct: viaDirect.bench_process_cpu_share as number,
        });
        const o = over[over.length - 1];
        process.stderr.write(
          `${delay} ms/token rep ${rep}: ` +
            (o
              ? `overhead p50 ${(o.overhead_p50_ms as number).toFixed(2)} ms, p99 ${(o.overhead_p99_ms as number).toFixed(2)} ms, paired ${(o.paired_diff_median_ms as number).toFixed(2)} ms; `
              : "") +
            `256 concurrent: pool ${(viaPool.tokens_per_s as number).toFixed(0)} tok/s, direct ${(viaDirect.tokens_per_s as number).toFixed(0)}, capacity ${capacity.toFixed(0)}\n`,
        );
      }
      const poolTps = median(loads.map((l) => l.pool_tokens_per_s as number));
      const directTps = median(loads.map((l) => l.direct_tokens_per_s as number));
      const solo = median(loads.map((l) => l.solo_tokens_per_s_per_request as number));
      const out: Record<string, unknown> = {
        token_delay_ms: delay,
        nominal_tokens_per_s_per_request: 1000 / delay,
        load: {
          concurrency,
          max_new_tokens: LOAD_TOKENS,
          window_s: windowS,
          median_solo_tokens_per_s_per_request: round(solo, 1),
          capacity_tokens_per_s: round(concurrency * solo),
          nominal_capacity_tokens_per_s: round((concurrency * 1000) / delay),
          median_pool_tokens_per_s: round(poolTps),
          median_direct_tokens_per_s: round(directTps),
          fraction_of_capacity: round(poolTps / (concurrency * solo), 3),
          direct_fraction_of_capacity: round(directTps / (concurrency * solo), 3),
          pool_vs_direct: round(poolTps / directTps, 3),
          median_pool_p50_ms: med(loads, "pool_p50_ms", 1),
          median_pool_p99_ms: med(loads, "pool_p99_ms", 1),
          median_direct_p50_ms: med(loads, "direct_p50_ms", 1),
          median_direct_p99_ms: med(loads, "direct_p99_ms", 1),
          runs: loads.map((l) => rounded(l, 3)),
        },
        pool_requests_per_engine: pool.snapshot().engines.map((e) => e.requests),
      };
      if (withOverhead) {
        out.overhead = {
          concurrency: 1,
          max_new_tokens: OVERHEAD_TOKENS,
          pairs,
          median_overhead_p50_ms: med(over, "overhead_p50_ms", 3),
          median_overhead_p99_ms: med(over, "overhead_p99_ms", 3),
          median_paired_diff_ms: med(over, "paired_diff_median_ms", 3),
          median_pool_p50_ms: med(over, "pool_p50_ms", 2),
          median_pool_p99_ms: med(over, "pool_p99_ms", 2),
          median_direct_p50_ms: med(over, "direct_p50_ms", 2),
          median_direct_p99_ms: med(over, "direct_p99_ms", 2),
          median_pool_cpu_ms_per_request: med(over, "pool_cpu_ms_per_request", 3),
          median_direct_cpu_ms_per_request: med(over, "direct_cpu_ms_per_request", 3),
          runs: over.map((o) => rounded(o, 3)),
        };
      }
      return out;
    } finally {
      await pool.close();
    }
  } finally {
    for (const f of fakes) {
      f.kill("SIGTERM");
      await f.exited;
    }
  }
}

const rates: Record<string, unknown>[] = [];
for (const [i, delay] of delays.entries()) rates.push(await atRate(delay, i === 0));
await writeResult("engine-pool", { bench: "engine-pool", engines: ENGINES, stream: true, reps, rates });
