import type { Services } from "../runtime/services.ts";
import { defaultConcurrency, startWorkers } from "../runtime/workers.ts";
import { loadEmbedded } from "../runtime/embedded.ts";
import { runController, type ControllerExit } from "../controller/controller.ts";
import { listRuns } from "../store/run-facts.ts";
import { queueKinds, type QueueKind } from "../queue/payloads.ts";

/**
 * `rlq up`: every worker and the controllers of the active runs (or of one
 * run) in one process. A run whose lease another process holds waits here
 * as standby. SIGTERM finishes active jobs and exits.
 */
export async function runUp(
  s: Services,
  options: { runId: string | null; exitWhenDone: boolean; signal: AbortSignal; workers?: readonly QueueKind[] },
): Promise<number> {
  const workers = await startWorkers(s, options.workers ?? queueKinds, {
    concurrency: defaultConcurrency,
    embedded: await loadEmbedded(),
  });
  const active = new Map<string, Promise<ControllerExit>>();
  const finished = new Set<string>();
  const stopAll = new AbortController();
  options.signal.addEventListener("abort", () => stopAll.abort(), { once: true });
  const launch = (runId: string) => {
    if (active.has(runId) || finished.has(runId)) return;
    const p = runController({ db: s.db, queues: s.queues, contexts: s.contexts, log: s.log, holder: s.holder, crashPoint: (name) => s.crashPoint(name) }, runId, stopAll.signal)
      .catch((e: unknown) => {
        s.log.error({ runId, err: (e as Error).message }, "controller stopped with an error");
        const exit: ControllerExit = "stopped";
        return exit;
      })
      .then((exit) => {
        active.delete(runId);
        if (exit === "completed" || exit === "cancelled" || exit === "stopped") finished.add(runId);
        s.log.info({ runId, exit }, "controller exited");
        return exit;
      });
    active.set(runId, p);
  };
  try {
    while (!stopAll.signal.aborted) {
      if (options.runId) launch(options.runId);
      else for (const r of await listRuns(s.db)) if (r.status === "running" || r.status === "paused") launch(r.id);
      if (options.exitWhenDone && active.size === 0 && finished.size > 0) break;
      await new Promise((r) => setTimeout(r, 1000));
    }
  } finally {
    stopAll.abort();
    await Promise.all(active.values());
    await workers.close();
  }
  return 0;
}
