import type { RunState } from "../core/run-state.ts";
import type { Cursor } from "../core/decisions.ts";
import { drawFresh, type FreshDraw } from "../core/data-buffer.ts";
import type { Dataset } from "../data/dataset.ts";
import type { Tokenizer } from "../data/tokenizer.ts";
import type { BufferFilter } from "../runtime/filters.ts";
import type { DrawnPromptRow } from "../store/run-facts.ts";
import { RlqError } from "../lib/errors.ts";

/** What a draw needs besides the state: the run's dataset, tokenizer and buffer filter. */
export interface DrawSource {
  dataset: Dataset;
  tokenizer: Tokenizer;
  bufferFilter: BufferFilter;
}

export interface PlannedDraw {
  /** Buffered groups served first, through the buffer filter. */
  fromBuffer: number[];
  /** Fresh prompts from the dataset cursor (group id = draw ordinal). */
  draws: FreshDraw[];
  /** The cursor after the draw (recorded in `prompts.drawn`). */
  cursor: Cursor;
  /** The `drawn_prompts` rows of the fresh draws. */
  rows: Array<DrawnPromptRow & { runId: string }>;
}

/**
 * slime's DataBuffer draw (the built-in collect and rollout functions alike):
 * `want` groups, the partial-rollout buffer first through the buffer filter,
 * then fresh prompts from the cursor. Pure but for the buffer filter (a
 * plugin); the caller records it as `prompts.drawn` with the rows.
 */
export async function planDraw(src: DrawSource, state: RunState, want: number, step: number): Promise<PlannedDraw> {
  const c = state.config;
  const fromBuffer = state.buffer.length > 0 && want > 0 ? await src.bufferFilter(state.buffer, want) : [];
  const { draws, cursor } = drawFresh(
    { size: src.dataset.rows.length, shuffle: c.rollout_shuffle, seed: c.rollout_seed },
    state.cursor,
    want - fromBuffer.length,
  );
  const rows = draws.map((d) => {
    const row = src.dataset.rows[d.datasetIndex];
    if (!row) throw new RlqError("dataset_changed", `dataset index ${d.datasetIndex} is out of range`);
    return {
      runId: state.runId,
      drawOrdinal: d.groupId,
      epoch: d.epoch,
      datasetIndex: d.datasetIndex,
      step,
      prompt: row.prompt,
      label: row.label,
      metadata: row.metadata,
      promptTokens: src.tokenizer.encode(row.prompt),
      images: row.images ?? [],
    };
  });
  return { fromBuffer, draws, cursor, rows };
}
