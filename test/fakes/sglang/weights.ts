/**
 * The fake SGLang's weight updates, health check and cache flush: the model update lock, disk
 * loads, distributed and tensor pushes (test/fakes/fake-sglang.ts documents each behaviour and
 * the SGLang source it comes from).
 */
import type { ServerResponse } from "node:http";
import { groupNames, hangWhileFaulted, isHanging, isMemoryReleased, live, opts, send, sleep, st, stats, take5xx } from "./state.ts";

/**
 * tokenizer_manager.py model_update_lock.writer_lock: wait for every in-flight request (each holds
 * the reader lock for its whole generation) and hold new ones until `fn` is done.
 */
export async function underWriterLock<T>(fn: () => Promise<T>): Promise<T> {
  while (st.loading) await st.loading;
  let done!: () => void;
  st.loading = new Promise<void>((r) => (done = r));
  try {
    if (live.size > 0) await new Promise<void>((r) => (st.drained = r));
    st.drained = null;
    return await fn();
  } finally {
    st.loading = null;
    done();
  }
}

export async function loadWeights(b: Record<string, unknown>, res: ServerResponse): Promise<void> {
  if (take5xx("health")) return send(res, 503, { error: { message: "injected 5xx" } });
  if (st.offloadTags.has("weights")) {
    // The real scheduler would write into paused memory; the fake refuses and counts it.
    stats.loadWhileReleased++;
    return send(res, 500, { success: false, message: "weights are released (release_memory_occupation): resume them before a load" });
  }
  await underWriterLock(async () => {
    if (opts.loadDelayMs > 0) await sleep(opts.loadDelayMs);
    if (typeof b.model_path !== "string" || b.model_path.includes("missing")) {
      // http_server.py update_weights_from_disk: a failed load is HTTP 400.
      return send(res, 400, { success: false, message: `Failed to update weights: cannot load ${String(b.model_path)}` });
    }
    if (opts.policyUrl) {
      const loaded = await fetch(`${opts.policyUrl}/load`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ path: b.model_path }),
      });
      if (loaded.status !== 200)
        return send(res, 400, { success: false, message: `Failed to update weights: cannot load ${b.model_path}: ${await loaded.text()}` });
    }
    st.weightVersion = Number(b.weight_version);
    stats.loads++;
    stats.loadedPaths.push(b.model_path);
    stats.calls.push("update_weights_from_disk");
    send(res, 200, { success: true, message: `Succeeded to update model weights from ${String(b.model_path)}`, num_paused_requests: 0 });
  });
}

/** FastAPI's RequestValidationError answer (http_server.py validation_exception_handler): 400. */
export function sendValidationError(res: ServerResponse, message: string): void {
  send(res, 400, { object: "error", message, type: "Bad Request", param: null, code: 400 });
}

/** tokenizer_communicator_mixin.py: under the writer lock unless generation is st.paused, then at once. */
export async function push(apply: () => { success: boolean; message: string }, b: Record<string, unknown>, res: ServerResponse): Promise<void> {
  if (b.abort_all_requests === true) for (const s of live.values()) s.aborted = true;
  const run = async () => apply();
  const { success, message } = st.paused ? await run() : await underWriterLock(run);
  if (!success) return send(res, 400, { success: false, message });
  // http_server.py / tokenizer_communicator_mixin.py _update_weight_version_if_provided.
  if (b.weight_version !== undefined && b.weight_version !== null) st.weightVersion = Number(b.weight_version);
  stats.loads++;
  // io_struct.py: flush_cache defaults to true (the radix cache is flushed after the update; the fake counts it).
  if (b.flush_cache !== false) stats.cacheFlushes++;
  send(res, 200, {
    success: true,
    message: `${message}${b.weight_version == null ? "" : ` Weight version updated to ${typeof b.weight_version === "string" ? b.weight_version : JSON.stringify(b.weight_version)}.`}`,
  });
}

export function updateFromDistributed(b: Record<string, unknown>, res: ServerResponse): Promise<void> | void {
  const names = b.names;
  const dtypes = b.dtypes;
  const shapes = b.shapes;
  if (!Array.isArray(names) || !Array.isArray(dtypes) || !Array.isArray(shapes)) {
    return sendValidationError(res, "names, dtypes and shapes are required (UpdateWeightsFromDistributedReqInput)");
  }
  const group = typeof b.group_name === "string" ? b.group_name : "weight_update_group";
  return push(
    () => {
      if (!groupNames.has(group))
        return { success: false, message: `Failed to update parameter online: group ${group} not found. Call init_weights_update_group first.` };
      if (names.length !== dtypes.length || names.length !== shapes.length) return { success: false, message: "names, dtypes and shapes differ in length" };
      stats.lastPush = { names, dtypes, shapes, group_name: group };
      stats.calls.push("update_weights_from_distributed");
      return { success: true, message: "Succeeded to update parameter online." };
    },
    b,
    res,
  );
}

/** One serialized_named_tensors entry: MultiprocessingSerializer.deserialize base64-decodes a string, then unpickles. */
export function pickledBytes(x: unknown): number | null {
  if (typeof x !== "string" || x.length === 0 || !/^[A-Za-z0-9+/]+={0,2}$/.test(x)) return null;
  const raw = Buffer.from(x, "base64");
  // A pickle of protocol 2 or later starts with PROTO (0x80) and ends with STOP ('.').
  return raw[0] === 0x80 && raw[raw.length - 1] === 0x2e ? raw.length : null;
}

