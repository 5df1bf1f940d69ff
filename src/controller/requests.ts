import { LeaseLostError } from "../store/decision-log.ts";
import { projectRunInTx } from "../store/projections.ts";
import { markRunRequest, pendingRunRequests } from "../store/run-requests.ts";
import { checkAmend } from "../config/amend.ts";
import { withConfigVersion } from "../config/config-versions.ts";
import { isAsync } from "../core/run-state.ts";
import { errorMessage, RlqError } from "../lib/errors.ts";
import type { ControllerHost } from "./host.ts";

/**
 * Operator requests (pause, resume, cancel, amend) become decisions here, in
 * the order they were made; each request is marked with the seq it was
 * handled at, or with the error that refused it.
 */
export async function handleRequests(h: ControllerHost, reconcileOnResume: () => Promise<void>): Promise<void> {
  for (const r of await pendingRunRequests(h.deps.db, h.state.runId)) {
    // Each request sees the state the ones before it committed.
    const s = h.state;
    let error: string | null = null;
    try {
      if (r.kind === "pause" && s.status === "running") {
        await h.commit([{ kind: "run.status", payload: { status: "paused", reason: "paused by operator" } }]);
      } else if (r.kind === "resume" && s.status === "paused") {
        await h.commit([{ kind: "run.status", payload: { status: "running", reason: null } }]);
        await reconcileOnResume();
      } else if (r.kind === "cancel" && (s.status === "running" || s.status === "paused")) {
        await h.commit([{ kind: "run.status", payload: { status: "cancelled", reason: "cancelled by operator" } }]);
      } else if (r.kind === "amend") {
        const changes = (r.payload as { changes?: Record<string, unknown> }).changes ?? {};
        const next = checkAmend(changes, s.config, "amended config");
        if (isAsync(s) && next.num_rollout !== null) {
          // Async mode may have sealed steps ahead of the trainer: they are decided, so they are trained.
          const sealed = s.lastTrainedStep + 1 + (s.training !== null ? 1 : 0) + s.trainQueue.length;
          if (next.num_rollout < sealed)
            throw new RlqError(
              "amend_refused",
              `num_rollout ${next.num_rollout} is below the ${sealed} step(s) already sealed; the smallest allowed is ${sealed}`,
            );
        }
        // Both recorded with this rlq's config version, so a later rlq upgrades them (config/config-versions.ts).
        const amended = withConfigVersion({ ...s.config, ...changes });
        await h.commit([{ kind: "run.amended", payload: { changes: withConfigVersion(changes) } }], (tx) => projectRunInTx(tx, s.runId, { config: amended }));
      }
    } catch (e) {
      if (e instanceof LeaseLostError) throw e;
      error = errorMessage(e);
    }
    await markRunRequest(h.deps.db, r.id, h.state.seq, error);
  }
}
