/**
 * The DataBuffer's dataset side, with slime's semantics
 * (slime/ray/rollout_data_source.py at THUDM/slime 624b824): a cursor (epoch, offset) over a permutation that
 * depends only on (rollout_seed, epoch); the epoch wraps mid-batch. Every
 * fresh draw gets the next draw ordinal, which is also its group id.
 * The buffer side (partial groups served first through the buffer filter) is
 * decided by the controller and recorded in the same `prompts.drawn` decision.
 */

import { RlqError } from "../lib/errors.ts";
import type { Cursor } from "./decisions.ts";
import { permutation } from "./random.ts";
import { seedFrom } from "../lib/hash.ts";

export interface FreshDraw {
  groupId: number;
  epoch: number;
  datasetIndex: number;
}

export interface DatasetOrder {
  size: number;
  shuffle: boolean;
  seed: number;
}

const permCache = new Map<string, number[]>();

/** The dataset index at `offset` of `epoch`. */
export function datasetIndexAt(order: DatasetOrder, epoch: number, offset: number): number {
  if (!order.shuffle) return offset;
  const key = `${order.size}:${order.seed}:${epoch}`;
  let perm = permCache.get(key);
  if (!perm) {
    perm = permutation(order.size, seedFrom(order.seed, epoch));
    if (permCache.size > 8) permCache.clear();
    permCache.set(key, perm);
  }
  return perm[offset] as number;
}

export function drawFresh(order: DatasetOrder, cursor: Cursor, n: number): { draws: FreshDraw[]; cursor: Cursor } {
  if (order.size <= 0) throw new RlqError("dataset_empty", "dataset is empty: nothing to draw");
  let { epoch, offset, nextOrdinal } = cursor;
  const draws: FreshDraw[] = [];
  for (let i = 0; i < n; i++) {
    if (offset >= order.size) {
      epoch += 1;
      offset = 0;
    }
    draws.push({ groupId: nextOrdinal, epoch, datasetIndex: datasetIndexAt(order, epoch, offset) });
    offset += 1;
    nextOrdinal += 1;
  }
  return { draws, cursor: { epoch, offset, nextOrdinal } };
}