export function updateFromTensor(b: Record<string, unknown>, res: ServerResponse): Promise<void> | void {
  const blobs = b.serialized_named_tensors;
  if (!Array.isArray(blobs)) return sendValidationError(res, "serialized_named_tensors is required (UpdateWeightsFromTensorReqInput)");
  const format = b.load_format ?? null;
  return push(
    () => {
      if (blobs.length < opts.tpSize)
        return { success: false, message: `serialized_named_tensors has ${blobs.length} entries for tp_size ${opts.tpSize} (one per TP rank)` };
      const bytes = blobs.map(pickledBytes);
      if (bytes.some((n) => n === null))
        return { success: false, message: "Failed to update weights: serialized_named_tensors entries must be base64 of a pickle" };
      if (format !== null && format !== "direct" && format !== "flattened_bucket")
        return { success: false, message: `unknown load_format ${JSON.stringify(format)}` };
      stats.lastTensorPush = {
        count: blobs.length,
        bytes: bytes as number[],
        load_format: format,
        flush_cache: b.flush_cache !== false,
        weight_version: b.weight_version,
      };
      stats.calls.push("update_weights_from_tensor");
      return { success: true, message: "Succeeded to update model weights." };
    },
    b,
    res,
  );
}

/**
 * http_server.py health_generate (also /health): sends a one-token generation, then every second
 * checks whether anything came out since it began; 200 once something did, 503 (empty body) after
 * SGLANG_HEALTH_CHECK_TIMEOUT. While a load runs or generation is st.paused nothing comes out.
 */
export async function healthGenerate(res: ServerResponse): Promise<void> {
  stats.healthChecks++;
  if (isHanging()) return hangWhileFaulted().then(() => void res.writeHead(200).end());
  // Released memory: the real health_generate would send a generation to a scheduler holding no
  // weights or cache; the fake answers 503 at once, which rlq reads as busy (as during a load).
  if (isMemoryReleased()) {
    stats.healthWhileReleased++;
    stats.healthBusy++;
    return void res.writeHead(503).end();
  }
  if (take5xx("health")) return send(res, 503, { error: { message: "injected 5xx" } });
  const began = Date.now();
  for (;;) {
    await sleep(Math.min(opts.healthPollMs, Math.max(0, began + opts.healthBlockMs - Date.now())));
    if (!st.loading && !st.paused) return void res.writeHead(200).end();
    if (Date.now() - began >= opts.healthBlockMs) {
      stats.healthBusy++;
      return void res.writeHead(503).end();
    }
  }
}

/** constants.py GPU_MEMORY_ALL_TYPES: what an empty or absent `tags` means. */
const ALL_MEMORY_TAGS = ["weights", "kv_cache", "cuda_graph"];

function tagsOf(b: Record<string, unknown>): string[] {
  return Array.isArray(b.tags) && b.tags.length > 0 ? b.tags.map(String) : ALL_MEMORY_TAGS;
}

/**
 * http_server.py release_memory_occupation (ReleaseMemoryOccupationReqInput {tags}) →
 * scheduler_update_weights_mixin.py release_memory_occupation: `assert self._is_no_request()`,
 * then each tag joins `offload_tags` (a set: a tag released twice stays released) and its memory
 * is paused; the KV cache is flushed. The assertion kills the real scheduler; the fake answers 500
 * and records it in stats.memoryFaults.
 */
export function releaseMemory(b: Record<string, unknown>, res: ServerResponse): void {
  const tags = tagsOf(b);
  stats.calls.push(`release_memory_occupation:${tags.join(",")}`);
  if (live.size > 0) {
    stats.memoryFaults.push(`release with ${live.size} request(s) running`);
    return send(res, 500, { success: false, message: "release_memory_occupation should be called only when no ongoing request." });
  }
  for (const t of tags) st.offloadTags.add(t);
  stats.releases++;
  send(res, 200, { success: true, message: "" });
}

/**
 * http_server.py resume_memory_occupation → scheduler_update_weights_mixin.py
 * resume_memory_occupation: `self.offload_tags.remove(tag)` for each tag (a KeyError for one not
 * released, which kills the real scheduler; the fake answers 500 and records it), then resumes it.
 */
export function resumeMemory(b: Record<string, unknown>, res: ServerResponse): void {
  const tags = tagsOf(b);
  stats.calls.push(`resume_memory_occupation:${tags.join(",")}`);
  const missing = tags.filter((t) => !st.offloadTags.has(t));
  if (missing.length > 0) {
    stats.memoryFaults.push(`resume of ${missing.join(",")} not released`);
    return send(res, 500, { success: false, message: `KeyError: '${missing[0]}'` });
  }
  for (const t of tags) st.offloadTags.delete(t);
  stats.resumes++;
  send(res, 200, { success: true, message: "" });
}

/** http_server.py flush_cache (GET or POST): 200 or 400, plain text; the scheduler refuses while requests run or wait. */
export function flushCache(res: ServerResponse): void {
  // An aborted request still counts until the scheduler's next step drops it: flush right after an
  // abort can fail, which is why slime retries.
  const isBusy = live.size > 0 && !(st.paused && st.pauseMode === "retract");
  const text =
    "Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting requests, the operation will not be performed.)\n";
  if (isBusy) stats.flushRefused++;
  else stats.flushes++;
  res.writeHead(isBusy ? 400 : 200, { "content-type": "text/plain; charset=utf-8", "content-length": Buffer.byteLength(text) });
  res.end(text);
}
