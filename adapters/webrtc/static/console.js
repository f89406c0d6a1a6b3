// The tool console of the call page: the agent's tools (built-ins, @tools, MCP) with their JSON schemas, a form
// per tool, Run, and "Land as span", which writes the result's reference into the live call (the span then
// arrives over the data channel like any other and shows up under Context spans). Side-effect tools ask first.
// `window.__console` mirrors what the console knows, for tests and debugging.
// The console and the recent calls need the admin role, not the page token: on the local demo it is open; else
// the developer pastes $DUETASPAN_ADMIN_TOKEN (kept in this tab's sessionStorage, sent as a header only).
"use strict";

(() => {
  let admin = sessionStorage.getItem("duetaspan-admin") || "";
  const $ = (id) => document.getElementById(id);
  const ui = {
    note: $("console-note"), body: $("console-body"), select: $("tool-select"), desc: $("tool-desc"),
    form: $("tool-form"), schema: $("tool-schema"), run: $("tool-run"), land: $("tool-land"),
    confirm: $("tool-confirm"), confirmName: $("tool-confirm-name"), yes: $("tool-confirm-yes"),
    no: $("tool-confirm-no"), result: $("tool-result"),
  };
  const state = (window.__console = { tools: [], tool: null, result: null, landed: [], errors: [], confirmAsked: 0 });
  const authed = (init = {}) => ({
    ...init, headers: { ...(init.headers || {}), ...(admin ? { Authorization: "Bearer " + admin } : {}) },
  });

  function el(tag, cls, text) {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined && text !== null) node.textContent = text;
    return node;
  }

  async function post(path, body) {
    const resp = await fetch(path, authed({
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
    }));
    return { status: resp.status, body: await resp.json().catch(() => ({})) };
  }

  async function load(attempt = 0) {
    const resp = await fetch("/webrtc/tools", authed()).catch(() => null);
    const body = resp ? await resp.json().catch(() => ({})) : {};
    if (resp && (resp.status === 401 || resp.status === 403)) {
      ui.note.textContent = "The tool console and recent calls need the admin token: " + (body.error || "");
      $("admin-form").hidden = false;
      return;
    }
    $("admin-form").hidden = true;
    if (!resp || !resp.ok) {
      ui.note.textContent = (body && body.error) || "The tools could not be listed.";
      if (resp && resp.status === 503 && attempt < 40) setTimeout(() => load(attempt + 1), 3000);
      return;
    }
    state.tools = body.tools || [];
    if (!state.tools.length) { ui.note.textContent = "This agent has no tools."; return; }
    ui.note.hidden = true;
    ui.body.hidden = false;
    for (const t of state.tools) {
      const opt = el("option", null, `${t.name} · ${t.source}${t.side_effect ? " · side effect" : ""}`);
      opt.value = t.name;
      ui.select.append(opt);
    }
    select(state.tools[0].name);
  }

  // the first concrete type of a property: "string", ["string","null"], or pydantic's anyOf for Optional
  function typeOf(prop) {
    const types = [].concat(prop.type || []).concat((prop.anyOf || prop.oneOf || []).flatMap((p) => [].concat(p.type || [])));
    return types.find((t) => t !== "null") || "json";
  }

  function select(name) {
    const tool = state.tools.find((t) => t.name === name);
    state.tool = tool;
    ui.confirm.hidden = true;
    ui.desc.replaceChildren(el("span", null, tool.description || "(no description)"));
    if (tool.side_effect) ui.desc.append(el("span", "badge side", "side effect: asks before running"));
    ui.desc.append(el("span", "badge", tool.source));
    ui.schema.textContent = JSON.stringify(tool.parameters, null, 2);
    ui.form.replaceChildren();
    const props = (tool.parameters && tool.parameters.properties) || {};
    const required = new Set((tool.parameters && tool.parameters.required) || []);
    for (const [key, prop] of Object.entries(props)) ui.form.append(field(key, prop, required.has(key)));
    if (!Object.keys(props).length) ui.form.append(el("p", "hint", "This tool takes no arguments."));
  }

  function field(key, prop, required) {
    const type = typeOf(prop);
    const label = el("label", "field" + (type === "boolean" ? " check" : ""));
    const title = el("span", null, key);
    if (required) title.append(el("span", "req", " *"));
    let input;
    if (prop.enum) {
      input = el("select");
      if (!required) input.append(el("option", null, ""));
      for (const v of prop.enum) { const o = el("option", null, String(v)); o.value = JSON.stringify(v); input.append(o); }
    } else if (type === "boolean") {
      input = el("input"); input.type = "checkbox"; input.checked = prop.default === true;
    } else if (type === "integer" || type === "number") {
      input = el("input"); input.type = "number"; input.step = type === "integer" ? "1" : "any";
    } else if (type === "string") {
      input = el("input"); input.type = "text";
    } else {
      input = el("textarea"); input.placeholder = "JSON";
    }
    input.name = key;
    input.dataset.kind = prop.enum ? "enum" : type;
    if (prop.default !== undefined && type !== "boolean") input.placeholder = `default: ${JSON.stringify(prop.default)}`;
    if (prop.description) label.title = prop.description;
    if (type === "boolean") label.append(input, title); else label.append(title, input);
    return label;
  }

  function collect() {
    const args = {};
    for (const input of ui.form.querySelectorAll("[name]")) {
      const kind = input.dataset.kind, key = input.name;
      if (kind === "boolean") { args[key] = input.checked; continue; }
      const raw = input.value.trim();
      if (raw === "") continue;
      if (kind === "enum") args[key] = JSON.parse(raw);
      else if (kind === "integer" || kind === "number") {
        const n = Number(raw);
        if (!Number.isFinite(n)) throw new Error(`${key}: not a number`);
        args[key] = n;
      } else if (kind === "string") args[key] = raw;
      else {
        try { args[key] = JSON.parse(raw); } catch (_) { throw new Error(`${key}: not valid JSON`); }
      }
    }
    return args;
  }

  async function run(confirm) {
    let args;
    try { args = collect(); } catch (err) { showError(err.message); return; }
    ui.confirm.hidden = true;
    ui.run.disabled = true;
    const body = { name: state.tool.name, arguments: args, confirm: !!confirm };
    if (window.__stats && window.__stats.callId && window.__stats.state === "live") body.call_id = window.__stats.callId;
    try {
      const { status, body: res } = await post("/webrtc/tools/run", body);
      if (status === 409 && res.confirm_required) {
        state.confirmAsked += 1;
        ui.confirmName.textContent = state.tool.name;
        ui.confirm.hidden = false;
        return;
      }
      if (status !== 200) { showError(res.error || `HTTP ${status}`); return; }
      state.result = res;
      showResult(res);
    } finally {
      ui.run.disabled = false;
      refreshLand();
    }
  }

  function showError(message) {
    state.errors.push(message);
    ui.result.replaceChildren(el("p", "err", message));
  }

  function showResult(res) {
    const head = el("div", "meta", `${res.tool} · ${res.ok ? "ok" : "failed"} · ${Math.round(res.elapsed_ms)} ms`);
    ui.result.replaceChildren(head, el("p", "ref", res.reference));
    if (res.error) ui.result.append(el("p", "err", res.error));
    ui.result.append(el("div", "meta", "arguments (redacted): " + JSON.stringify(res.arguments)));
    if (res.data !== null && res.data !== undefined) {
      const details = el("details");
      details.append(el("summary", null, "full result"), el("pre", null, JSON.stringify(res.data, null, 2)));
      ui.result.append(details);
    }
  }

  function callLive() { return !!(window.__stats && window.__stats.state === "live" && window.__stats.callId); }

  function refreshLand() {
    ui.land.disabled = !(state.result && callLive());
    ui.land.title = callLive() ? "write this reference into the live call as a Context Span" : "connect a call first";
  }

  async function land() {
    if (!state.result || !callLive()) return;
    ui.land.disabled = true;
    const callId = window.__stats.callId;
    const { status, body } = await post("/webrtc/tools/land", { result_id: state.result.result_id, call_id: callId });
    if (status !== 200) { showError(body.error || `HTTP ${status}`); refreshLand(); return; }
    state.landed.push({ call_id: callId, reference: body.reference });
    ui.result.append(el("p", "landed", `Landing in call ${callId}: watch Context spans.`));
    refreshLand();
  }

  // with an admin token a link cannot carry it: list the calls here, open each viewer page from a blob
  async function openBlob(path) {
    const resp = await fetch(path, authed());
    if (!resp.ok) { showError(`${path}: HTTP ${resp.status}`); return; }
    window.open(URL.createObjectURL(new Blob([await resp.text()], { type: "text/html" })), "_blank", "noreferrer");
  }
  async function recent(event) {
    if (!admin) return; // the local demo: the link opens the list itself
    event.preventDefault();
    const resp = await fetch("/webrtc/calls?format=json", authed());
    const list = $("recent-list");
    list.replaceChildren();
    list.hidden = false;
    if (!resp.ok) { list.append(el("li", null, `recent calls: HTTP ${resp.status}`)); return; }
    for (const c of (await resp.json()).calls || []) {
      const button = el("button", "ghost", `${c.call_id} · ${c.transport || ""} · ${c.duration_s} s`);
      button.type = "button";
      button.addEventListener("click", () => openBlob("/webrtc/calls/" + encodeURIComponent(c.call_id)));
      const item = el("li");
      item.append(button);
      list.append(item);
    }
  }
  $("recent-calls").addEventListener("click", recent);
  $("admin-form").addEventListener("submit", (event) => {
    event.preventDefault();
    admin = $("admin-token").value.trim();
    sessionStorage.setItem("duetaspan-admin", admin);
    load();
  });
  ui.select.addEventListener("change", () => select(ui.select.value));
  ui.run.addEventListener("click", () => run(false));
  ui.yes.addEventListener("click", () => run(true));
  ui.no.addEventListener("click", () => { ui.confirm.hidden = true; });
  ui.land.addEventListener("click", land);
  setInterval(refreshLand, 500);
  load();
})();
