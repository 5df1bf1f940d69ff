/**
 * slime's train.py argv → an rlq run config and a report that names every
 * flag and what became of it (`rlq config import-slime`). Source read:
 * THUDM/slime 624b824a898ab0ec1fcb4d373004c7f3852bf515, slime/utils/arguments.py
 * (names, defaults, negative flags, `--custom-config-path` applied at the end of
 * slime_validate_args: each YAML key overrides the argument of that name) and
 * scripts/run-*.sh (how the flags are passed).
 */

import { parse as parseYaml, stringify } from "yaml";
import { readSlimeEvalConfig } from "./slime-eval-config.ts";
import { ConfigError, parseRunConfig, runConfigSchema } from "./run-config.ts";
import {
  classifySlimeFlag,
  declaredDisposition,
  dropGroupTitles,
  flagToKey,
  isMegatronShapeFlag,
  slimeBuiltinDefaults,
  type DropGroup,
} from "./slime-flags.ts";
import { isPythonPluginPath, pythonHostKeys } from "./slime-traps.ts";
import { builtinBufferFilter, builtinDynamicFilter } from "../filters/registry.ts";
import { isSlimeSft, sftFlagDisposition } from "./slime-sft-import.ts";

export interface ImportReport {
  mapped: Array<{ flag: string; key: string; value: unknown; difference?: string }>;
  renamed: Array<{ flag: string; key: string; value: unknown; note: string }>;
  /** Flags whose dropping changes nothing the run computes, by group (placement included). */
  dropped: Partial<Record<DropGroup, Array<{ flag: string; note: string }>>>;
  /** Dropped, and the run does something else than slime's would: listed first, and validation is not ok. */
  unsupported: Array<{ flag: string; why: string; instead: string }>;
  /** What slime's placement meant, in GPUs (null: the script names no placement flag). */
  placement: string | null;
  /** `--custom-config-path` files read, and how many settings each gave. */
  customConfigs: Array<{ path: string; settings: number }>;
  /** Keys rlq needs that slime's flags do not give, or slime defaults that differ from rlq's. */
  added: Array<{ key: string; value: unknown; why: string }>;
  /** Values left as written because they expand an environment variable or a command. */
  unexpanded: Array<{ key: string; value: string }>;
  unresolved: string[];
  /** null: the config validates; otherwise the validation errors. */
  validation: string | null;
  /** The config validates, no array was left unresolved, and nothing that changes what the run does was dropped. */
  isOk: boolean;
}

const rlqKeys = new Set(Object.keys(runConfigSchema.shape));
const shape = runConfigSchema.shape as Record<string, { safeParse(v: unknown): { success: boolean } }>;

/** slime's --custom-tis-function-path values → rlq's tis_function (slime/backends/megatron_utils/loss.py, examples/train_infer_mismatch_helper/mis.py). */
function tisFunctionFor(path: string): "vanilla" | "icepop" | "mis" | null {
  if (/vanilla_tis_function$/.test(path)) return "vanilla";
  if (/icepop_function$/.test(path)) return "icepop";
  if (/mis\.compute_mis_weights(_with_cp)?$/.test(path)) return "mis";
  return null;
}

