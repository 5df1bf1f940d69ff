// The rollout viewer (served as /viewer.js beside /app.js): run → steps → a step's groups →
// samples → one sample's tokens, and two steps side by side. Its whole state lives in the URL
// hash (#run=ID&view=step&step=3&rmin=0.5...), so every view is a link; it reads
// /api/viewer/* (src/dashboard/viewer.ts), whose answers carry the SQL behind them, shown
// under "SQL" for copying into `rlq sql`. Elements carry data-* attributes (data-step,
// data-group, data-sample, data-colour) that the browser test clicks and reads.
"use strict";

(() => {
  const $ = (sel) => document.querySelector(sel);
  const el = (tag, attrs = {}, ...children) => {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs)) if (v !== undefined && v !== null) e.setAttribute(k, String(v));
    for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
    return e;
  };
  const fmt = (v, d = 3) =>
    v === null || v === undefined || Number.isNaN(v)
      ? "–"
      : typeof v === "number"
        ? Number.isInteger(v)
          ? String(v)
          : v !== 0 && Math.abs(v) < 1e-3
            ? v.toExponential(2)
            : v.toPrecision(d)
        : String(v);
  const getJson = async (url) => {
    const res = await fetch(url);
    const body = await res.json();
    if (!res.ok) throw new Error(body?.error?.message ?? res.statusText);
    return body;
  };

  /** The hash as a map; `go` writes a new one (a new history entry, so Back works). */
  const state = () => new URLSearchParams(location.hash.slice(1));
  const link = (patch, keep = ["run"]) => {
    const cur = state();
    const next = new URLSearchParams();
    for (const k of keep) if (cur.has(k)) next.set(k, cur.get(k));
    for (const [k, v] of Object.entries(patch)) if (v !== null && v !== undefined && v !== "") next.set(k, String(v));
    return `#${next.toString()}`;
  };
  const go = (patch, keep) => {
    location.hash = link(patch, keep);
  };
  const api = (runId, path, query = {}) => {
    const q = new URLSearchParams(Object.entries(query).filter(([, v]) => v !== null && v !== undefined && v !== ""));
    return getJson(`/api/viewer/${encodeURIComponent(runId)}${path}${q.size ? `?${q}` : ""}`);
  };

  // Token colourings: one function per mode, token i of the response → a background colour.
  const versionColour = (v) => (v < 0 ? "#e4e4e4" : `hsl(${(v * 47) % 360} 70% 82%)`);
  // a[i] − b[i], or null where either is missing.
  const diff = (a, b, i) => (a?.[i] === undefined || a?.[i] === null || b?.[i] === undefined || b?.[i] === null ? null : a[i] - b[i]);
  // A signed difference in nats: blue where it is negative, red where positive, white at 0, full at ±full.
  const divergingColour = (d, full = 2) => (d === null ? "#e4e4e4" : `hsl(${d < 0 ? 220 : 0} 80% ${100 - 45 * Math.min(1, Math.abs(d) / full)}%)`);
  const colourings = {
    version: { label: "weight version", of: (s, i) => versionColour(s.token_versions?.[i] ?? -1), title: (s, i) => `version ${s.token_versions?.[i]}` },
    logprob: {
      label: "rollout log-prob",
      // −log p from 0 (white) to 5 nats or more (deep red): where the engine was unsure.
      of: (s, i) => `hsl(0 85% ${100 - 50 * Math.min(1, -(s.rollout_log_probs?.[i] ?? 0) / 5)}%)`,
      title: (s, i) => `log p ${fmt(s.rollout_log_probs?.[i])}`,
    },
    // The trainer's log-probs under the step's start weights, once a step trained the sample: where
    // trainer and engine disagree (full colour at ±0.5 nats, as the mismatch is small when they agree).
    traindiff: {
      label: "train − rollout log-prob",
      when: (s) => Array.isArray(s.train_log_probs),
      of: (s, i) => divergingColour(diff(s.train_log_probs, s.rollout_log_probs, i), 0.5),
      title: (s, i) =>
        `train log p ${fmt(s.train_log_probs?.[i])} · rollout log p ${fmt(s.rollout_log_probs?.[i])} · difference ${fmt(diff(s.train_log_probs, s.rollout_log_probs, i))}`,
    },
    // A distilling run's teacher log-probs, shown only for samples that have them (`when`).
    teacher: {
      label: "teacher log-prob",
      when: (s) => Array.isArray(s.teacher_log_probs),
      // −log p under the teacher, on the rollout log-prob's scale: where the teacher was unsure.
      of: (s, i) => `hsl(270 70% ${100 - 50 * Math.min(1, -(s.teacher_log_probs?.[i] ?? 0) / 5)}%)`,
      title: (s, i) => `teacher log p ${fmt(s.teacher_log_probs?.[i])}`,
    },
    teacherdiff: {
      label: "teacher − rollout log-prob",
      when: (s) => Array.isArray(s.teacher_log_probs),
      of: (s, i) => divergingColour(diff(s.teacher_log_probs, s.rollout_log_probs, i)),
      title: (s, i) =>
        `teacher log p ${fmt(s.teacher_log_probs?.[i])} · rollout log p ${fmt(s.rollout_log_probs?.[i])} · difference ${fmt(diff(s.teacher_log_probs, s.rollout_log_probs, i))}`,
    },
    mask: {
      label: "loss mask (tool turns 0)",
      of: (s, i) => ((s.loss_mask?.[i] ?? 1) === 1 ? "#cdeccd" : "#f6d2a8"),
      title: (s, i) => `loss mask ${s.loss_mask?.[i]}`,
    },
  };

  function table(id, headers, rows, cells, rowAttrs) {
    const t = el("table", { id });
    t.append(el("thead", {}, el("tr", {}, ...headers.map((h) => el("th", {}, h)))));
    const body = el("tbody");
    for (const r of rows) {
      const attrs = rowAttrs ? rowAttrs(r) : {};
      const tr = el("tr", attrs.href ? { ...attrs, class: "clickable" } : attrs);
      for (const c of cells(r)) tr.append(c instanceof Node ? el("td", {}, c) : el("td", {}, fmt(c)));
      if (attrs.href) tr.addEventListener("click", () => (location.hash = attrs.href));
      body.append(tr);
    }
    t.append(body);
    return t;
  }

  /** The "SQL" panel: each statement the page ran, as the `rlq sql` command, with a copy button. */
  function sqlPanel(shown, id = "v-sql") {
    const open = state().get("sql") === "1";
    const d = el("details", { id, class: "sql-panel" });
    d.open = open;
    d.append(el("summary", {}, `SQL (${shown.length} statement${shown.length === 1 ? "" : "s"}, run as rlq_reader)`));
    for (const s of shown) {
      const pre = el("pre", { class: "sql", "data-name": s.name }, s.command);
      const copy = el("button", { type: "button" }, "copy");
      copy.addEventListener("click", () => void navigator.clipboard?.writeText(s.command));
      d.append(el("div", { class: "sql-item" }, el("b", {}, s.name), " ", copy, pre));
    }
    d.addEventListener("toggle", () => {
      const p = state();
      if (d.open) p.set("sql", "1");
      else p.delete("sql");
      history.replaceState(null, "", `#${p}`);
    });
    return d;
  }

  function crumbs(runId, parts) {
    const nav = el("nav", { class: "crumbs" }, el("a", { href: "#" }, "runs"), " › ", el("a", { href: link({}) }, runId));
    for (const [label, href] of parts) nav.append(" › ", href ? el("a", { href }, label) : el("span", {}, label));
    return nav;
  }

  const stepLink = (step) => link({ view: "step", step });

  /** The run page's steps table (under the charts): newest first, paged. */
  async function renderSteps(runId, box) {
    const before = state().get("before");
    const page = await api(runId, "/steps", { before });
    const compare = el("form", { id: "v-compare-form", class: "inline" });
    const a = el("input", { name: "a", type: "number", min: 0, placeholder: "step A", style: "width:6em" });
    const b = el("input", { name: "b", type: "number", min: 0, placeholder: "step B", style: "width:6em" });
    compare.append("compare steps ", a, " and ", b, " ", el("button", { type: "submit" }, "compare"));
    compare.addEventListener("submit", (ev) => {
      ev.preventDefault();
      go({ view: "compare", a: a.value, b: b.value });
    });
    box.replaceChildren(
      el("h3", {}, "Rollout viewer: steps"),
      el("p", {}, compare, " · ", el("a", { href: link({ view: "samples" }), id: "v-search-link" }, "search all samples")),
      table(
        "v-steps",
        ["step", "groups", "kept", "filtered", "discarded", "aborted", "samples", "mean reward", "trained reward", "mean length", "version in"],
        page.steps,
        (s) => [s.step, s.groups, s.kept, s.filtered, s.discarded, s.aborted, s.samples, s.mean_reward, s.trained_reward, s.mean_length, s.weight_version_in],
        (s) => ({ "data-step": s.step, href: stepLink(s.step) }),
      ),
      page.next === null ? el("span") : el("a", { href: link({ before: page.next }), id: "v-steps-next" }, "older steps →"),
      sqlPanel(page.sql, "v-steps-sql"),
    );
  }

  const filterKeys = [
    ["rmin", "reward ≥", "number"],
    ["rmax", "reward ≤", "number"],
    ["lmin", "length ≥", "number"],
    ["lmax", "length ≤", "number"],
    ["status", "status", ["", "completed", "truncated", "aborted", "failed"]],
    ["outcome", "outcome", ["", "kept", "filtered", "discarded"]],
    ["version", "version", "number"],
    ["smin", "staleness ≥", "number"],
    ["smax", "staleness ≤", "number"],
    ["q", "text", "search"],
  ];

  /** The samples list with its filters; `fixed` holds the keys the view pins (step, group). */
  async function renderSamples(runId, fixed, box) {
    const st = state();
    const form = el("form", { id: "v-filter", class: "filters" });
    for (const [key, label, kind] of filterKeys) {
      const input = Array.isArray(kind)
        ? el("select", { name: key }, ...kind.map((o) => el("option", { value: o }, o || "any")))
        : el("input", { name: key, type: kind, step: "any", style: kind === "search" ? "width:12em" : "width:5em" });
      input.value = st.get(key) ?? "";
      form.append(el("label", {}, `${label} `, input));
    }
    form.append(el("button", { type: "submit", id: "v-apply" }, "filter"));
    form.addEventListener("submit", (ev) => {
      ev.preventDefault();
      const patch = { ...fixed, view: st.get("view") };
      for (const [key] of filterKeys) patch[key] = form.elements[key].value;
      go(patch, ["run", "sql"]);
    });
    const query = { ...fixed, after: st.get("after") };
    for (const [key] of filterKeys) query[key] = st.get(key);
    const page = await api(runId, "/samples", query);
    const rows = table(
      "v-samples",
      ["step", "group", "sample", "reward", "length", "status", "outcome", "versions", "staleness", "response"],
      page.samples,
      (s) => [
        s.step,
        s.group_id,
        s.sample_index,
        s.reward,
        s.response_length,
        s.status,
        s.outcome + (s.outcome_reason ? ` (${s.outcome_reason})` : ""),
        (s.weight_versions ?? []).join(","),
        s.staleness,
        el("span", { class: "preview" }, s.response),
      ],
      (s) => ({
        "data-sample": `${s.group_id}/${s.sample_index}`,
        "data-reward": s.reward,
        href: link({ view: "sample", sample: `${s.group_id}/${s.sample_index}` }),
      }),
    );
    const next =
      page.next === null ? el("span") : el("a", { id: "v-samples-next", href: link({ ...Object.fromEntries(st), after: page.next }, []) }, "next page →");
    box.replaceChildren(el("h3", {}, "Samples"), form, rows, next);
    return page.sql;
  }

  async function renderStep(runId, step, root) {
    const [summary, groups] = await Promise.all([
      api(runId, `/steps/${step}`),
      api(runId, `/steps/${step}/groups`, { after: state().get("gafter"), outcome: state().get("gout") }),
    ]);
    const s = summary.summary ?? {};
    const samplesBox = el("div", { class: "panel" });
    const sampleSql = await renderSamples(runId, { step }, samplesBox);
    root.replaceChildren(
      crumbs(runId, [[`step ${step}`, null]]),
      el("h2", { id: "v-title" }, `Step ${step}`),
      el(
        "p",
        { class: "summary" },
        `${s.groups ?? 0} groups: ${s.kept ?? 0} kept, ${s.filtered ?? 0} filtered, ${s.discarded ?? 0} discarded, ${s.aborted ?? 0} aborted · ` +
          `${s.samples ?? 0} samples · mean reward ${fmt(s.mean_reward)} (trained ${fmt(s.trained_reward)}) · mean length ${fmt(s.mean_length)}`,
        " · ",
        el("a", { href: link({ view: "compare", a: Math.max(0, step - 1), b: step }), id: "v-compare-prev" }, "compare with the step before"),
      ),
      el(
        "div",
        { class: "panel" },
        el("h3", {}, "Groups"),
        table(
          "v-groups",
          ["group", "outcome", "reason", "samples", "mean reward", "reward std", "min", "max", "mean length", "aborted rounds", "prompt"],
          groups.groups,
          (g) => [
            g.group_id,
            el("span", { class: `outcome ${g.outcome}` }, g.outcome),
            g.reason ?? "",
            g.samples,
            g.mean_reward,
            g.reward_std,
            g.min_reward,
            g.max_reward,
            g.mean_length,
            g.aborted_rounds,
            el("span", { class: "preview" }, g.prompt ?? ""),
          ],
          (g) => ({ "data-group": g.group_id, "data-outcome": g.outcome, href: link({ view: "group", step, group: g.group_id }) }),
        ),
        groups.next === null ? el("span") : el("a", { href: link({ view: "step", step, gafter: groups.next }) }, "more groups →"),
      ),
      samplesBox,
      sqlPanel([...summary.sql, ...groups.sql, ...sampleSql]),
    );
  }

  async function renderGroup(runId, step, group, root) {
    const samplesBox = el("div", { class: "panel" });
    const sql = await renderSamples(runId, { step, group }, samplesBox);
    root.replaceChildren(
      crumbs(runId, [
        [`step ${step}`, stepLink(step)],
        [`group ${group}`, null],
      ]),
      el("h2", { id: "v-title" }, `Step ${step} · group ${group}`),
      samplesBox,
      sqlPanel(sql),
    );
  }

  function tokenSpans(s, colouring) {
    // A token that decodes to nothing (a special token: BOS, end of turn) shows as its id.
    const pieces = s.tokens.map((t, i) => s.pieces?.[i] || `⟨${t}⟩`);
    const prompt = el("div", { id: "v-prompt-tokens", class: "tokens" });
    for (let i = 0; i < s.prompt_length; i++) prompt.append(el("span", { class: "prompt", title: `prompt token ${s.tokens[i]}` }, pieces[i] ?? ""));
    const response = el("div", { id: "v-tokens", class: "tokens", "data-colour": colouring });
    const mode = colourings[colouring] ?? colourings.version;
    for (let i = 0; i < s.response_length; i++) {
      const span = el(
        "span",
        {
          "data-version": s.token_versions?.[i] ?? -1,
          "data-mask": s.loss_mask?.[i] ?? 1,
          "data-logprob": s.rollout_log_probs?.[i] ?? "",
          "data-teacher-logprob": s.teacher_log_probs?.[i] ?? "",
          "data-train-logprob": s.train_log_probs?.[i] ?? "",
          title: `token ${s.tokens[s.prompt_length + i]} · ${mode.title(s, i)}`,
        },
        pieces[s.prompt_length + i] ?? "",
      );
      span.style.background = mode.of(s, i);
      response.append(span);
    }
    return { prompt, response };
  }

  async function renderSample(runId, ref, root) {
    const [group, index] = ref.split("/").map(Number);
    const d = await api(runId, `/samples/${group}/${index}`);
    const s = d.sample;
    // A colouring this sample has no data for (a teacher's, on a run that does not distil) is not offered.
    const offered = Object.entries(colourings).filter(([, c]) => !c.when || c.when(s));
    const asked = state().get("colour") ?? "version";
    const colouring = offered.some(([k]) => k === asked) ? asked : "version";
    const select = el("select", { id: "v-colour" }, ...offered.map(([k, c]) => el("option", { value: k }, c.label)));
    select.value = colouring;
    select.addEventListener("change", () => {
      const p = state();
      p.set("colour", select.value);
      location.hash = `#${p}`;
    });
    const { prompt, response } = tokenSpans(s, colouring);
    const components = Object.entries(s.reward_components ?? {});
    root.replaceChildren(
      crumbs(runId, [
        [`step ${s.step}`, stepLink(s.step)],
        [`group ${group}`, link({ view: "group", step: s.step, group })],
        [`sample ${index}`, null],
      ]),
      el("h2", { id: "v-title", "data-loaded": ref }, `Sample ${group}/${index}`),
      el(
        "p",
        { class: "summary" },
        `reward ${fmt(s.reward)} · ${s.status} (${s.finish_reason}) · ${s.outcome}${s.outcome_reason ? ` (${s.outcome_reason})` : ""} · ` +
          `trained at step ${s.trained_step ?? "–"} · staleness ${fmt(s.staleness)} · ${s.response_length} response tokens in ${s.num_segments} segment(s)`,
      ),
      components.length
        ? table("v-components", ["reward component", "value"], components, ([k, v]) => [k, typeof v === "object" ? JSON.stringify(v) : v])
        : el("p", { class: "legend" }, "the reward function returned no named components"),
      el("p", {}, el("label", {}, "colour tokens by ", select), el("span", { class: "legend" }, " · hover a token for its value")),
      el("div", {}, el("b", {}, "prompt"), prompt),
      el("div", {}, el("b", {}, "response"), response),
      el("h3", {}, "Segments"),
      table("v-segments", ["segment", "round", "step", "version", "expected", "mismatch", "tokens", "engine", "finish", "status", "error"], d.segments, (g) => [
        g.segment_index,
        g.round,
        g.step,
        g.weight_version,
        g.expected_weight_version,
        String(g.is_version_mismatch),
        `${g.token_start}–${g.token_end}`,
        g.engine,
        g.finish_reason,
        g.status,
        g.error ?? "",
      ]),
      el("h3", {}, "Rewards by round"),
      table("v-rewards", ["round", "step", "reward", "components"], d.rewards, (r) => [r.round, r.step, r.reward, JSON.stringify(r.components)]),
      el("h3", {}, "The group's decisions"),
      window.rlqTimeline ? window.rlqTimeline(d.decisions, "v-decisions") : el("span"),
      sqlPanel(d.sql),
    );
  }

  async function renderCompare(runId, a, b, root) {
    const [sa, sb, ga, gb] = await Promise.all([
      api(runId, `/steps/${a}`),
      api(runId, `/steps/${b}`),
      api(runId, `/steps/${a}/groups`),
      api(runId, `/steps/${b}/groups`),
    ]);
    const A = sa.summary ?? {};
    const B = sb.summary ?? {};
    const keys = [
      "samples",
      "groups",
      "kept",
      "filtered",
      "discarded",
      "aborted",
      "mean_reward",
      "trained_reward",
      "reward_std",
      "mean_length",
      "max_length",
      "truncated",
    ];
    const metricKeys = [...new Set([...Object.keys(A.train_metrics ?? {}), ...Object.keys(B.train_metrics ?? {})])].sort();
    const rows = [...keys.map((k) => [k, A[k], B[k]]), ...metricKeys.map((k) => [`train: ${k}`, A.train_metrics?.[k], B.train_metrics?.[k]])];
    const delta = (x, y) => (typeof x === "number" && typeof y === "number" ? y - x : null);
    const groupsOf = (step, g) =>
      el(
        "div",
        { class: "panel", "data-compare-step": step },
        el("h3", {}, el("a", { href: stepLink(step) }, `step ${step}`), " groups"),
        table(
          `v-groups-${step}`,
          ["group", "outcome", "reason", "mean reward", "mean length"],
          g.groups,
          (x) => [x.group_id, x.outcome, x.reason ?? "", x.mean_reward, x.mean_length],
          (x) => ({ "data-group": x.group_id, href: link({ view: "group", step, group: x.group_id }) }),
        ),
      );
    root.replaceChildren(
      crumbs(runId, [[`compare ${a} and ${b}`, null]]),
      el("h2", { id: "v-title" }, `Step ${a} and step ${b}`),
      table("v-compare", ["", `step ${a}`, `step ${b}`, "B − A"], rows, ([k, x, y]) => [k, x, y, delta(x, y)]),
      el("div", { class: "grid compare" }, groupsOf(a, ga), groupsOf(b, gb)),
      sqlPanel([...sa.sql, ...sb.sql, ...ga.sql, ...gb.sql]),
    );
  }

  let rendering = 0;
  async function render() {
    const st = state();
    const runId = st.get("run");
    const view = st.get("view");
    const root = $("#viewer");
    const stepsBox = $("#v-steps-panel");
    const ticket = ++rendering;
    const hash = location.hash;
    root.hidden = !runId || !view;
    try {
      if (!runId) return;
      if (!view) {
        await renderSteps(runId, stepsBox);
      } else {
        const box = el("div");
        if (view === "step") await renderStep(runId, Number(st.get("step")), box);
        else if (view === "group") await renderGroup(runId, Number(st.get("step")), Number(st.get("group")), box);
        else if (view === "sample") await renderSample(runId, st.get("sample") ?? "0/0", box);
        else if (view === "compare") await renderCompare(runId, Number(st.get("a")), Number(st.get("b")), box);
        else if (view === "samples") {
          const panel = el("div", { class: "panel" });
          const sql = await renderSamples(runId, {}, panel);
          box.append(crumbs(runId, [["all samples", null]]), el("h2", { id: "v-title" }, "All samples"), panel, sqlPanel(sql));
        } else box.append(el("p", {}, `unknown view '${view}': expected step, group, sample, compare or samples`));
        // A slower answer for an older hash must not replace the newer view.
        if (ticket !== rendering) return;
        root.replaceChildren(...box.childNodes);
      }
      if (ticket !== rendering) return;
      root.dataset.view = view ?? "";
      // What a test or a screenshot waits for: the view of this exact link is drawn (renders counts them).
      root.dataset.hash = hash;
      root.dataset.renders = String(Number(root.dataset.renders ?? 0) + 1);
      root.dataset.error = "";
    } catch (e) {
      root.dataset.error = String(e.message ?? e);
      root.dataset.hash = hash;
      root.dataset.renders = String(Number(root.dataset.renders ?? 0) + 1);
      root.replaceChildren(el("p", { class: "error" }, `viewer: ${e.message ?? e}`));
      root.hidden = false;
    }
  }

  window.addEventListener("hashchange", () => void render());
  void render();
  // The run page's newest steps follow a live run; a paged-back list, a viewer page and a compare
  // form being filled in stay as they are.
  setInterval(() => {
    const st = state();
    if (!st.get("run") || st.has("view") || st.has("before") || document.hidden) return;
    const form = $("#v-compare-form");
    if (form && [...form.elements].some((e) => e.value || e === document.activeElement)) return;
    void render();
  }, 10_000);
})();
