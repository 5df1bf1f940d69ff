import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createWorld, type World } from "../helpers/run-fixture.ts";
import { spawnRlq, waitFor } from "../helpers/processes.ts";
import { visionChatTokenizerDir } from "../helpers/chat-tokenizer.ts";
import { solidPng } from "../helpers/png.ts";
import { fakeStats } from "../fakes/fake-engine-control.ts";
import { sha256Hex } from "../../src/lib/hash.ts";
import { startRun } from "../../src/api.ts";

/**
 * Images from the dataset to the engine and into the history: a short run on the fake SGLang
 * (which folds the images' hashes into its answer and records them per request), SIGKILLed while
 * it generates and resumed.
 */
describe("a run with images (multimodal_keys)", () => {
  let w: World;
  beforeAll(async () => {
    w = await createWorld("images", { engineArgs: ["--token-delay-ms", "2"] });
  });
  afterAll(async () => {
    await w?.close();
  });

  it("sends each prompt's images with every segment, records their hashes in drawn_prompts, and resumes after a SIGKILL with them", async () => {
    const dir = join(w.home, "data");
    mkdirSync(join(dir, "img"), { recursive: true });
    const pngs = [solidPng([255, 0, 0]), solidPng([0, 0, 255]), solidPng([0, 255, 0])];
    pngs.forEach((p, i) => writeFileSync(join(dir, "img", `${i}.png`), p));
    const rows = Array.from({ length: 8 }, (_, i) => ({
      input: `Q${i}: ${i} + ${i} =`,
      label: String(2 * i),
      // Row 7 carries its image inline: it is kept under RLQ_HOME/images by hash.
      images: i === 7 ? [`data:image/png;base64,${(pngs[2] as Buffer).toString("base64")}`] : [`img/${i % 2}.png`],
    }));
    rows.push({ input: "Q8: missing", label: "0", images: ["img/none.png"] });
    const data = join(dir, "d.jsonl");
    writeFileSync(data, rows.map((r) => JSON.stringify(r)).join("\n"));
    // startRun loads the dataset in this process: its inline images go to the world's RLQ_HOME.
    process.env.RLQ_HOME = w.home;
    const { runId, datasetErrors } = await startRun(w.db, {
      config: w.baseConfig({
        prompt_data: data,
        multimodal_keys: { image: "images" },
        apply_chat_template: true,
        hf_checkpoint: visionChatTokenizerDir(),
        num_rollout: 2,
        partial_rollout: true,
        dynamic_sampling_filter_path: null,
        rollout_max_response_len: 48,
      }),
    });
    // The row whose image is missing is a bad row, named by line and key; the run goes on.
    expect(datasetErrors).toEqual([expect.stringMatching(/d\.jsonl:9: multimodal key 'images'\[0\]: image img\/none\.png cannot be read/)]);

    let up = spawnRlq(["up", "--run", runId], w.env);
    await waitFor(
      "segments to be generated",
      async () => (await w.db.pool.query("SELECT count(*)::int AS n FROM sample_segments WHERE run_id = $1", [runId])).rows[0].n > 0,
      60_000,
      50,
    );
    up.kill("SIGKILL");
    await up.exited;
    up = spawnRlq(["up", "--run", runId, "--exit-when-done"], w.env);
    expect(await up.exited, up.output()).toBe(0);

    const steps = await w.db.pool.query("SELECT step FROM train_steps WHERE run_id = $1 ORDER BY step", [runId]);
    expect(steps.rows.map((r) => r.step)).toEqual([0, 1]);

    // The history: each drawn prompt's images by hash and origin, queryable in SQL.
    const imgs = await w.db.pool.query(
      `SELECT p.dataset_index, i->>'sha256' AS sha, i->>'origin' AS origin, i->>'source' AS source, i->>'path' AS path
         FROM drawn_prompts p, jsonb_array_elements(p.images) i WHERE p.run_id = $1 ORDER BY p.draw_ordinal`,
      [runId],
    );
    expect(imgs.rows.length).toBeGreaterThan(0);
    for (const r of imgs.rows) {
      const i = r.dataset_index as number;
      if (i === 7)
        expect(r).toMatchObject({
          sha: sha256Hex(pngs[2] as Buffer),
          origin: "data_uri",
          source: null,
          path: join(w.home, "images", sha256Hex(pngs[2] as Buffer)),
        });
      else expect(r).toMatchObject({ sha: sha256Hex(pngs[i % 2] as Buffer), origin: "path", source: `img/${i % 2}.png` });
    }
    const noImages = await w.db.pool.query("SELECT count(*)::int AS n FROM drawn_prompts WHERE run_id = $1 AND images = '[]'::jsonb", [runId]);
    expect(noImages.rows[0].n).toBe(0);

    // Every segment generated (before and after the kill) was requested with its prompt's images.
    const segs = await w.db.pool.query(
      `SELECT s.group_id, s.sample_index, s.segment_index, p.images->0->>'sha256' AS sha
         FROM sample_segments s JOIN drawn_prompts p ON p.run_id = s.run_id AND p.draw_ordinal = s.group_id
        WHERE s.run_id = $1 AND s.token_end > s.token_start`,
      [runId],
    );
    const seen = (await fakeStats(w.engine.url)).imagesSeen;
    const shaByRid = new Map(Object.entries(seen).map(([rid, h]) => [rid, h[0]]));
    expect(segs.rows.length).toBeGreaterThan(0);
    for (const s of segs.rows) {
      const hit = [...shaByRid.keys()].find((rid) => rid.startsWith(`${runId}-${s.group_id}-${s.sample_index}-${s.segment_index}.`));
      expect(hit, `segment ${s.group_id}/${s.sample_index}/${s.segment_index}`).toBeDefined();
      expect(shaByRid.get(hit as string)).toBe(s.sha);
    }
  });
});
