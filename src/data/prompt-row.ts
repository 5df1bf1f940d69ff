import type { PromptImage } from "./images.ts";

/** The shapes of a loaded prompt dataset, apart from the loaders so that they import no loader (no import cycle). */
export interface PromptRow {
  /** Index among the valid rows: what the cursor permutes. */
  index: number;
  line: number;
  prompt: string;
  label: string | null;
  metadata: Record<string, unknown>;
  /** With multimodal_keys: the row's images, in the order of their placeholders in the prompt. */
  images?: PromptImage[];
}

export interface Dataset {
  path: string;
  fingerprint: string;
  rows: PromptRow[];
  errors: string[];
}

export interface DatasetKeys {
  input_key: string;
  label_key: string | null;
  metadata_key: string;
}
