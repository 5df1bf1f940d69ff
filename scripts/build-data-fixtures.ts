/**
 * Builds the small Parquet prompt datasets under test/fixtures/data/ that the
 * dataset tests read (committed; nothing is downloaded or written at test
 * time). Run: `npx tsx scripts/build-data-fixtures.ts`. hyparquet-writer is a
 * dev dependency used only here; rlq reads Parquet with hyparquet.
 *
 * - prompts.parquet: plain string prompts, INT64 labels, struct metadata, and
 *   two bad rows (row 3: empty input, row 5: null input).
 * - chat.parquet: message lists (list<struct<role, content>>, as HF datasets
 *   store them) and tools as a JSON string, for apply_chat_template.
 */
import { writeFileSync, mkdirSync } from "node:fs";
import { join } from "node:path";
import { ByteWriter, parquetWrite, parquetWriteBuffer, schemaFromColumnData } from "hyparquet-writer";

const OUT = join(import.meta.dirname, "..", "test", "fixtures", "data");
mkdirSync(OUT, { recursive: true });

const prompts = parquetWriteBuffer({
  columnData: [
    { name: "input", data: ["1+2=", "30+4=", "", "7+7=", null, "12+30+45+9="], type: "STRING" },
    { name: "label", data: [3n, 34n, 0n, 14n, 1n, 96n], type: "INT64" },
    {
      name: "metadata",
      data: [{ rm_type: "math" }, { rm_type: "math" }, { rm_type: "math" }, { rm_type: "f1" }, { rm_type: "math" }, { rm_type: "math" }],
    },
  ],
});
writeFileSync(join(OUT, "prompts.parquet"), new Uint8Array(prompts));

// list<struct<role, content>> written out explicitly (the standard 3-level LIST layout pyarrow writes).
const chatColumns = [
  {
    name: "messages",
    data: [
      [
        { role: "system", content: "Add." },
        { role: "user", content: "1+2=" },
      ],
      [{ role: "user", content: "5+5=" }],
      [{ role: "user", content: "3+3=" }],
      [{ role: "user" }],
    ],
  },
  { name: "label", data: ["3", "10", "6", "0"], type: "STRING" as const },
  { name: "tools", data: [JSON.stringify([{ name: "calc" }]), null, null, null], type: "STRING" as const },
];
const chatWriter = new ByteWriter();
await parquetWrite({
  writer: chatWriter,
  columnData: chatColumns.map(({ name, data }) => ({ name, data })),
  schema: schemaFromColumnData({ columnData: chatColumns, schemaOverrides: {} }).flatMap((el) =>
    el.name === "messages"
      ? [
          { name: "messages", repetition_type: "OPTIONAL" as const, converted_type: "LIST" as const, num_children: 1 },
          { name: "list", repetition_type: "REPEATED" as const, num_children: 1 },
          { name: "element", repetition_type: "OPTIONAL" as const, num_children: 2 },
          { name: "role", type: "BYTE_ARRAY" as const, converted_type: "UTF8" as const, repetition_type: "OPTIONAL" as const },
          { name: "content", type: "BYTE_ARRAY" as const, converted_type: "UTF8" as const, repetition_type: "OPTIONAL" as const },
        ]
      : [el],
  ),
});
const chat = chatWriter.getBuffer();
writeFileSync(join(OUT, "chat.parquet"), new Uint8Array(chat));
console.log(`wrote ${OUT}/prompts.parquet (${prompts.byteLength} bytes), chat.parquet (${chat.byteLength} bytes)`);
