import type { Member } from "./pool-types.ts";
import { RlqError, errorMessage } from "../lib/errors.ts";

/** What the pool's weight-version operations read and change (the pool owns the state). */
export interface PoolVersionContext {
  members: readonly Member[];
  now: () => number;
  healthIntervalMs: number;
  ensureStarted(): void;
  markDead(m: Member, reason: string): void;
  wakeWaiters(): void;
  /** Remember the checkpoint loaded last: engines re-admitted later load it. */
  setReload(reload: { version: number; uri: string }): void;
  /** Route only to `version` from now on; health checks no longer move it. */
  pin(version: number): void;
}

/** Marks healthy engines on another version stale (they are not routed to). */
function markStale(members: readonly Member[], version: number): void {
  for (const m of members) if (m.state === "healthy" && m.version !== version) m.state = "stale";
}

/**
 * `loadWeights` (disk sync: the pool loads a checkpoint into every live engine),
 * `awaitVersion` (trainer_push: wait for every live engine to report a version)
 * and `setCurrentVersion`.
 */
export function createVersionOps(ctx: PoolVersionContext) {
  const { members, now } = ctx;
  return {
    loadWeights: async (version: number, uri: string, onEngineLoaded?: (engineId: string) => void): Promise<void> => {
      ctx.ensureStarted();
      ctx.setReload({ version, uri });
      const live = members.filter((m) => m.state !== "dead" && m.state !== "refused" && m.engine.canLoadWeights);
      const results = await Promise.allSettled(
        live.map(async (m) => {
          const was = m.state;
          m.state = "loading";
          try {
            await m.engine.loadWeights(version, uri);
            m.version = version;
            m.state = "healthy";
            onEngineLoaded?.(m.engine.id);
          } catch (e) {
            m.state = was === "loading" ? "stale" : was;
            throw e;
          }
        }),
      );
      const failures = results.flatMap((r, i) => (r.status === "rejected" ? [{ m: live[i] as Member, e: r.reason as unknown }] : []));
      for (const { m, e } of failures) ctx.markDead(m, `loading version ${version} failed: ${errorMessage(e)}`);
      ctx.pin(version);
      markStale(members, version);
      ctx.wakeWaiters();
      if (failures.length === live.length && live.length > 0) {
        const first = failures[0]?.e;
        throw new RlqError("engine_load_failed", `no engine loaded version ${version} (${uri}): ${errorMessage(first)}`, {
          cause: first,
          isRetriable: !(first instanceof RlqError) || first.isRetriable,
        });
      }
    },
    setCurrentVersion: (version: number): void => {
      ctx.pin(version);
      markStale(members, version);
      ctx.wakeWaiters();
    },
    awaitVersion: async (version: number, timeoutMs: number): Promise<{ engines: string[] }> => {
      ctx.ensureStarted();
      const deadline = now() + timeoutMs;
      // Fenced engines cannot report versions; the trainer's report is the evidence.
      for (const m of members) m.engine.setVersion?.(version);
      for (;;) {
        await Promise.all(
          members.map(async (m) => {
            if (m.state === "dead" || m.state === "refused") return;
            try {
              m.version = await m.engine.weightVersion();
            } catch (e) {
              ctx.markDead(m, errorMessage(e));
            }
          }),
        );
        const live = members.filter((m) => m.state !== "dead" && m.state !== "refused");
        if (live.length > 0 && live.every((m) => m.version === version)) {
          ctx.pin(version);
          for (const m of live) if (m.state === "stale" || m.state === "starting") m.state = "healthy";
          ctx.wakeWaiters();
          return { engines: live.map((m) => m.engine.id) };
        }
        if (now() > deadline) {
          const states = members.map((m) => `${m.engine.id}=${m.state}@v${m.version ?? "?"}`).join(", ");
          throw new RlqError("engine_version_timeout", `engines did not all report version ${version} within ${timeoutMs} ms: ${states}`, {
            isRetriable: true,
          });
        }
        await new Promise((r) => setTimeout(r, Math.min(500, ctx.healthIntervalMs)).unref?.());
      }
    },
  };
}