const hasExpansion = (v: string) => /\$\{?[A-Za-z_(]/.test(v);
/** Keys a script may hold in clear, and the environment variable rlq reads instead. */
const secretFallback: Record<string, string> = {
  wandb_key: "WANDB_API_KEY",
  sglang_api_key: "SGLANG_API_KEY",
  sglang_admin_api_key: "SGLANG_ADMIN_API_KEY",
  router_api_key: "SGLANG_ROUTER_API_KEY",
};
/** `${NAME}` or `$NAME`: a shell reference to one environment variable. */
const envReference = /^\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?$/;

/** A `type=json.loads` flag's word (slime's --multimodal-keys, --apply-chat-template-kwargs): its JSON object, else undefined. */
function jsonWord(word: string | undefined): unknown {
  if (word === undefined || !word.trimStart().startsWith("{")) return undefined;
  try {
    return JSON.parse(word) as unknown;
  } catch {
    return undefined;
  }
}

/** The first reading of the flag's words that the rlq key accepts: bare flag → true, one word → number or string, several → a list. */
function convertValue(key: string, words: readonly string[]): unknown {
  const field = shape[key];
  const candidates: unknown[] =
    words.length === 0
      ? [true]
      : words.length === 1
        ? [
            Number(words[0]),
            words[0] === "true" ? true : words[0] === "false" ? false : undefined,
            words[0],
            [Number(words[0])],
            [words[0]],
            jsonWord(words[0]),
          ]
        : [words.map(Number), words];
  for (const c of candidates) {
    if (c === undefined || (typeof c === "number" && Number.isNaN(c))) continue;
    if (field?.safeParse(c).success) return c;
  }
  return words.length === 0 ? true : words.length === 1 ? (jsonWord(words[0]) ?? words[0]) : [...words];
}

/** One setting as slime would apply it: a flag and its words, or a key and its YAML value from a custom config. */
interface Setting {
  flag: string;
  key: string;
  words: string[];
  /** The YAML value (custom config files), as slime's setattr applies it. */
  typed?: { value: unknown };
  /** How the report shows it. */
  shown: string;
}

/** Split argv into flags with their values (`-1` and other non-`--` words are values). */
function flagsOf(args: readonly string[]): Setting[] {
  const out: Array<{ flag: string; words: string[] }> = [];
  for (const a of args) {
    if (a.startsWith("--")) {
      const eq = a.indexOf("=");
      out.push(eq === -1 ? { flag: a, words: [] } : { flag: a.slice(0, eq), words: [a.slice(eq + 1)] });
    } else if (out.length > 0) {
      (out[out.length - 1] as { words: string[] }).words.push(a);
    }
  }
  return out.map(({ flag, words }) => ({
    flag,
    words,
    key: flagToKey(flag),
    shown:
      secretFallback[flagToKey(flag)] !== undefined && words.length > 0 && !envReference.test(words[0] as string)
        ? `${flag} (the key itself, not shown)`
        : words.length === 0
          ? flag
          : `${flag} ${words.join(" ")}`,
  }));
}

function wordsOf(v: unknown): string[] {
  if (v === true || v === null || v === undefined) return [];
  if (Array.isArray(v)) return v.map((x) => (typeof x === "string" ? x : JSON.stringify(x)));
  return [typeof v === "string" ? v : JSON.stringify(v)];
}

/** The settings of a custom config YAML, in file order; null with the reason when it cannot be read. */
function customConfigSettings(path: string, text: string | null): Setting[] | string {
  if (text === null) return `cannot read ${path}`;
  let data: unknown;
  try {
    data = parseYaml(text) ?? {};
  } catch (e) {
    return `${path} is not YAML: ${(e as Error).message.split("\n")[0]}`;
  }
  if (data === null || typeof data !== "object" || Array.isArray(data)) return `${path} is not a mapping of argument names to values`;
  return Object.entries(data as Record<string, unknown>).map(([key, value]) => ({
    flag: `--${key.replace(/_/g, "-")}`,
    key,
    words: wordsOf(value),
    typed: { value },
    shown: `${key}: ${secretFallback[key] !== undefined && typeof value === "string" && !envReference.test(value) ? "(the key itself, not shown)" : JSON.stringify(value)} (from ${path})`,
  }));
}

export interface ImportOptions {
  /** Engine URL written when the script names none (slime launches SGLang itself). */
  engineUrl?: string;
  /** Remote trainer URL written (slime trains with Megatron in-process; rlq's GPU trainer is workers/trainer-torch). */
  trainerUrl?: string;
  /** Reads `--custom-config-path` (null: cannot be read). Without it, the file is reported as not read. */
  readFile?: (path: string) => string | null;
}

/** State while settings are applied in order. */
interface ImportState {
  config: Record<string, unknown>;
  report: ImportReport;
  router: { ip: string | null; port: string | null };
  engine: Record<string, unknown>;
  placement: Map<string, string[]>;
  /** `--loss-type sft_loss`: the SFT recipe's flags import to the SFT run mode (slime-sft-import.ts). */
  isSft: boolean;
}

export function importSlimeArgs(
  args: readonly string[],
  options: ImportOptions = {},
  unresolved: readonly string[] = [],
): { config: Record<string, unknown>; report: ImportReport } {
  const s: ImportState = {
    config: {},
    report: {
      mapped: [],
      renamed: [],
      dropped: {},
      unsupported: [],
      placement: null,
      customConfigs: [],
      added: [],
      unexpanded: [],
      unresolved: [...unresolved],
      validation: null,
      isOk: false,
    },
    router: { ip: null, port: null },
    engine: {},
    placement: new Map(),
    isSft: false,
  };
  const settings = flagsOf(args);
  // slime applies the custom config last (slime_validate_args), so its keys override the command line.
  for (const c of settings.filter((x) => x.key === "custom_config_path")) {
    const path = c.words[0] ?? "";
    const read = customConfigSettings(path, hasExpansion(path) ? null : (options.readFile?.(path) ?? null));
    if (typeof read === "string") {
      s.report.unsupported.push({
        flag: c.shown,
        why: `its settings override the command line, and ${hasExpansion(path) ? `${path} names an environment variable the importer does not expand` : read}`,
        instead: "run the importer where the file can be read, or write its settings as flags",
      });
      continue;
    }
    s.report.customConfigs.push({ path, settings: read.length });
    settings.push(...read);
  }
  s.isSft = isSlimeSft(settings);
  for (const setting of settings) applySetting(s, setting);
  // slime reads eval datasets from --eval-config when it is given (slime/utils/eval_config.py).
  for (const c of settings.filter((x) => x.key === "eval_config")) applyEvalConfig(s, c, options);
  finishEngine(s, options);
  addRlqDefaults(s, options);
  s.report.placement = placementSummary(s.placement);
  try {
    parseRunConfig(s.config, "imported config", "user");
  } catch (e) {
    if (!(e instanceof ConfigError)) throw e;
    s.report.validation = e.message;
  }
  s.report.isOk = s.report.validation === null && s.report.unsupported.length === 0 && s.report.unresolved.length === 0;
  return { config: s.config, report: s.report };
}

/** `--eval-config`: its datasets, with their overrides, as eval_prompt_data (replacing --eval-prompt-data's). */
function applyEvalConfig(s: ImportState, st: Setting, options: ImportOptions): void {
  const path = st.words[0] ?? "";
  const read = readSlimeEvalConfig(path, hasExpansion(path) ? null : (options.readFile?.(path) ?? null));
  if (typeof read === "string") {
    s.report.unsupported.push({
      flag: st.shown,
      why: `its eval datasets are lost: ${hasExpansion(path) ? `${path} names an environment variable the importer does not expand` : read}`,
      instead: "run the importer where the file can be read, or write eval_prompt_data {name: {path, ...}}",
    });
    return;
  }
  s.config.eval_prompt_data = read.datasets;
  s.report.renamed.push({
    flag: st.shown,
    key: "eval_prompt_data",
    value: Object.keys(read.datasets),
    note: "each dataset with its overrides (config/eval-datasets.ts)",
  });
  for (const u of read.unsupported)
    s.report.unsupported.push({
      flag: `${st.shown}: dataset ${u.dataset}, ${u.field}`,
      why: `rlq's eval datasets have no ${u.field}`,
      instead: "remove it, or run that dataset's eval with the run's own setting",
    });
}

/** Apply one setting: mapped, renamed, dropped (placement kept for the summary) or unsupported. */
function applySetting(s: ImportState, st: Setting): void {
  const { key, words, shown } = st;
  if (key === "custom_config_path") {
    const n = s.report.customConfigs.find((c) => c.path === words[0])?.settings;
    if (n !== undefined)
      s.report.renamed.push({ flag: shown, key: "(read)", value: `${n} settings`, note: "imported as if given on the command line, after it" });
    return;
  }
  const sft = sftFlagDisposition(key, words, s.isSft);
  if (sft?.kind === "built_in") {
    s.report.renamed.push({ flag: shown, key: "(built in)", value: null, note: sft.note });
    return;
  }
  if (sft?.kind === "dropped") {
    (s.report.dropped.runtime ??= []).push({ flag: shown, note: sft.note });
    return;
  }
  if (slimeBuiltinDefaults[key] !== undefined && words.length === 1 && words[0] === slimeBuiltinDefaults[key]) {
    s.report.renamed.push({ flag: shown, key: "(built in)", value: null, note: "slime's default implementation, which is rlq's own" });
    return;
  }
  // A YAML key that is none of slime's arguments nor Megatron's is an argument for the user's custom functions.
  const isCustomArg = st.typed !== undefined && declaredDisposition(key, rlqKeys) === null && !isMegatronShapeFlag(key);
  const d = isCustomArg ? null : classifySlimeFlag(key, rlqKeys);
  if (d === null) {
    s.report.unsupported.push({
      flag: shown,
      why: "not one of slime's arguments: an argument for your custom functions (slime hands them args.<name>)",
      instead: "rlq's run config has no free-form keys: give the value to your plugin another way (its own file or environment)",
    });
    return;
  }
  const isOff = st.typed !== undefined && (st.typed.value === false || st.typed.value === null);
  if (d.kind === "unsupported" && isOff) {
    s.report.renamed.push({ flag: shown, key: "(off)", value: st.typed?.value, note: "off, which is how rlq runs" });
    return;
  }
  if (key === "optimizer" && words[0] !== undefined && words[0] !== "adam") {
    s.report.unsupported.push({ flag: shown, why: `rlq's trainers use Adam(W), not ${words[0]}`, instead: "remove it (Adam)" });
    return;
  }
  switch (d.kind) {
    case "read":
      return;
    case "dropped":
      (s.report.dropped[d.group] ??= []).push({ flag: shown, note: d.note });
      if (d.group === "placement") s.placement.set(key, words);
      return;
    case "unsupported":
      s.report.unsupported.push({ flag: shown, why: d.why, instead: d.instead });
      return;
    case "same":
      applySame(s, st, d.difference);
      return;
    case "renamed":
      applyRenamed(s, st, d.key, d.value, d.note);
  }
}

/** slime's dotted Python path for a key the plugin host serves → `py:` (built-in filter names stay as they are). */
function pythonPluginRoute(key: string, value: unknown): { value: string; difference: string } | null {
  if (!pythonHostKeys.has(key) || typeof value !== "string" || !isPythonPluginPath(value)) return null;
  if (key === "dynamic_sampling_filter_path" && builtinDynamicFilter(value) !== null) return null;
  if (key === "buffer_filter_path" && builtinBufferFilter(value) !== null) return null;
  return {
    value: `py:${value.trim()}`,
    difference: "runs unmodified in rlq's Python plugin host: the module must import from the directory rlq runs in (or PYTHONPATH)",
  };
}

function applySame(s: ImportState, st: Setting, difference: string | undefined): void {
  const { key, words } = st;
  if (key === "wandb_mode" && (st.typed?.value ?? words[0]) === "disabled") {
    s.config.use_wandb = false;
    s.report.renamed.push({ flag: st.shown, key: "use_wandb", value: false, note: "W&B disabled: rlq writes use_wandb: false" });
    return;
  }
  const typedOk = st.typed !== undefined && shape[key]?.safeParse(st.typed.value).success === true;
  let value = typedOk ? st.typed?.value : key === "eval_prompt_data" ? pairs(words) : convertValue(key, words);
  const py = pythonPluginRoute(key, value);
  if (py !== null) {
    value = py.value;
    difference = difference === undefined ? py.difference : `${difference}; ${py.difference}`;
  }
  s.config[key] = value;
  s.report.mapped.push({ flag: st.shown, key, value, ...(difference !== undefined ? { difference } : {}) });
  for (const w of words) if (hasExpansion(w)) s.report.unexpanded.push({ key, value: w });
}

function applyRenamed(s: ImportState, st: Setting, target: string, fixed: unknown, note: string): void {
  const { key, words } = st;
  let value: unknown = fixed;
  switch (key) {
    case "custom_tis_function_path":
      value = tisFunctionFor(words[0] ?? "");
      if (value === null) {
        s.report.unsupported.push({ flag: st.shown, why: "a custom TIS function", instead: "tis_function: vanilla, icepop or mis" });
        return;
      }
      break;
    case "wandb_key":
    case "sglang_api_key":
    case "sglang_admin_api_key":
    case "router_api_key": {
      const fallback = secretFallback[key] as string;
      const ref = envReference.exec(words[0] ?? "");
      value = { env: ref?.[1] ?? fallback };
      if (ref === null)
        s.report.added.push({ key: target, value, why: `the script holds the key itself, which a run config never does: export it as ${fallback}` });
      if (target.startsWith("engine.")) s.engine[target.slice(7)] = value;
      break;
    }
    case "sglang_router_ip":
      s.router.ip = words[0] ?? null;
      break;
    case "sglang_router_port":
      s.router.port = words[0] ?? null;
      break;
    case "sglang_router_request_timeout_secs":
      value = Number(words[0]);
      s.engine.request_timeout_s = value;
      break;
    case "debug_train_only":
      s.report.added.push({
        key: target,
        value,
        why: "slime loads the rollouts from --load-debug-rollout-data's files; rlq trains on a recorded run's: put its id here (rlq run list)",
      });
      break;
    case "rollout_external_engine_addrs":
      value = words.map((w) => (/^https?:\/\//.test(w) ? w : `http://${w}`));
      s.engine.urls = value;
      break;
    default:
      if (value === undefined) value = words.length === 1 ? words[0] : words;
  }
  if (!target.startsWith("engine.")) s.config[target] = value;
  s.report.renamed.push({ flag: st.shown, key: target, value: value ?? words[0], note });
}

/** The engine block: the router or addresses the script names, else a placeholder URL. */
function finishEngine(s: ImportState, options: ImportOptions): void {
  const router = s.router.ip !== null ? `http://${s.router.ip}:${s.router.port ?? "30000"}` : null;
  const urls = Array.isArray(s.engine.urls) ? s.engine.urls : null;
  const engine: Record<string, unknown> = {
    kind: "sglang",
    ...(urls !== null ? { urls } : router !== null ? { router_url: router } : { urls: [options.engineUrl ?? "http://127.0.0.1:30000"] }),
  };
  for (const k of ["request_timeout_s", "api_key", "admin_api_key", "router_api_key"]) if (s.engine[k] !== undefined) engine[k] = s.engine[k];
  s.config.engine = engine;
  if (urls === null && router === null)
    s.report.added.push({
      key: "engine",
      value: engine,
      why: "slime launches SGLang itself; rlq connects to a server you start: put its URL here (SGLang's default port)",
    });
}

/** The trainer, W&B's key, and slime's defaults where rlq's differ. */
function addRlqDefaults(s: ImportState, options: ImportOptions): void {
  const { config, report } = s;
  config.trainer = { kind: "remote", url: options.trainerUrl ?? "http://127.0.0.1:8700" };
  report.added.push({
    key: "trainer",
    value: config.trainer,
    why: "slime trains with Megatron in-process; rlq's GPU trainer is a server (workers/trainer-torch, default port 8700)",
  });
  if (config.use_wandb === true && config.wandb_key === undefined) {
    config.wandb_key = { env: "WANDB_API_KEY" };
    report.added.push({ key: "wandb_key", value: config.wandb_key, why: "no --wandb-key: W&B's SDK reads WANDB_API_KEY, and so does rlq" });
  }
  if (config.use_wandb === true && config.wandb_project === undefined) {
    config.wandb_project = "uncategorized";
    report.added.push({
      key: "wandb_project",
      value: "uncategorized",
      why: "no --wandb-project: slime calls wandb.init(project=None), which logs to W&B's 'uncategorized' project; rlq names it",
    });
  }
  // Where slime's (Megatron's) default differs from rlq's, write slime's so the run means the same.
  const slimeDefaults: Array<[string, unknown, string]> = [
    ["lr_decay_style", "linear", "Megatron's default (rlq's is constant)"],
    ["weight_decay", 0.01, "Megatron's default (rlq's is 0)"],
    ["label_key", null, "slime's default: no label (rlq's is 'label')"],
  ];
  for (const [key, value, why] of slimeDefaults) {
    if (key in config) continue;
    config[key] = value;
    report.added.push({ key, value, why });
  }
  if (typeof config.hf_checkpoint === "string" && config.tokenizer === undefined) {
    config.tokenizer = "hf";
    report.added.push({ key: "tokenizer", value: "hf", why: "slime's rollout tokenizes with --hf-checkpoint's tokenizer" });
  }
}

/** What slime's placement flags meant in GPUs, and what rlq needs instead. */
function placementSummary(p: ReadonlyMap<string, string[]>): string | null {
  if (p.size === 0) return null;
  const word = (k: string, dflt: string) => p.get(k)?.[0] ?? dflt;
  const nodes = word("actor_num_nodes", "1");
  const perNode = word("actor_num_gpus_per_node", "8");
  const actor = /^\d+$/.test(nodes) && /^\d+$/.test(perNode) ? String(Number(nodes) * Number(perNode)) : `${nodes} x ${perNode}`;
  const colocated = p.has("colocate");
  const rollout = p.get("rollout_num_gpus")?.[0] ?? (colocated ? actor : "rollout_num_gpus (unset)");
  return colocated
    ? `slime colocated training and SGLang on the same ${actor} GPU(s), offloading each between phases; rlq runs them side by side: ${actor} GPU(s) for the trainer plus ${rollout} for the SGLang servers, or fewer servers`
    : `slime trained on ${actor} GPU(s) and ran SGLang on ${rollout}; start rlq's trainer and SGLang servers on as many`;
}

function pairs(words: readonly string[]): unknown {
  if (words.length % 2 !== 0) return words.join(" ");
  return Object.fromEntries(Array.from({ length: words.length / 2 }, (_, i) => [words[2 * i], words[2 * i + 1]]));
}

/** The run config as YAML, headed by where it came from. */
export function importedYaml(config: Record<string, unknown>, source: string): string {
  return `# Imported from ${source} by rlq config import-slime; read the report before running.\n${stringify(config, { lineWidth: 0 })}`;
}

const show = (v: unknown) => (typeof v === "string" ? v : JSON.stringify(v));

/**
 * The human report. It leads with what was dropped although it changes what
 * the run does, then names every other flag: mapped, renamed, placement,
 * dropped (grouped, with why), what rlq wrote, and the validation.
 */
export function formatImportReport(r: ImportReport): string {
  const out: string[] = [];
  if (r.unsupported.length > 0) {
    out.push(`DROPPED, changes what the run does (${r.unsupported.length}): rlq has no counterpart, so the run would differ from slime's`);
    for (const u of r.unsupported) out.push(`  ${u.flag}: ${u.why}; instead: ${u.instead}`);
  }
  if (r.unresolved.length > 0)
    out.push(
      `UNRESOLVED arrays (${r.unresolved.length}): ${r.unresolved.join(", ")} (defined in a file the script sources that could not be read: their flags are not imported)`,
    );
  for (const c of r.customConfigs) out.push(`read --custom-config-path ${c.path}: ${c.settings} setting(s), applied after the command line as slime does`);
  out.push(`mapped (${r.mapped.length}): same name and meaning in rlq`);
  for (const m of r.mapped) out.push(`  ${m.flag}  ->  ${m.key}: ${show(m.value)}${m.difference !== undefined ? `  (difference: ${m.difference})` : ""}`);
  out.push(`renamed (${r.renamed.length}):`);
  for (const m of r.renamed) out.push(`  ${m.flag}  ->  ${m.key}: ${show(m.value)}  (${m.note})`);
  const placement = r.dropped.placement ?? [];
  if (placement.length > 0) {
    out.push(`placement (${placement.length}): ${r.placement ?? ""}`);
    for (const p of placement) out.push(`  ${p.flag}: ${p.note}`);
  }
  const groups = (Object.entries(r.dropped) as Array<[DropGroup, Array<{ flag: string; note: string }>]>).filter(([g]) => g !== "placement");
  out.push(`dropped, changes nothing the run computes (${groups.reduce((n, [, v]) => n + v.length, 0)}):`);
  for (const [g, flags] of groups) {
    out.push(`  ${dropGroupTitles[g]}:`);
    for (const f of flags) out.push(`    ${f.flag}${f.note === "" ? "" : `  (${f.note})`}`);
  }
  out.push(`written by rlq (${r.added.length}):`);
  for (const a of r.added) out.push(`  ${a.key}: ${show(a.value)}  (${a.why})`);
  if (r.unexpanded.length > 0) {
    out.push(`left as written (${r.unexpanded.length}): expand these before rlq run start`);
    for (const u of r.unexpanded) out.push(`  ${u.key}: ${u.value}`);
  }
  if (r.validation !== null) out.push(`validation: FAILED\n${r.validation.replace(/^/gm, "  ")}`);
  else if (!r.isOk)
    out.push(
      `validation: the config validates, but ${r.unsupported.length} setting(s) that change what the run does were dropped${r.unresolved.length > 0 ? ` and ${r.unresolved.length} array(s) were not read` : ""} (listed first)`,
    );
  else out.push("validation: ok");
  return out.join("\n") + "\n";
}
