/**
 * The rollout workers' reading of a colocated run's turns (core/colocate.ts `foldColocateTurn`,
 * loaded by store/colocate-turn.ts from the run's last `step.started` on) against the controller's
 * own, over the recorded colocated run (test/fixtures/decision-logs/colocate.json): after every
 * decision, the workers' pools may check the engines exactly when the controller's fold says they
 * are resident with no release coming (`shouldLoadOnStart`, the same question for a restarted
 * controller), and the tail a worker loads folds to the turn the whole log does.
 */
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { parseDecision, type LoggedDecision } from "../../src/core/decisions.ts";
import { fold } from "../../src/core/run-state.ts";
import { colocateTurnKinds, foldColocateTurn, shouldLoadOnStart } from "../../src/core/colocate.ts";

const rows = JSON.parse(readFileSync(join(import.meta.dirname, "../fixtures/decision-logs/colocate.json"), "utf8")) as Array<{
  seq: number;
  kind: string;
  payload: unknown;
}>;
const log: LoggedDecision[] = rows.map((r) => parseDecision(r.kind, r.payload, r.seq));
const isTurnKind = (d: LoggedDecision) => (colocateTurnKinds as readonly string[]).includes(d.kind);

/** What store/colocate-turn.ts `loadColocateTurn` reads: the turn's kinds from the last step.started on. */
function workerTail(prefix: LoggedDecision[]): LoggedDecision[] {
  const turnKinds = prefix.filter(isTurnKind);
  let from = 0;
  turnKinds.forEach((d, i) => {
    if (d.kind === "step.started") from = i;
  });
  return turnKinds.slice(from);
}

describe("colocated turns: the workers' reading of the log against the controller's", () => {
  it("after every decision of a recorded colocated run, the engines' turn is exactly resident with no release coming", () => {
    expect(fold("r", log).config.colocate).toBe(true);
    const turns = new Set<string>();
    for (let n = 1; n <= log.length; n++) {
      const prefix = log.slice(0, n);
      const turn = foldColocateTurn(prefix);
      turns.add(turn);
      expect(foldColocateTurn(workerTail(prefix)), `after seq ${n - 1}`).toBe(turn);
      const state = fold("r", prefix);
      expect(turn === "engines", `after seq ${n - 1} (${prefix[n - 1]?.kind}): phase ${state.phase}, memory ${state.engineMemory}`).toBe(
        shouldLoadOnStart(state),
      );
    }
    expect([...turns].sort()).toEqual(["engines", "release_due", "released", "weights"]);
  });
});
