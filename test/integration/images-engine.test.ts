import { describe, expect, it } from "vitest";
import { engineHarness } from "../helpers/engine-harness.ts";
import { solidPng } from "../helpers/png.ts";
import { createSglangServer } from "../../src/engines/sglang.ts";
import { sha256Hex } from "../../src/lib/hash.ts";
import { fakeStats, request } from "../fakes/fake-engine-control.ts";

/**
 * Images reach SGLang as `image_data` (python/sglang/srt/managers/io_struct.py GenerateReqInput),
 * through the fake SGLang, which loads them as utils.py load_image does and folds their hashes into
 * its answer (test/fakes/sglang/generate.ts imagesOf).
 */
const h = engineHarness("sglang");
const uri = (png: Buffer) => `data:image/png;base64,${png.toString("base64")}`;

describe("SGLang image_data", () => {
  it("sends each request's images in order; the answer depends on their bytes", async () => {
    const f = await h.fake(["--stop-prob", "0"]);
    const p = h.pool([createSglangServer({ url: f.url, requestTimeoutMs: 10_000 })], { healthTimeoutMs: 2_000 });
    await p.awaitReady(10_000);
    const red = solidPng([255, 0, 0]);
    const blue = solidPng([0, 0, 255]);
    const gen = async (id: string, images?: Buffer[]) =>
      (await p.generate({ ...request(id, { maxNewTokens: 8, seed: 11 }), ...(images ? { imageData: images.map(uri) } : {}) })).tokenIds;

    const none = await gen("none");
    const r1 = await gen("red-1", [red]);
    const r2 = await gen("red-2", [red]);
    const b = await gen("blue", [blue]);
    const rb = await gen("red-blue", [red, blue]);
    expect(r1).toEqual(r2);
    expect(r1).not.toEqual(none);
    expect(b).not.toEqual(r1);
    expect(rb).not.toEqual(r1);
    const seen = (await fakeStats(f.url)).imagesSeen;
    // The pool sends rid `<requestId>.a<attempt>.`; find each request's entry by its id.
    const of = (id: string) => Object.entries(seen).find(([rid]) => rid.startsWith(`${id}.`))?.[1];
    expect(of("red-1")).toEqual([sha256Hex(red)]);
    expect(of("red-blue")).toEqual([sha256Hex(red), sha256Hex(blue)]);
    expect(of("none")).toBeUndefined();
  });

  it("engine.batch_group: a batch /generate carries one image list per item, each answered as if sent alone", async () => {
    const f = await h.fake(["--stop-prob", "0"]);
    const batched = h.pool([createSglangServer({ url: f.url, requestTimeoutMs: 10_000, isStreaming: false, isBatchingGroups: true })], {
      healthTimeoutMs: 2_000,
    });
    await batched.awaitReady(10_000);
    const red = solidPng([255, 0, 0]);
    const blue = solidPng([0, 0, 255]);
    const asked = [[red], [], [blue, red]].map((imgs, i) => ({
      ...request(`b-${i}`, { maxNewTokens: 8, seed: 5, sessionKey: "g" }),
      batchKey: "g",
      ...(imgs.length ? { imageData: imgs.map(uri) } : {}),
    }));
    const got = await Promise.all(asked.map((r) => batched.generate(r)));
    expect((await fakeStats(f.url)).batches).toBe(1);
    const alone = createSglangServer({ url: f.url, requestTimeoutMs: 10_000 });
    for (const [i, r] of asked.entries()) expect(got[i]?.tokenIds).toEqual((await alone.generate({ ...r, requestId: `alone-${i}` })).tokenIds);
    expect(got[0]?.tokenIds).not.toEqual(got[1]?.tokenIds);
  });
});
