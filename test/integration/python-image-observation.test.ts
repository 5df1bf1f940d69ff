import { spawnSync } from "node:child_process";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createWorld, type World } from "../helpers/run-fixture.ts";
import { repoRoot } from "../helpers/processes.ts";
import {
  RED_PNG,
  engineImagesBySegment,
  expectBatchImages,
  imageObservationConfig,
  segmentsBySample,
  type SegmentRow,
  writeRedImagePrompts,
} from "../helpers/image-observation.ts";
import { requirePythonModules } from "../helpers/python.ts";
import { SLIME_PLUGINS } from "../helpers/slime-plugins.ts";
import { sha256Hex } from "../../src/lib/hash.ts";
import { runUntilDone } from "../../src/index.ts";
import { closePythonHosts } from "../../src/plugins/python.ts";

/**
 * A slime VLM multi-turn generate function (test/fixtures/slime/plugins/my_vlm_agent.py, written
 * as slime's geo3k_vlm_multi_turn rollout is) run unmodified by rlq's plugin host, in the
 * environment's Python (Pillow). It gets the prompt's image as a PIL image in
 * sample.multimodal_inputs["images"], posts image_data as slime encodes it (base64 PNG), and adds a
 * screenshot observation that Pillow draws: the fake SGLang (which records each request's images
 * by hash) must see [prompt image] then [prompt image, screenshot]; the history records the
 * screenshot on the observation's segment; the train batch carries both images.
 */
const VLM_AGENT = `py:${SLIME_PLUGINS}/my_vlm_agent.py`;
let w: World;
let python: string;
let dir: string;
let promptData: string;
const redSha = sha256Hex(RED_PNG);

beforeAll(async () => {
  python = requirePythonModules(["PIL"]);
  w = await createWorld("pyimgobs");
  dir = join(w.home, "data");
  promptData = writeRedImagePrompts(dir, 2);
  process.env.RLQ_HOME = w.home;
  process.env.RLQ_PLUGIN_PYTHON = python;
});
afterAll(async () => {
  closePythonHosts();
  delete process.env.RLQ_PLUGIN_PYTHON;
  await w?.close();
});

async function run(fn: string) {
  const engineUrl = await w.freshEngine();
  const result = await runUntilDone(
    w.baseConfig({ ...imageObservationConfig(promptData, `${VLM_AGENT}:${fn}`), engine: { kind: "sglang", urls: [engineUrl] } }),
    { env: { ...w.env, RLQ_HOME: w.home, RLQ_PLUGIN_PYTHON: python }, baseDir: repoRoot },
  );
  return { ...result, engineUrl };
}

/** Pillow's own reading of a stored image: its mode, size and top-left pixel. */
function pixelOf(path: string): string {
  const r = spawnSync(python, ["-c", "import sys; from PIL import Image; im = Image.open(sys.argv[1]); print(im.mode, im.size, im.getpixel((0, 0)))", path], {
    encoding: "utf8",
  });
  if (r.status !== 0) throw new Error(r.stderr);
  return r.stdout.trim();
}

function expectScreenshot(image: Record<string, unknown> | undefined): string {
  expect(image).toMatchObject({ type: "image", key: "observation", mime: "image/png", origin: "data_uri", source: null });
  expect(pixelOf(image?.path as string)).toBe("RGB (4, 4) (0, 255, 0)");
  return image?.sha256 as string;
}

describe("a slime VLM generate function (py:) with an image observation", () => {
  it("the engine sees [prompt image] then [prompt image, screenshot]; the segment records the screenshot; the batch carries both", async () => {
    const { runId, outcome, status, engineUrl } = await run("generate");
    expect(outcome, status.lastError ?? "").toBe("completed");
    const samples = await segmentsBySample(w.db, runId);
    expect(samples.size).toBe(4);
    const imagesOf = await engineImagesBySegment(engineUrl, runId);
    const screenshots = new Set<string>();
    for (const [key, list] of samples) {
      expect(
        list.map((r) => r.segment_index),
        key,
      ).toEqual([0, 1]);
      // The screenshot rides on segment 0, whose tail (the observation, placeholder included) is not trained on.
      expect(list[0]?.images, key).toHaveLength(1);
      const shot = expectScreenshot(list[0]?.images?.[0]);
      screenshots.add(shot);
      expect(list[0]?.loss_mask.at(-1), key).toBe(0);
      expect(list[1]?.images, key).toBeNull();
      const { group_id: g, sample_index: s } = list[0] as SegmentRow;
      // rlq sends its own copy of the prompt's image (the function re-encoded it through Pillow), then the screenshot.
      expect(imagesOf(g, s, 0), key).toEqual([redSha]);
      expect(imagesOf(g, s, 1), key).toEqual([redSha, shot]);
    }
    expect(screenshots.size).toBe(1); // Pillow encodes the same screenshot to the same bytes
    await expectBatchImages(w.db, runId, [redSha, ...screenshots]);
  });

  it("an observation after the last request: its image is read back from sample.multimodal_inputs['images'] onto the final tool turn", async () => {
    const { runId, outcome, status } = await run("generate_observation_last");
    expect(outcome, status.lastError ?? "").toBe("completed");
    const samples = await segmentsBySample(w.db, runId);
    expect(samples.size).toBe(4);
    const screenshots = new Set<string>();
    for (const [key, list] of samples) {
      expect(
        list.map((r) => r.segment_index),
        key,
      ).toEqual([0]);
      expect(list[0]?.images, key).toHaveLength(1);
      screenshots.add(expectScreenshot(list[0]?.images?.[0]));
    }
    expect(screenshots.size).toBe(1);
    await expectBatchImages(w.db, runId, [redSha, ...screenshots]);
  });

  it("without Pillow the host hands the images' file paths, and the shim's encode_image_for_rollout_engine sends their bytes as base64", () => {
    const script = [
      "import json, sys",
      "sys.modules['PIL'] = None  # as in a Python without Pillow",
      `sys.path.insert(0, ${JSON.stringify(join(repoRoot, "python/rlq_plugin_host"))})`,
      "import host",
      "from slime.utils.processing_utils import encode_image_for_rollout_engine",
      "images = host.open_images([sys.argv[1]])",
      "print(json.dumps({'images': images, 'encoded': [encode_image_for_rollout_engine(i) for i in images]}))",
    ].join("\n");
    const r = spawnSync(python, ["-c", script, join(dir, "red.png")], { encoding: "utf8" });
    expect(r.status, r.stderr).toBe(0);
    expect(JSON.parse(r.stdout)).toEqual({ images: [join(dir, "red.png")], encoded: [RED_PNG.toString("base64")] });
  });

  it("tokens holding an image placeholder whose image is never posted pause the run, naming image_data", async () => {
    const { outcome, status } = await run("generate_placeholder_without_image");
    expect(outcome).toBe("paused");
    expect(status.lastError).toMatch(
      /my_vlm_agent\.py:generate_placeholder_without_image \(sample \d+ of group \d+\) appended tokens holding 1 image placeholder\(s\) .* but posted no new image for them: post the images so far followed by the observation's in image_data/,
    );
  });
});
