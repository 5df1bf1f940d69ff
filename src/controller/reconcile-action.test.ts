import { describe, expect, it } from "vitest";
import { reconcileAction } from "./controller.ts";
import { UNRECOVERABLE_PREFIX } from "../queue/payloads.ts";
import type { JobInfo } from "../queue/queues.ts";

const info = (state: JobInfo["state"], failedReason: string | null = null): JobInfo => ({ state, failedReason, attemptsMade: 1, progress: null });

describe("reconcileAction: an expected job whose fact is missing", () => {
  it("adds a missing job and replaces a completed one or one in no queue list", () => {
    expect(reconcileAction("rollout", info("missing"), false)).toBe("add");
    expect(reconcileAction("reward", info("completed"), false)).toBe("replace");
    // A job record left in no list (a partial loss of the queue state): BullMQ ignores an add of its id.
    expect(reconcileAction("train", info("unknown"), false)).toBe("replace");
  });

  it("leaves waiting, active and delayed jobs to the workers", () => {
    for (const state of ["waiting", "active", "delayed", "prioritized", "waiting-children"] as const) {
      expect(reconcileAction("rollout", info(state), false)).toBe("none");
    }
  });

  it("retries a failed job; an unrecoverable failure or a failed train job pauses the run, except while resuming", () => {
    expect(reconcileAction("rollout", info("failed", "engine_unreachable: x"), false)).toBe("retry");
    expect(reconcileAction("rollout", info("failed", `${UNRECOVERABLE_PREFIX}bad plugin`), false)).toBe("pause");
    expect(reconcileAction("train", info("failed", "trainer_unreachable"), false)).toBe("pause");
    expect(reconcileAction("train", info("failed", "trainer_unreachable"), true)).toBe("retry");
    expect(reconcileAction("reward", info("failed", `${UNRECOVERABLE_PREFIX}bad plugin`), true)).toBe("retry");
  });
});
