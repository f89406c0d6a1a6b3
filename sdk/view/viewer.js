// The call viewer (`duetaspan view`): draws one recorded call from the JSON in #call-data, offline.
// Every text from the record goes through textContent, never innerHTML. `window.__view` says what was drawn
// (for tests and debugging).
"use strict";

(() => {
  const data = JSON.parse(document.getElementById("call-data").textContent);
  const $ = (id) => document.getElementById(id);
  const audio = $("audio");
  const call = data.call, counts = data.counts;
  const duration = Math.max(call.duration_s || 0, 0.5);
  const OUTCOME = { landed: "landed", late: "late span", none: "no span", error: "failed", cancelled: "cancelled",
    delivered: "delivered (call ended)", pending: "unfinished" };
  let pps = 0; // pixels per second

  function el(tag, cls, text) {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined && text !== null) node.textContent = text;
    return node;
  }
  const fmt = (t) => (t == null ? "?" : `${t.toFixed(2)} s`);
  const ms = (v) => (v == null ? "–" : `${Math.round(v)} ms`);
  const clock = (t) => `${Math.floor(t / 60)}:${(t % 60).toFixed(1).padStart(4, "0")}`;

  function header() {
    $("title").textContent = call.call_id || "call";
    document.title = `duetaspan · ${call.call_id || "call"}`;
    const when = call.started_at ? new Date(call.started_at * 1000).toISOString().replace("T", " ").slice(0, 19) + " UTC" : "";
    $("subtitle").textContent = [call.transport, call.caller && `from ${call.caller}`, call.called && `to ${call.called}`,
      when, call.complete ? `ended (${call.ended_by || "closed"})` : "INCOMPLETE record (rebuilt from the event log)"]
      .filter(Boolean).join(" · ");
    const lateP99 = call.clock && call.clock.lateness_p99_ms;
    const figs = [
      [clock(call.duration_s || 0), "long"], [counts.rets, "<ret>"], [counts.landed, "spans landed"],
      [counts.late, "late", counts.late ? "warn" : ""], [counts.none, "no span"],
      [counts.failed, "failed", counts.failed ? "bad" : ""], [counts.barge_ins, "barge-ins"],
      [counts.persona_pins || 0, "persona re-pins"],
      [counts.concealed_frames, "concealed frames", counts.concealed_frames ? "warn" : ""],
      [counts.errors, "errors", counts.errors ? "bad" : ""],
    ];
    if (lateP99 != null) figs.push([`${lateP99.toFixed(1)} ms`, "clock p99"]);
    const answer = call.answer;  // who answered (answer detection): the verdict and when it came
    if (answer) {
      figs.push([answer.verdict, `answered, decided at ${fmt(answer.decided_at_s)}` +
        (answer.beep_at_s != null ? `, beep at ${fmt(answer.beep_at_s)}` : "") +
        (answer.outcome ? ` (${answer.outcome})` : ""), answer.verdict === "human" ? "" : "warn"]);
    }
    for (const [value, label, cls] of figs) {
      const f = el("span", "fig" + (cls ? " " + cls : ""));
      f.append(el("b", null, String(value)), label);
      $("figures").append(f);
    }
  }

  function decode(b64) {
    const bin = atob(b64 || "");
    const out = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
    return out;
  }

  function waveSvg(peaks, rate, color) {
    const ns = "http://www.w3.org/2000/svg";
    const svg = document.createElementNS(ns, "svg");
    svg.setAttribute("viewBox", `0 -1 ${duration} 2`);
    svg.setAttribute("preserveAspectRatio", "none");
    const path = document.createElementNS(ns, "path");
    let top = "", bottom = "";
    for (let i = 0; i < peaks.length; i++) {
      const x = (i / rate).toFixed(3), y = (peaks[i] / 255).toFixed(3);
      top += `L${x} ${-y}`;
      bottom = `L${x} ${y}` + bottom;
    }
    path.setAttribute("d", `M0 0${top}${bottom}Z`);
    path.setAttribute("fill", color);
    svg.append(path);
    return svg;
  }

  const rows = {};
  function buildTimeline() {
    const tl = $("timeline");
    for (const name of ["axis", "callerWave", "callerWords", "events", "agentWords", "agentWave"]) {
      const cls = { axis: "axis", callerWave: "wave", agentWave: "wave", callerWords: "words", agentWords: "words", events: "events" }[name];
      rows[name] = el("div", "row " + cls);
      tl.append(rows[name]);
    }
    const css = getComputedStyle(document.documentElement);
    if (data.peaks) {
      rows.callerWave.append(waveSvg(decode(data.peaks.caller), data.peaks.rate, css.getPropertyValue("--caller")));
      rows.agentWave.append(waveSvg(decode(data.peaks.agent), data.peaks.rate, css.getPropertyValue("--agent")));
    } else {
      rows.callerWave.append(el("span", "noaudio", " no audio recorded for this call"));
    }
    for (const [t0, t1] of data.concealed) {
      const c = place(el("div", "conceal"), t0, t1);
      c.title = `${fmt(t0)}–${fmt(t1)}: no caller audio arrived in time; the model heard silence (concealed)`;
      rows.callerWave.append(c);
    }
    for (const u of data.utterances) {
      const b = place(el("div", "box caller", u.text), u.t0, u.t1);
      b.title = `${fmt(u.t0)}–${fmt(u.t1)} caller: ${u.text}`;
      b.dataset.t = u.t0;
      rows.callerWords.append(b);
    }
    for (const p of data.phrases) {
      const b = place(el("div", "box agent", p.text), p.t0, p.t1);
      b.title = `${fmt(p.t0)} agent: ${p.text}`;
      b.dataset.t = p.t0;
      rows.agentWords.append(b);
    }
    const byId = Object.fromEntries(data.retrievals.map((r) => [r.id, r]));
    for (const r of data.retrievals) {
      const end = r.span ? r.span.t : r.t + (r.ended_ms || 0) / 1000;
      const f = place(el("div", "flight " + r.outcome), r.t, Math.max(end, r.t + 0.05));
      rows.events.append(f);
      const m = el("div", "mk ret", `R${r.id}`);
      m.title = `<ret> at ${fmt(r.t)}: ${r.question || "(no question)"}`;
      rows.events.append(pin(m, r.t, r.id));
      if (r.span) {
        const s = el("div", "mk landed", "✓");
        s.title = `span landed at ${fmt(r.span.t)}: ${r.reference}`;
        rows.events.append(pin(s, r.span.t, r.id));
      } else if (r.outcome !== "delivered" && r.outcome !== "pending") {
        const s = el("div", "mk " + r.outcome, { late: "late", none: "∅", error: "!", cancelled: "×" }[r.outcome] || "?");
        s.title = `${OUTCOME[r.outcome]}: ${r.reason || ""}`;
        rows.events.append(pin(s, end, r.id));
      }
    }
    for (const r of data.rets.filter((x) => x.retrieval == null)) {
      const m = el("div", "mk ret", "R");
      m.title = `<ret> at ${fmt(r.t)} (no retrieval recorded)`;
      rows.events.append(pin(m, r.t));
    }
    for (const d of data.deduplicated) {
      const m = el("div", "mk dedup", "R");
      m.title = `<ret> at ${fmt(d.t)} ignored: a retrieval was already in flight`;
      rows.events.append(pin(m, d.t));
    }
    data.spans.forEach((s, i) => {
      if (s.retrieval != null) return;
      const m = el("div", "mk injected", "S");
      m.title = `span landed at ${fmt(s.t)} without a retrieval (tool console or custom backend): ${s.reference}`;
      rows.events.append(pin(m, s.t, "s" + i));
    });
    for (const p of data.persona_pins || []) {
      const m = el("div", "mk pin", "P");
      m.title = `persona re-pinned at ${fmt(p.t)}: ${p.n_frames} frames in ${p.prefill_ms} ms (not a span)`;
      rows.events.append(pin(m, p.t));
    }
    for (const b of data.barge_ins) {
      const line = el("div", "bargeline");
      line.append(el("span", null, "barge-in"));
      line.dataset.t = b.t;
      line.title = `caller barged in at ${fmt(b.t)} after ${b.spoke_s} s of agent speech`;
      tl.append(line);
    }
    const head = el("div", "playhead");
    head.id = "playhead";
    tl.append(head);
    tl.addEventListener("click", (e) => {
      const card = e.target.dataset && e.target.dataset.card;
      if (card) { highlight(card); }
      const t = (e.clientX - tl.getBoundingClientRect().left) / pps;
      seek(e.target.dataset && e.target.dataset.t ? Number(e.target.dataset.t) : t);
    });
  }

  function place(node, t0, t1) { node.dataset.t0 = t0; node.dataset.t1 = t1; return node; }
  function pin(node, t, card) { node.dataset.at = t; node.dataset.t = t; if (card != null) node.dataset.card = card; return node; }

  function layout() {
    const tl = $("timeline");
    const width = Math.ceil(duration * pps) + 40;
    tl.style.width = width + "px";
    tl.querySelectorAll("[data-t0]").forEach((n) => {
      n.style.left = n.dataset.t0 * pps + "px";
      n.style.width = Math.max(2, (n.dataset.t1 - n.dataset.t0) * pps) + "px";
    });
    tl.querySelectorAll("[data-at], .bargeline").forEach((n) => { n.style.left = (n.dataset.at || n.dataset.t) * pps + "px"; });
    tl.querySelectorAll("svg").forEach((s) => {
      s.setAttribute("width", duration * pps);
      s.setAttribute("height", s.parentElement.clientHeight || 64);
    });
    rows.axis.replaceChildren();
    const step = [0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300].find((s) => s * pps >= 70) || 600;
    for (let t = 0; t <= duration + 1e-6; t += step) {
      const tick = el("div", "tick", clock(t));
      tick.style.left = t * pps + "px";
      rows.axis.append(tick);
    }
    movePlayhead();
  }

  function movePlayhead() {
    const t = audio ? audio.currentTime : 0;
    $("playhead").style.left = t * pps + "px";
    const sc = $("scroller");
    const x = t * pps;
    if (audio && !audio.paused && (x < sc.scrollLeft || x > sc.scrollLeft + sc.clientWidth - 40)) sc.scrollLeft = x - 60;
  }

  function seek(t) {
    if (audio) { audio.currentTime = Math.max(0, Math.min(t, duration)); }
    const sc = $("scroller"), x = t * pps;
    if (x < sc.scrollLeft || x > sc.scrollLeft + sc.clientWidth) sc.scrollLeft = Math.max(0, x - 80);
    movePlayhead();
  }

  function highlight(card) {
    document.querySelectorAll(".card.hl").forEach((c) => c.classList.remove("hl"));
    const node = document.querySelector(`.card[data-card="${card}"]`);
    if (node) { node.classList.add("hl"); node.scrollIntoView({ block: "nearest", behavior: "smooth" }); }
  }

  function stageBar(st, endedMs) {
    const parts = [["capture", st.capture], ["router", st.router], ["tool", st.tool], ["prefill", st.prefill]]
      .filter(([, v]) => v != null);
    const box = el("div");
    if (!parts.length) return box;
    const total = Math.max(st.total || 0, parts.reduce((a, [, v]) => a + v, 0), 1);
    const bar = el("div", "stages");
    for (const [name, v] of parts) {
      const seg = el("i", "st-" + name);
      seg.style.width = (100 * v) / total + "%";
      seg.title = `${name}: ${ms(v)}`;
      bar.append(seg);
    }
    const legend = el("div", "stlegend");
    for (const [name, v] of parts) legend.append(el("span", null, `${name} ${ms(v)}`));
    if (st.asr != null) legend.append(el("span", null, `(asr ${ms(st.asr)}, waited ${ms(st.wait)})`));
    const overall = st.total != null ? st.total : st.delivered;
    legend.append(el("b", null, overall != null ? `total ${ms(overall)}` : `ended after ${ms(endedMs)}`));
    box.append(bar, legend);
    return box;
  }

  function dl(pairs) {
    const list = el("dl");
    for (const [k, v, cls] of pairs) {
      if (v == null || v === "") continue;
      list.append(el("dt", null, k), el("dd", cls || null, v));
    }
    return list;
  }

  function cards() {
    const box = $("retrievals");
    for (const r of data.retrievals) {
      const card = el("div", "card " + r.outcome);
      card.dataset.card = r.id;
      card.dataset.t = r.t;
      const head = el("div", "head");
      const left = el("span");
      left.append(el("span", "id", `R${r.id}`), ` <ret> at ${fmt(r.t)}`);
      const outcome = r.span ? `landed at ${fmt(r.span.t)}` : OUTCOME[r.outcome] || r.outcome;
      head.append(left, el("span", "pill " + r.outcome, outcome));
      card.append(head, dl([
        ["question", r.question ? `“${r.question}”` + (r.how ? ` (${r.how})` : "") : null],
        ["router", r.decision ? r.decision + (r.detail && r.decision !== "tool" ? `: ${r.detail}` : "") : null],
        ["tool", r.tool ? r.tool + (r.tool_ok === false ? ` — failed: ${r.tool_error || ""}` : "") : null, "mono"],
        ["arguments", r.arguments ? JSON.stringify(r.arguments) : null, "mono"],
        ["reference", r.reference],
        ["why", r.outcome !== "landed" ? r.reason : null],
      ]), stageBar(r.stages, r.ended_ms));
      box.append(card);
    }
    data.spans.forEach((s, i) => {
      if (s.retrieval != null) return;
      const card = el("div", "card injected");
      card.dataset.card = "s" + i;
      card.dataset.t = s.t;
      const head = el("div", "head");
      head.append(el("span", null, `span at ${fmt(s.t)}`), el("span", "pill injected", "no <ret>: tool console / custom"));
      card.append(head, dl([
        ["tool", s.tool, "mono"], ["arguments", s.arguments ? JSON.stringify(s.arguments) : null, "mono"],
        ["reference", s.reference], ["prefill", s.prefill_ms != null ? ms(s.prefill_ms) : null],
      ]));
      box.append(card);
    });
    for (const e of data.errors) {
      const card = el("div", "card error");
      card.append(el("div", "head", `error (${e.stage || "?"})`), el("p", null, e.message));
      box.append(card);
    }
    if (!box.children.length) box.append(el("p", "empty", "The model asked for no Context Span in this call."));
    box.addEventListener("click", (e) => {
      const card = e.target.closest(".card");
      if (card && card.dataset.t) { highlight(card.dataset.card); seek(Number(card.dataset.t)); }
    });
  }

  function transcript() {
    const lines = [
      ...data.turns.map((u) => ({ t: u.start, who: u.who, text: u.text })),
      ...data.retrievals.map((r) => ({ t: r.t, who: "event", label: `R${r.id}`,
        text: `<ret> → ${r.tool || r.decision || "…"} → ${r.span ? "span landed" : OUTCOME[r.outcome]}` })),
      ...data.barge_ins.map((b) => ({ t: b.t, who: "event", label: "barge", text: "the caller barged in" })),
    ].sort((a, b) => a.t - b.t);
    const box = $("transcript");
    for (const l of lines) {
      const line = el("div", "line " + l.who);
      line.dataset.t = l.t;
      line.append(el("span", "ts", clock(l.t)), el("span", "who", l.label || (l.who === "caller" ? "caller" : "agent")),
        el("span", "tx", l.text));
      box.append(line);
    }
    if (!lines.length) box.append(el("p", "empty", "Nothing was said."));
    box.addEventListener("click", (e) => { const line = e.target.closest(".line"); if (line) seek(Number(line.dataset.t)); });
  }

  function analysis() {  // the end-of-call analysis (written after the call): summary, success, fields or error
    const a = data.analysis;
    if (!a) return 0;
    const pairs = [["summary", a.summary], ["success", a.success == null ? null : (a.success ? "yes" : "no"),
      a.success == null ? "" : (a.success ? "yes" : "no")]];
    for (const [k, v] of Object.entries(a.fields || {})) {
      pairs.push([k, typeof v === "string" ? v : JSON.stringify(v), typeof v === "string" ? "" : "mono"]);
    }
    if (a.error) pairs.push(["error", `${a.error}` + (a.attempts ? ` (after ${a.attempts} attempts)` : ""), "no"]);
    const list = dl(pairs);
    $("analysis").append(list);
    $("analysis-panel").hidden = false;
    return list.querySelectorAll("dd").length;
  }

  header();
  buildTimeline();
  cards();
  transcript();
  const analysed = analysis();
  const zoom = $("zoom");
  const fit = Math.max(10, Math.min(200, ($("scroller").clientWidth - 40) / duration));
  zoom.value = String(Math.round(fit));
  pps = Number(zoom.value);
  zoom.addEventListener("input", () => { pps = Number(zoom.value); layout(); });
  window.addEventListener("resize", layout);
  layout();
  if (audio) {
    const tick = () => { movePlayhead(); if (!audio.paused) requestAnimationFrame(tick); };
    audio.addEventListener("play", () => requestAnimationFrame(tick));
    audio.addEventListener("seeked", movePlayhead);
  }
  const tl = $("timeline");
  window.__view = {
    ready: true, counts, duration,
    drawn: {
      utterances: rows.callerWords.children.length, phrases: rows.agentWords.children.length,
      markers: rows.events.querySelectorAll(".mk").length, cards: $("retrievals").querySelectorAll(".card").length,
      concealed: rows.callerWave.querySelectorAll(".conceal").length, waves: document.querySelectorAll(".row svg").length,
      barge_ins: tl.querySelectorAll(".bargeline").length, analysis: analysed,
    },
  };
})();
