// The duetaspan call page: microphone -> WebRTC -> agent, agent voice back, and the call's events
// (agent words, caller utterances, <ret>, spans) from the data channel. Served by `duetaspan serve --webrtc`.
// `window.__stats` mirrors what the page knows (connection state, RTP counters, events) for tests and debugging.
"use strict";

(() => {
  const params = new URLSearchParams(location.search);
  const token = params.get("token") || "";
  const raw = params.get("raw") === "1"; // no browser noise suppression / gain control
  const aec = params.get("aec") !== "0"; // echo cancellation on unless ?aec=0
  const $ = (id) => document.getElementById(id);
  const ui = {
    status: $("status"), connect: $("connect"), forceRet: $("force-ret"), transcript: $("transcript"),
    spans: $("spans"), mic: $("mic-level"), agent: $("agent-level"), counters: $("counters"), audio: $("agent-audio"),
  };
  const stats = (window.__stats = {
    state: "idle", callId: null, iceState: null, events: {}, rets: 0, spans: [], noSpans: 0, misses: [],
    agentText: "", callerTexts: [], server: null, inbound: null, outbound: null, micLevel: 0, errors: [],
  });
  let pc = null, dc = null, mic = null, timers = [], agentBubble = null, lastAgentAt = 0;

  function setState(state, text) {
    stats.state = state;
    ui.status.textContent = text || state;
    ui.status.className = "pill " + state;
    const live = state === "connecting" || state === "live";
    ui.connect.textContent = live ? "Hang up" : "Connect";
    ui.connect.classList.toggle("hangup", live);
  }

  function fail(message) {
    stats.errors.push(String(message));
    setState("error", String(message).slice(0, 80));
    hangUp(false);
  }

  const authed = (init = {}) => ({ ...init, headers: { ...(init.headers || {}), Authorization: "Bearer " + token } });

  async function connect() {
    ui.transcript.innerHTML = ""; ui.spans.innerHTML = "";
    setState("connecting", "connecting…");
    try {
      const cfgResp = await fetch("/webrtc/config", authed());
      if (!cfgResp.ok) throw new Error("config: HTTP " + cfgResp.status);
      const cfg = await cfgResp.json();
      ui.forceRet.hidden = !cfg.force_ret;
      mic = await navigator.mediaDevices.getUserMedia({
        audio: { echoCancellation: aec, noiseSuppression: !raw, autoGainControl: !raw, channelCount: 1 },
      });
      pc = new RTCPeerConnection({ iceServers: (cfg.ice_servers || []).map((u) => ({ urls: u })) });
      dc = pc.createDataChannel("duetaspan", { ordered: true });
      dc.onmessage = (e) => onMessage(e.data);
      dc.onopen = () => timers.push(setInterval(() => dc && dc.readyState === "open" && dc.send("ping"), 1000));
      pc.addTransceiver(mic.getAudioTracks()[0], { direction: "sendrecv" });
      pc.ontrack = (e) => {
        ui.audio.srcObject = e.streams[0] || new MediaStream([e.track]);
        ui.audio.play().catch(() => {}); // autoplay may wait for a gesture; the button click is one
      };
      pc.oniceconnectionstatechange = () => { stats.iceState = pc && pc.iceConnectionState; };
      pc.onconnectionstatechange = () => {
        if (!pc) return;
        const s = pc.connectionState;
        if (s === "connected") setState("live", "live");
        else if (s === "failed") fail("connection failed");
        else if (s === "disconnected" || s === "closed") { if (stats.state === "live") setState("ended", "call ended"); }
      };
      await pc.setLocalDescription(await pc.createOffer());
      await iceGathered(pc, 3000);
      const resp = await fetch("/webrtc/offer", authed({
        method: "POST", headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ sdp: pc.localDescription.sdp, type: pc.localDescription.type }),
      }));
      const body = await resp.json().catch(() => ({}));
      if (!resp.ok) throw new Error(body.error || "offer: HTTP " + resp.status);
      stats.callId = body.call_id;
      await pc.setRemoteDescription({ sdp: body.sdp, type: body.type });
      timers.push(setInterval(pollStats, 500));
    } catch (err) {
      fail(err && err.message ? err.message : err);
    }
  }

  function iceGathered(peer, ms) {
    if (peer.iceGatheringState === "complete") return Promise.resolve();
    return new Promise((resolve) => {
      const done = () => { peer.removeEventListener("icegatheringstatechange", check); resolve(); };
      const check = () => peer.iceGatheringState === "complete" && done();
      peer.addEventListener("icegatheringstatechange", check);
      setTimeout(done, ms); // host candidates are enough on a LAN; don't wait for slow STUN
    });
  }

  function hangUp(userAction = true) {
    timers.forEach(clearInterval); timers = [];
    if (dc) { try { dc.close(); } catch (_) {} dc = null; }
    if (pc) { try { pc.close(); } catch (_) {} pc = null; }
    if (mic) { mic.getTracks().forEach((t) => t.stop()); mic = null; }
    ui.forceRet.hidden = true;
    if (userAction) setState("ended", "call ended");
  }

  async function pollStats() {
    if (!pc) return;
    const report = await pc.getStats();
    report.forEach((s) => {
      if (s.type === "inbound-rtp" && s.kind === "audio") {
        stats.inbound = { packetsReceived: s.packetsReceived, bytesReceived: s.bytesReceived,
          totalSamplesReceived: s.totalSamplesReceived, totalAudioEnergy: s.totalAudioEnergy,
          audioLevel: s.audioLevel, jitter: s.jitter };
        ui.agent.style.width = Math.min(100, 100 * Math.sqrt(s.audioLevel || 0) * 1.4) + "%";
      } else if (s.type === "outbound-rtp" && s.kind === "audio") {
        stats.outbound = { packetsSent: s.packetsSent, bytesSent: s.bytesSent };
      } else if (s.type === "media-source" && s.kind === "audio") {
        stats.micLevel = s.audioLevel || 0;
        ui.mic.style.width = Math.min(100, 100 * Math.sqrt(stats.micLevel) * 1.4) + "%";
      }
    });
    renderCounters();
  }

  function renderCounters() {
    const sv = stats.server, inb = stats.inbound;
    const parts = [];
    if (sv) parts.push(`server heard ${sv.caller_seconds.toFixed(1)} s of you`, `agent sent ${sv.agent_seconds.toFixed(1)} s`);
    if (inb) parts.push(`${inb.packetsReceived} packets in`);
    parts.push(`${stats.spans.length} span${stats.spans.length === 1 ? "" : "s"}`);
    ui.counters.textContent = parts.join(" · ");
  }

  function el(tag, cls, text) {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function scrollDown(panel) { panel.parentElement.scrollTop = panel.parentElement.scrollHeight; }

  function addBubble(who, text) {
    const bubble = el("div", "bubble " + who);
    bubble.append(el("span", "who", who === "agent" ? "agent" : "you"), el("span", "text", text));
    ui.transcript.append(bubble);
    scrollDown(ui.transcript);
    return bubble;
  }

  function onAgentText(text) {
    stats.agentText += text;
    const now = performance.now();
    // one bubble per stretch of speech; a pause of 1.5 s or a caller utterance starts a new one
    if (!agentBubble || now - lastAgentAt > 1500) agentBubble = addBubble("agent", "");
    lastAgentAt = now;
    const span = agentBubble.querySelector(".text");
    span.textContent = (span.textContent + text).replace(/^\s+/, "");
    scrollDown(ui.transcript);
  }

  function addSpanCard(m) {
    const card = el("div", "card");
    const head = el("div", "head");
    head.append(el("span", "tool", m.tool || "direct answer"),
      el("span", "lat", (m.latency_ms != null ? `${Math.round(m.latency_ms)} ms` : "") + (m.t != null ? ` · t=${m.t.toFixed(1)} s` : "")));
    card.append(head);
    if (m.arguments && Object.keys(m.arguments).length) card.append(el("div", "args", JSON.stringify(m.arguments)));
    card.append(el("p", "ref", m.reference));
    if (m.question) card.append(el("p", "q", "“" + m.question + "”"));
    ui.spans.prepend(card);
  }

  // every <ret> that lands no span gets a card saying why: no span (the router's reason), late (the deadline
  // and the stage it caught), failed (the stage and the error, e.g. the ASR's HTTP 401 without an API key)
  function addMiss(kind, title, detail, m) {
    stats.misses.push({ kind, stage: m.stage || null, reason: detail || "", t: m.t == null ? null : m.t });
    const card = el("div", "card miss " + kind);
    const head = el("div", "head");
    head.append(el("span", "tool", title));
    if (m.stage) head.append(el("span", "lat", "at " + m.stage));
    card.append(head);
    if (detail) card.append(el("p", "ref", detail));
    if (m.question) card.append(el("p", "q", "“" + m.question + "”"));
    if (kind === "failed" && /\b401\b|api key/i.test(detail || ""))
      card.append(el("p", "hint", "no API key? export the variable [router] api_key_env names (OPENAI_API_KEY by " +
        "default) before `duetaspan serve`, or point [router] at your own server; the tool console works without one"));
    ui.spans.prepend(card);
  }

  function onRetrieval(ev) {
    if (!ev || ev.kind !== "error") return; // question, router, tool... steps of a retrieval still running
    addMiss("failed", "retrieval failed", ev.error || "unknown error", { stage: ev.stage, t: ev.t });
  }

  function onMessage(data) {
    let m;
    try { m = JSON.parse(data); } catch (_) { return; }
    if (!m || m.label !== "duetaspan") return;
    stats.events[m.type] = (stats.events[m.type] || 0) + 1;
    switch (m.type) {
      case "hello": stats.callId = m.call_id; ui.forceRet.hidden = !m.force_ret; break;
      case "agent_text": onAgentText(m.text); break;
      case "caller_text": stats.callerTexts.push(m.text); agentBubble = null; addBubble("caller", m.text); break;
      case "ret": stats.rets += 1; ui.spans.prepend(el("div", "ret", `<ret> at t=${(m.t || 0).toFixed(1)} s: the model asked for a span`)); break;
      case "span": stats.spans.push(m); addSpanCard(m); renderCounters(); agentBubble = null; break;
      case "no_span": stats.noSpans += 1; addMiss("no_span", "no span", m.reason || "", m); break;
      case "late_span":
        addMiss("late", `late: no span within ${(m.seconds || 0).toFixed(1)} s`,
          m.reference ? "dropped: " + m.reference : "the deadline passed before a reference was ready", m);
        break;
      case "retrieval": onRetrieval(m.event); break;
      case "barge_in": ui.transcript.append(el("div", "note", "— you interrupted —")); agentBubble = null; break;
      case "stats": stats.server = m; renderCounters(); break;
    }
  }

  ui.connect.addEventListener("click", () => (pc ? hangUp(true) : connect()));
  ui.forceRet.addEventListener("click", () => {
    if (dc && dc.readyState === "open") dc.send(JSON.stringify({ label: "duetaspan", type: "force_ret" }));
  });
  window.addEventListener("beforeunload", () => hangUp(false));
  if (!token) fail("no token in the page URL: open the URL printed by `duetaspan serve --webrtc`");
})();
