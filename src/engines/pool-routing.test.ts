import { describe, expect, it } from "vitest";
import { AffinityMap, pickEngine, RoutingView } from "./pool-routing.ts";
import type { Member } from "./pool-types.ts";

const c = (id: string, outstanding: number, limit = 4) => ({ id, outstanding, limit });

describe("pickEngine", () => {
  it("picks the engine with the fewest outstanding requests", () => {
    expect(pickEngine([c("a", 3), c("b", 1), c("c", 2)], undefined, 0)).toEqual({ kind: "engine", id: "b" });
  });

  it("breaks ties round-robin", () => {
    const seen = [0, 1, 2, 3].map((r) => pickEngine([c("a", 0), c("b", 0)], undefined, r));
    expect(seen.map((d) => (d.kind === "engine" ? d.id : d.kind))).toEqual(["a", "b", "a", "b"]);
  });

  it("respects the per-engine cap and waits when every engine is full", () => {
    expect(pickEngine([c("a", 4), c("b", 3)], undefined, 0)).toEqual({ kind: "engine", id: "b" });
    expect(pickEngine([c("a", 4), c("b", 4)], undefined, 0)).toEqual({ kind: "wait" });
    expect(pickEngine([], undefined, 0)).toEqual({ kind: "none" });
  });

  it("keeps a session on its engine, waiting for a slot there rather than moving", () => {
    expect(pickEngine([c("a", 3), c("b", 0)], "a", 0)).toEqual({ kind: "engine", id: "a" });
    expect(pickEngine([c("a", 4), c("b", 0)], "a", 0)).toEqual({ kind: "wait" });
    // Its engine left the rotation: least outstanding again.
    expect(pickEngine([c("b", 2), c("c", 1)], "a", 0)).toEqual({ kind: "engine", id: "c" });
  });
});

describe("AffinityMap", () => {
  it("forgets the oldest sessions past its bound and an engine's sessions when it leaves", () => {
    const m = new AffinityMap(2);
    m.set("s1", "a");
    m.set("s2", "b");
    m.set("s1", "a"); // refreshed
    m.set("s3", "a");
    expect(m.get("s2")).toBeUndefined();
    expect(m.get("s1")).toBe("a");
    m.forgetEngine("a");
    expect(m.size).toBe(0);
  });
});

describe("pickEngine over a RoutingView", () => {
  it("skips engines that are not routable or already failed this request, and says none when no engine is left", () => {
    const member = (id: string, inflight: number, ok = true) =>
      ({ engine: { id }, inflight: new Map(Array.from({ length: inflight }, (_, i) => [`r${i}`, {}])), reserved: 0, ok }) as unknown as Member & {
        ok: boolean;
      };
    const members = [member("a", 0, false), member("b", 2), member("c", 1)];
    const view = new RoutingView();
    const routable = (m: Member) => (m as Member & { ok: boolean }).ok;
    expect(pickEngine(view.update(members, 4, routable, new Set()), undefined, 0)).toEqual({ kind: "engine", id: "c" });
    // The same view, updated in place: c failed this request, and a's session prefers a dead engine.
    expect(pickEngine(view.update(members, 4, routable, new Set(["c"])), "a", 0)).toEqual({ kind: "engine", id: "b" });
    expect(pickEngine(view.update(members, 2, routable, new Set(["c"])), undefined, 0)).toEqual({ kind: "wait" });
    expect(pickEngine(view.update(members, 4, routable, new Set(["b", "c"])), undefined, 0)).toEqual({ kind: "none" });
    expect(pickEngine(view.update(members.slice(0, 1), 4, routable, new Set()), undefined, 0)).toEqual({ kind: "none" });
  });
});
