import { mkdirSync, mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { ByteWriter, parquetWrite, schemaFromColumnData } from "hyparquet-writer";
import { beforeAll, describe, expect, it } from "vitest";
import { loadHfTokenizer, type HfTokenizer } from "../engines/hf-tokenizer.ts";
import { sha256Hex } from "../lib/hash.ts";
import { chatTokenizerDir, visionChatTokenizerDir } from "../../test/helpers/chat-tokenizer.ts";
import { imagePlaceholderOf } from "./chat-template.ts";
import { solidPng } from "../../test/helpers/png.ts";
import { loadPromptData } from "./dataset.ts";
import { imageDataUri, readPromptImage } from "./images.ts";

const keys = { input_key: "question", label_key: "label", metadata_key: "metadata" };
const red = solidPng([255, 0, 0]);
const blue = solidPng([0, 0, 255]);
const PH = "<|vision_start|><|image_pad|><|vision_end|>";

let template: HfTokenizer;
beforeAll(async () => {
  template = await loadHfTokenizer(visionChatTokenizerDir());
});

function dir(): { root: string; store: string } {
  const root = mkdtempSync(join(tmpdir(), "rlq-img-"));
  mkdirSync(join(root, "imgs"));
  writeFileSync(join(root, "imgs", "red.png"), red);
  return { root, store: join(root, "store") };
}

const opts = (store: string) => ({ applyChatTemplate: true, chatTemplate: template, multimodalKeys: { image: "images" }, imageStoreDir: store });

describe("datasets with images (multimodal_keys)", () => {
  it("JSONL: paths relative to the dataset, base64 data URIs; a missing or non-image file is a bad row named by line and key", async () => {
    const { root, store } = dir();
    writeFileSync(join(root, "notimg.png"), "hello");
    const rows = [
      { question: "colour?", images: ["imgs/red.png"], label: "red" },
      { question: "two?", images: [`data:image/png;base64,${blue.toString("base64")}`, "imgs/red.png"], label: "blue" },
      { question: "missing", images: ["imgs/nope.png"], label: "x" },
      { question: "text only", label: "t" },
      { question: "junk", images: "notimg.png", label: "x" },
      { question: "url", images: ["https://example.com/a.png"], label: "x" },
    ];
    const path = join(root, "d.jsonl");
    writeFileSync(path, rows.map((r) => JSON.stringify(r)).join("\n"));
    const ds = await loadPromptData(path, keys, opts(store));

    expect(ds.rows.map((r) => r.line)).toEqual([1, 2, 4]);
    // The chat template puts one placeholder per image after the text, as slime's content parts do.
    expect(ds.rows[0]?.prompt).toBe(`<|im_start|>user\ncolour?${PH}<|im_end|>\n<|im_start|>assistant\n`);
    expect(ds.rows[1]?.prompt).toBe(`<|im_start|>user\ntwo?${PH}${PH}<|im_end|>\n<|im_start|>assistant\n`);
    expect(ds.rows[2]?.prompt).toBe(`<|im_start|>user\ntext only<|im_end|>\n<|im_start|>assistant\n`);
    expect(ds.rows[2]?.images).toEqual([]);

    const [a] = ds.rows[0]?.images ?? [];
    expect(a).toMatchObject({ type: "image", key: "images", origin: "path", source: "imgs/red.png", path: join(root, "imgs", "red.png"), mime: "image/png" });
    expect(a?.sha256).toBe(sha256Hex(red));
    const [b, c] = ds.rows[1]?.images ?? [];
    // An inline image is kept once, named by its hash, in the store directory.
    expect(b).toMatchObject({ origin: "data_uri", source: null, path: join(store, sha256Hex(blue)), sha256: sha256Hex(blue) });
    expect(readFileSync(b?.path as string).equals(blue)).toBe(true);
    expect(c?.sha256).toBe(sha256Hex(red));
    expect(imageDataUri(b!)).toBe(`data:image/png;base64,${blue.toString("base64")}`);

    expect(ds.errors).toHaveLength(3);
    expect(ds.errors[0]).toMatch(/d\.jsonl:3: multimodal key 'images'\[0\]: image imgs\/nope\.png cannot be read \(ENOENT/);
    expect(ds.errors[1]).toMatch(/d\.jsonl:5: multimodal key 'images': not an image .* of notimg\.png/);
    expect(ds.errors[2]).toMatch(/d\.jsonl:6: multimodal key 'images'\[0\]: https:\/\/example\.com\/a\.png is a URL/);

    // An image file changed after loading is refused, not sent silently.
    writeFileSync(join(root, "imgs", "red.png"), blue);
    expect(() => readPromptImage(a!)).toThrow(/changed since the dataset was loaded/);
  });

  it("Parquet: a binary column and Hugging Face {bytes, path} image structs", async () => {
    const { root, store } = dir();
    const columnData = [
      { name: "question", data: ["bytes", "struct-bytes", "struct-path", "struct-missing"], type: "STRING" as const },
      { name: "raw", data: [new Uint8Array(red), null, null, null], type: "BYTE_ARRAY" as const },
      {
        name: "img",
        data: [null, { bytes: new Uint8Array(blue), path: "blue.png" }, { bytes: null, path: "imgs/red.png" }, { bytes: null, path: "imgs/gone.png" }],
      },
      { name: "label", data: ["r", "b", "r", "x"], type: "STRING" as const },
    ];
    const writer = new ByteWriter();
    // The column type `datasets.Image` writes: struct<bytes: binary, path: string>.
    await parquetWrite({
      writer,
      columnData: columnData.map(({ name, data }) => ({ name, data })),
      schema: schemaFromColumnData({ columnData, schemaOverrides: {} }).flatMap((el) =>
        el.name === "img"
          ? [
              { name: "img", repetition_type: "OPTIONAL" as const, num_children: 2 },
              { name: "bytes", type: "BYTE_ARRAY" as const, repetition_type: "OPTIONAL" as const },
              { name: "path", type: "BYTE_ARRAY" as const, converted_type: "UTF8" as const, repetition_type: "OPTIONAL" as const },
            ]
          : [el],
      ),
    });
    const path = join(root, "d.parquet");
    writeFileSync(path, new Uint8Array(writer.getBuffer()));
    // Two media keys are not allowed by the run config, but the loader reads any list of keys: one key per column here.
    const ds = await loadPromptData(path, keys, { ...opts(store), multimodalKeys: { image: "raw" } });
    expect(ds.rows.map((r) => r.images?.map((i) => [i.origin, i.sha256]))).toEqual([[["bytes", sha256Hex(red)]], [], [], []]);
    const ds2 = await loadPromptData(path, keys, { ...opts(store), multimodalKeys: { image: "img" } });
    expect(ds2.rows.map((r) => r.line)).toEqual([1, 2, 3]);
    expect(ds2.rows.map((r) => r.images?.map((i) => [i.origin, i.sha256]))).toEqual([[], [["bytes", sha256Hex(blue)]], [["path", sha256Hex(red)]]]);
    expect(ds2.errors).toEqual([expect.stringMatching(/d\.parquet#row 4: multimodal key 'img': image imgs\/gone\.png cannot be read/)]);
  });

  it("refuses multimodal_keys without apply_chat_template", async () => {
    const { root, store } = dir();
    const path = join(root, "d.jsonl");
    writeFileSync(path, JSON.stringify({ question: "q", images: ["imgs/red.png"] }));
    await expect(loadPromptData(path, keys, { ...opts(store), applyChatTemplate: false })).rejects.toMatchObject({
      code: "config_invalid",
      message: expect.stringContaining("multimodal_keys needs apply_chat_template: true"),
    });
  });
});

describe("imagePlaceholderOf: the chat template's text for one image", () => {
  it("is Qwen2-VL's placeholder for a vision template, null for a text-only one", async () => {
    expect(imagePlaceholderOf(await loadHfTokenizer(visionChatTokenizerDir()))).toBe("<|vision_start|><|image_pad|><|vision_end|>");
    expect(imagePlaceholderOf(await loadHfTokenizer(chatTokenizerDir()))).toBeNull();
  });
});
