import type { GenerateRequest } from "../../src/engines/engine.ts";
import { spawnFake, type Proc } from "../helpers/processes.ts";

/** TEST FAKE control: start/restart the fake engines as processes, inject faults, build requests. */
export type FakeServer = Proc & { url: string; port: number };

/**
 * The fake SGLang's arguments as tests start it: like an RL deployment, with
 * --enable-deterministic-inference (so seeds are honoured and runs repeat),
 * unless the test passes "--nondeterministic" to get the server's default.
 */
export function sglangArgs(args: readonly string[]): string[] {
  if (args.includes("--nondeterministic")) return args.filter((a) => a !== "--nondeterministic");
  return ["--enable-deterministic-inference", ...args];
}

export async function startFake(script: "sglang" | "vllm" | "sglang-router", args: string[] = []): Promise<FakeServer> {
  const p = await spawnFake(`test/fakes/fake-${script}.ts`, script === "sglang" ? sglangArgs(args) : args);
  return { ...p, port: Number(new URL(p.url).port) };
}

/** The same fake on the same port again (an engine restarted by its operator). */
export async function restartFake(script: "sglang" | "vllm", port: number, args: string[] = []): Promise<FakeServer> {
  for (let i = 0; ; i++) {
    try {
      return await startFake(script, [...args, "--port", String(port)]);
    } catch (e) {
      // The port can stay busy for a moment after the old process died.
      if (i >= 20) throw e;
      await new Promise((r) => setTimeout(r, 100));
    }
  }
}

export async function setFault(url: string, fault: Record<string, unknown>): Promise<void> {
  const res = await fetch(`${url}/_fault`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(fault) });
  if (!res.ok) throw new Error(`fault ${JSON.stringify(fault)} on ${url}: HTTP ${res.status}`);
}

export interface FakeSglangStats {
  generate: number;
  batches: number;
  aborted: number;
  loads: number;
  abortRequests: number;
  live: number;
  maxLive: number;
  weightVersion: number;
  failed5xx: number;
  refused: number;
  duplicates: number;
  unauthorized: number;
  adminRefused: number;
  dpAssertions: number;
  deprecatedCalls: number;
  bytesSent: number;
  tokensGenerated: number;
  healthBusy: number;
  healthChecks: number;
  releases: number;
  resumes: number;
  generateWhileReleased: number;
  generateWhileReleasedRids: string[];
  /** The model_path of each update_weights_from_disk that loaded, in order. */
  loadedPaths: string[];
  healthWhileReleased: number;
  memoryFaults: string[];
  pauses: number;
  flushes: number;
  seedsSeen: number[];
  imagesSeen: Record<string, string[]>;
  lastPush: null | { names: unknown; dtypes: unknown; shapes: unknown; group_name: unknown };
  lastTensorPush: null | { count: number; bytes: number[]; load_format: unknown; flush_cache: boolean; weight_version: unknown };
  calls: string[];
  abortAlls: number;
  flushRefused: number;
  cacheFlushes: number;
  connections: number;
}

export async function fakeStats(url: string): Promise<FakeSglangStats> {
  const res = await fetch(`${url}/stats`);
  return (await res.json()) as never;
}

export function request(id: string, options: Partial<GenerateRequest["sampling"]> & { inputIds?: number[]; sessionKey?: string } = {}): GenerateRequest {
  const { inputIds, sessionKey, ...sampling } = options;
  return {
    requestId: id,
    inputIds: inputIds ?? [256, 72, 105],
    sampling: { temperature: 1, topP: 1, topK: -1, maxNewTokens: 32, stopTokenIds: [257], seed: 7, ...sampling },
    ...(sessionKey === undefined ? {} : { sessionKey }),
  };
}

/**
 * A trainer push that lands while requests are generating: pause in place (io_struct.py
 * PauseGenerationReqInput mode "in_place"), then /update_weights_from_distributed (applied at once
 * while paused: tokenizer_communicator_mixin.py; unpaused it would wait for the requests), then
 * continue. The fake receives no tensors, so the push names none.
 */
export async function pushInPlace(url: string, version: number): Promise<void> {
  const post = async (path: string, body: unknown) => {
    const res = await fetch(`${url}${path}`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
    if (!res.ok) throw new Error(`${path} on ${url}: HTTP ${res.status} ${await res.text()}`);
  };
  await post("/pause_generation", { mode: "in_place" });
  await post("/init_weights_update_group", { master_address: "127.0.0.1", master_port: 1, rank_offset: 1, world_size: 2, group_name: "rlq-test" });
  await post("/update_weights_from_distributed", { names: [], dtypes: [], shapes: [], group_name: "rlq-test", weight_version: String(version) });
  await post("/continue_generation", {});
}
