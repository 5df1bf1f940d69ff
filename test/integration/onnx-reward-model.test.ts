import { execFile } from "node:child_process";
import { copyFileSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { fixtureModel, repoRoot, venvPython } from "../../scripts/real-stack.ts";
import { loadOnnxRewardModel, mathReward } from "../../src/reward/index.ts";
import { createWorld, type World } from "../helpers/run-fixture.ts";
import { spawnRlq } from "../helpers/processes.ts";

/**
 * `rm_type: onnx_rm` against the real exporter and the real runtime: scripts/export-reward-model.py exports a tiny
 * random reward model (rlq_torch/reward_model.py, torch.onnx.export) over the fixture model's tokenizer and writes
 * torch's scores of a few texts; onnxruntime-node, reading the same directory (its tokenizer.json and max_length),
 * must give the same scores. Then a run rewarded by that model alone records, for each sample, the model's score of
 * its prompt and response. The long demonstration (a trained model that raises the task reward) is a script:
 * scripts/grpo-with-reward-model.ts.
 */
const run = promisify(execFile);
const MAX_LENGTH = 12;
const TEXTS = [
  "<|im_start|>user\n13+81=<|im_end|>\n<|im_start|>assistant\n\\boxed{94}<|im_end|>", // longer than MAX_LENGTH: cut
  "13+81=\\boxed{95}",
  "7",
  "99+99=\\boxed{198}",
  "52+34=",
];

let tmp: string;
let modelDir: string;
let torchScores: number[];
let python: string;

beforeAll(async () => {
  python = venvPython();
  const tokenizerDir = await fixtureModel(python);
  tmp = mkdtempSync(join(tmpdir(), "rlq-onnx-rm-"));
  modelDir = join(tmp, "rm");
  writeFileSync(join(tmp, "texts.json"), JSON.stringify(TEXTS));
  await run(
    python,
    [
      "scripts/export-reward-model.py",
      "--tiny",
      "--tokenizer-dir",
      tokenizerDir,
      "--out",
      modelDir,
      "--max-length",
      String(MAX_LENGTH),
      "--texts",
      join(tmp, "texts.json"),
      "--scores-out",
      join(tmp, "scores.json"),
    ],
    { cwd: repoRoot, maxBuffer: 1 << 24 },
  );
  torchScores = (JSON.parse(readFileSync(join(tmp, "scores.json"), "utf8")) as { scores: number[] }).scores;
}, 300_000);

afterAll(() => {
  if (tmp) rmSync(tmp, { recursive: true, force: true });
});

describe("an ONNX reward model exported by torch, scored by onnxruntime-node", () => {
  it("scores the texts as torch does within 1e-4, in batches of any size, with max_length from the directory", async () => {
    expect(torchScores).toHaveLength(TEXTS.length);
    for (const batchSize of [1, 2, 32]) {
      const model = await loadOnnxRewardModel(modelDir, { batchSize });
      expect(model.maxLength).toBe(MAX_LENGTH);
      const scores = await model.scoreTexts(TEXTS);
      await model.close();
      scores.forEach((s, i) => expect(Math.abs(s - (torchScores[i] as number)), `text ${i}, batch ${batchSize}`).toBeLessThan(1e-4));
    }
    // The scores differ by text: the comparison is not one constant against itself.
    expect(new Set(torchScores.map((s) => s.toFixed(4))).size).toBe(TEXTS.length);
  });

  it("refuses a directory without the model file, or whose graph gives the wrong shape, naming the file", async () => {
    const noModel = join(tmp, "no-model");
    const badShape = join(tmp, "bad-shape");
    for (const d of [noModel, badShape]) {
      await run("mkdir", ["-p", d]);
      for (const f of ["reward_model.json", "tokenizer.json", "tokenizer_config.json"]) copyFileSync(join(modelDir, f), join(d, f));
    }
    await expect(loadOnnxRewardModel(noModel)).rejects.toMatchObject({ code: "model_invalid", message: expect.stringMatching(/model\.onnx does not exist/) });
    await expect(loadOnnxRewardModel(join(tmp, "nowhere"))).rejects.toMatchObject({
      code: "model_invalid",
      message: expect.stringMatching(/reward_model\.json does not exist/),
    });

    // A graph that gives [B, T] (a score per token) instead of [B]: onnx's own builder, real onnxruntime.
    const build = [
      "import onnx, sys",
      "from onnx import helper as h, TensorProto as T",
      "i = [h.make_tensor_value_info(n, T.INT64, ['b', 't']) for n in ('input_ids', 'attention_mask')]",
      "o = h.make_tensor_value_info('scores', T.FLOAT, ['b', 't'])",
      "g = h.make_graph([h.make_node('Cast', ['attention_mask'], ['scores'], to=T.FLOAT)], 'g', i, [o])",
      "onnx.save(h.make_model(g, opset_imports=[h.make_opsetid('', 17)], ir_version=8), sys.argv[1])",
    ].join("\n");
    await run(python, ["-c", build, join(badShape, "model.onnx")]);
    const bad = await loadOnnxRewardModel(badShape);
    await expect(bad.scoreTexts(["13+81=", "7"])).rejects.toMatchObject({
      code: "model_invalid",
      message: expect.stringMatching(/float32 \[2, \d+\]; expected float32 \[2\]/),
    });
    await bad.close();
  });
});

describe("a run rewarded by rm_type onnx_rm alone", () => {
  let w: World;
  beforeAll(async () => {
    w = await createWorld("onnxrm", { engineArgs: ["--token-delay-ms", "1"] });
  });
  afterAll(async () => {
    await w?.close();
  });

  it("completes, and each sample's recorded reward is the model's score of its prompt and response", async () => {
    const runId = await w.start({ num_rollout: 2, custom_rm_path: null, rm_type: "onnx_rm", rm_model_path: modelDir });
    const up = spawnRlq(["up", "--run", runId, "--exit-when-done"], w.env);
    expect(await up.exited, up.output()).toBe(0);
    const steps = await w.db.pool.query("SELECT step FROM train_steps WHERE run_id = $1 ORDER BY step", [runId]);
    expect(steps.rows.map((r) => r.step)).toEqual([0, 1]);
    const rows = (await w.db.pool.query("SELECT prompt, response, reward FROM rollout_history WHERE run_id = $1 AND reward IS NOT NULL", [runId]))
      .rows as Array<{
      prompt: string;
      response: string;
      reward: number;
    }>;
    expect(rows.length).toBeGreaterThanOrEqual(32);
    const model = await loadOnnxRewardModel(modelDir);
    const scores = await model.score(rows);
    await model.close();
    rows.forEach((r, i) => expect(Math.abs(r.reward - (scores[i] as number)), `sample ${i}`).toBeLessThan(1e-5));
  }, 240_000);

  it("as one component of a multi-component reward (examples/reward-model/rm-plus-math.ts): score = rm + math grade", async () => {
    const runId = await w.start({
      num_rollout: 1,
      engine: { kind: "sglang", urls: [await w.freshEngine()] },
      custom_rm_path: join(repoRoot, "examples/reward-model/rm-plus-math.ts"),
      group_rm: true,
      reward_key: "score",
      rm_model_path: modelDir,
    });
    const up = spawnRlq(["up", "--run", runId, "--exit-when-done"], w.env);
    expect(await up.exited, up.output()).toBe(0);
    const rows = (
      await w.db.pool.query(
        "SELECT h.prompt, h.response, d.label, h.reward, h.reward_components FROM rollout_history h JOIN drawn_prompts d USING (run_id, draw_ordinal) WHERE h.run_id = $1 AND h.reward IS NOT NULL",
        [runId],
      )
    ).rows as Array<{ prompt: string; response: string; label: string | null; reward: number; reward_components: { rm: number; acc: number; score: number } }>;
    expect(rows.length).toBeGreaterThanOrEqual(16);
    const model = await loadOnnxRewardModel(modelDir);
    const scores = await model.score(rows);
    await model.close();
    rows.forEach((r, i) => {
      expect(Math.abs(r.reward_components.rm - (scores[i] as number)), `sample ${i}`).toBeLessThan(1e-5);
      expect(r.reward_components.acc).toBe(mathReward({ response: r.response, label: r.label }));
      expect(r.reward).toBeCloseTo(r.reward_components.rm + r.reward_components.acc, 6);
    });
  }, 240_000);
});
