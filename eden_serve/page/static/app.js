// The page of `eden-serve page`: a clip in, its run watched over the live connection, then the
// original and the result played in step. Plain browser JavaScript: no build step, no library.
const $ = (id) => document.getElementById(id);
const state = { clip: null, run: null, hello: null, originalRate: 25, resultRate: 50, duration: 0, shown: null };

// The login: the token of the address the command printed, kept in this tab's storage (which is
// this origin's alone: scheme, host and port) and sent as a header, never as a cookie, which a
// browser would send to every port of this host (docs/page.md).
const TOKEN = new URLSearchParams(location.search).get("token") || sessionStorage.getItem("eden-page-token") || "";
sessionStorage.setItem("eden-page-token", TOKEN);
if (location.search) history.replaceState(null, "", "/");

function api(path, options = {}) {
  return fetch(path, { ...options, headers: { ...(options.headers || {}), Authorization: `Bearer ${TOKEN}` } });
}

// A URL of a video or a download, which an element loads without our header: signed for that path
// alone by the page, for a few minutes (SIGNED_FOR in guard.py).
async function signed(path) {
  const answer = await api(`/sign?path=${encodeURIComponent(path)}`);
  if (!answer.ok) throw new Error(`cannot sign ${path} (${answer.status})`);
  return (await answer.json()).url;
}

// A video whose signed URL expired while it played asks for another, and goes on where it was.
function playFrom(video, path) {
  video.dataset.path = path;
  return signed(path).then((url) => { video.src = url; });
}

function renew(video) {
  if (Date.now() - Number(video.dataset.renewed || 0) < 10000) return;  // not an expired URL: a real error
  video.dataset.renewed = String(Date.now());
  const time = video.currentTime;
  signed(video.dataset.path).then((url) => {
    video.addEventListener("loadedmetadata", () => { video.currentTime = time; }, { once: true });
    video.src = url;
  });
}

function say(reason) {
  $("error").textContent = reason || "";
}

function seconds(value) {
  if (value === null || value === undefined) return "—";
  if (value >= 60) return `${Math.floor(value / 60)}:${String(Math.round(value % 60)).padStart(2, "0")}`;
  return `${value.toFixed(value < 10 ? 2 : 1)} s`;
}

function bytes(value) {
  if (value >= 1e6) return `${(value / 1e6).toFixed(2)} MB`;
  if (value >= 1e3) return `${(value / 1e3).toFixed(1)} kB`;
  return `${Math.round(value)} B`;
}

// --- the clip --------------------------------------------------------------------------------

async function upload(file) {
  say("");
  $("clip").textContent = `Uploading ${file.name}…`;
  const answer = await api("/uploads", {
    method: "POST", body: file, headers: { "X-Clip-Name": encodeURIComponent(file.name) },
  });
  const document_ = await answer.json().catch(() => ({ message: `the upload failed (${answer.status})` }));
  if (!answer.ok) {
    $("clip").textContent = "No clip yet.";
    say(`eden-serve: error: ${document_.message}`);
    return;
  }
  chosen({ upload: document_.id }, document_, document_.play);
}

function chosen(clip, info, play) {
  state.clip = { ask: clip, info, play };
  state.originalRate = info.rate || 25;
  const frames = info.frames ? `${info.frames} frames, ` : "";
  const name = clip.source ? `cloud:${clip.source}` : info.label;
  const hdr = info.hdr ? `, HDR (${info.hdr})` : "";
  $("clip").textContent = `${name}: ${info.kind}, ${frames}${info.width}x${info.height}, ${info.rate.toFixed(2)} frames/s${hdr}`;
  // A browser shows no PQ or HLG: the page plays previews tone-mapped to SDR, and says so.
  $("tone").hidden = !info.hdr;
  $("tone").textContent = info.hdr ? `HDR (${info.hdr}): a browser cannot show it, so the original, the result and the ` +
    "latest middle show here tone-mapped to SDR. The download is the result itself, in HDR." : "";
  $("clip").dataset.ready = "true";
  $("start").disabled = false;
}

function dropZone() {
  const zone = $("drop");
  for (const name of ["dragenter", "dragover"]) {
    zone.addEventListener(name, (event) => { event.preventDefault(); zone.classList.add("over"); });
  }
  zone.addEventListener("dragleave", () => zone.classList.remove("over"));
  zone.addEventListener("drop", (event) => {
    event.preventDefault();
    zone.classList.remove("over");
    const file = event.dataTransfer.files[0];
    if (file) upload(file);
  });
  $("file").addEventListener("change", () => { if ($("file").files[0]) upload($("file").files[0]); });
  $("source").addEventListener("change", async () => {
    const name = encodeURIComponent($("source").value);
    if (!name) return;
    const answer = await api(`/sources/info?name=${name}`);
    const info = await answer.json();
    if (!answer.ok) return say(`eden-serve: error: ${info.message}`);
    chosen({ source: $("source").value }, info, info.play);
  });
}

async function listSources() {
  const answer = await api("/sources");
  if (!answer.ok) return;
  const { sources } = await answer.json();
  for (const name of sources) $("source").append(new Option(name, name));
  $("sources-row").hidden = sources.length === 0;
}

// --- the run ---------------------------------------------------------------------------------

function options() {
  const fields = {};
  for (const element of $("form").elements) {
    if (element.name && element.name !== "container" && element.value.trim()) fields[element.name] = element.value.trim();
  }
  if (fields.fps) delete fields.factor;
  return fields;
}

function start(socket) {
  say("");
  state.run = null;
  state.shown = null;
  $("compare").hidden = true;
  const container = $("form").elements.container.value;
  socket.send(JSON.stringify({ type: "start", clip: state.clip.ask, options: options(), container }));
  $("start").disabled = true;
}

function progress(run) {
  $("progress").hidden = false;
  $("progress").dataset.run = run.id;
  $("cancel").hidden = !["queued", "running"].includes(run.state);
  $("start").disabled = ["queued", "running"].includes(run.state) || !state.clip;
  $("state").textContent = run.state === "queued" ? `queued (${run.position} before it)` : run.state;
  $("pairs").textContent = run.total ? `${run.pairs} / ${run.total}` : String(run.pairs);
  $("bar").max = run.total || 1;
  $("bar").value = run.total ? run.pairs : (run.state === "done" ? 1 : 0);
  $("rate").textContent = run.rate ? run.rate.toFixed(2) : "—";
  $("left").textContent = run.state === "done" ? seconds(0) : seconds(run.left);
  $("first").textContent = seconds(run.first_middle);
  $("summary").textContent = run.summary;
  if (run.previews && run.previews !== state.run?.previews) showPreview(run.id);
  if (run.reason) say(run.reason);
  split(run);
  if (run.state === "done" && state.shown !== run.id) compare(run);
  state.run = run;
}

async function showPreview(id) {
  const answer = await api(`/runs/${id}/preview.png`);
  if (!answer.ok) return;
  const old = $("preview").src;
  $("preview").src = URL.createObjectURL(await answer.blob());
  if (old.startsWith("blob:")) URL.revokeObjectURL(old);
}

function split(run) {
  const rows = Object.entries(run.codecs);
  $("split").hidden = rows.length === 0 && run.chunks.length === 0;
  $("split-title").textContent = state.hello.servers
    ? "The split: what crossed the link, and each chunk's time at the cloud and the edge"
    : "In process: each chunk's time at the cloud (E_cond), on the wire (the codec) and at the edge (DiT + decoder)";
  document.querySelector(".legend .wire").hidden = state.hello.servers;  // the wire's time is the cloud's there
  const body = $("codecs").tBodies[0];
  body.replaceChildren(...rows.map(([codec, moved]) => {
    const row = body.insertRow();
    const per = (value) => (moved.pairs && value ? bytes(value / moved.pairs) : "—");
    for (const text of [codec, moved.pairs, per(moved.sent), per(moved.received), per(moved.payload)]) {
      row.insertCell().textContent = text;
    }
    return row;
  }));
  const longest = Math.max(1e-6, ...run.chunks.map((c) => (c.cloud || 0) + (c.wire || 0) + (c.edge || 0)));
  const inOrder = [...run.chunks].sort((a, b) => a.first - b.first);  // they end in any order
  $("chunks").replaceChildren(...inOrder.map((chunk) => chunkBar(chunk, longest)));
}

function chunkBar(chunk, longest) {
  const line = document.createElement("div");
  line.className = "chunk";
  const name = document.createElement("span");
  name.className = "name";
  name.textContent = `pairs ${chunk.first}–${chunk.first + chunk.pairs - 1}`;
  line.append(name);
  for (const stage of ["cloud", "wire", "edge"]) {
    if (chunk[stage] === null || chunk[stage] === undefined) continue;
    const bar = document.createElement("span");
    bar.className = `bar ${stage}`;
    bar.style.width = `${(45 * chunk[stage]) / longest}%`;
    bar.title = `${stage}: ${chunk[stage].toFixed(3)} s`;
    line.append(bar);
  }
  const figures = document.createElement("span");
  figures.className = "figures";
  figures.textContent = ["cloud", "wire", "edge"].filter((s) => chunk[s] !== null && chunk[s] !== undefined)
    .map((s) => `${s} ${chunk[s].toFixed(3)} s`).join(", ");
  line.append(figures);
  return line;
}

// --- the comparison --------------------------------------------------------------------------

function compare(run) {
  state.shown = run.id;
  $("compare").hidden = false;
  playFrom($("original"), state.clip.play);
  playFrom($("result"), `/runs/${run.id}/play`);
  $("download").dataset.path = `/runs/${run.id}/result`;
  freshLink();
  const factor = Number(fraction(options().factor || "2"));
  state.resultRate = options().fps ? Number(fraction(options().fps)) : state.originalRate * factor;
  $("result").addEventListener("loadedmetadata", () => marks(run), { once: true });
}

function fraction(text) {
  const [top, bottom] = text.split("/");
  return Number(top) / (bottom ? Number(bottom) : 1);
}

function marks(run) {
  state.duration = $("result").duration;
  $("cuts").replaceChildren(...run.cuts.map((interval) => {
    const mark = document.createElement("span");
    mark.className = "cut";
    mark.dataset.interval = interval;
    mark.title = `scene cut between frames ${interval} and ${interval + 1}`;
    mark.style.left = `${(100 * (interval + 1)) / state.originalRate / state.duration}%`;
    return mark;
  }));
}

const videos = () => [$("result"), $("original")];

function showTime() {
  const t = $("result").currentTime;
  $("time").textContent = `${t.toFixed(3)} s`;
  if (state.duration) $("seek").value = (1000 * t) / state.duration;
}

function seek(t) {
  for (const video of videos()) {
    video.pause();
    video.currentTime = Math.max(0, Math.min(t, state.duration || t));
  }
  $("play").textContent = "Play";
  showTime();
}

function step(direction) {
  const frame = Math.round($("result").currentTime * state.resultRate) + direction;
  seek((Math.max(0, frame) + 0.25) / state.resultRate);  // inside the frame, not on its edge
}

function follow() {
  // The original follows the result: corrected where it drifts by more than half a frame.
  const [leader, follower] = videos();
  if (Math.abs(follower.currentTime - leader.currentTime) > 0.5 / state.resultRate) follower.currentTime = leader.currentTime;
  showTime();
  if (!leader.paused) leader.requestVideoFrameCallback(follow);
}

function playPause() {
  const [leader, follower] = videos();
  if (leader.paused) {
    follower.currentTime = leader.currentTime;
    Promise.all(videos().map((video) => video.play())).then(() => leader.requestVideoFrameCallback(follow));
    $("play").textContent = "Pause";
  } else {
    seek(leader.currentTime);
  }
}

// The download's link, signed again when half its time has gone; a click on an older one waits for it.
async function freshLink() {
  const link = $("download");
  link.href = await signed(link.dataset.path);
  link.dataset.signed = String(Date.now());
}

function download(event) {
  const link = $("download");
  if (Date.now() - Number(link.dataset.signed || 0) < 120000) return;
  event.preventDefault();
  freshLink().then(() => link.click());
}

function player() {
  $("download").addEventListener("click", download);
  for (const video of videos()) video.addEventListener("error", () => { if (video.dataset.path) renew(video); });
  $("play").addEventListener("click", playPause);
  $("back").addEventListener("click", () => step(-1));
  $("next").addEventListener("click", () => step(1));
  $("seek").addEventListener("input", () => seek((Number($("seek").value) / 1000) * state.duration));
  $("result").addEventListener("ended", () => seek($("result").duration));
  for (const radio of document.querySelectorAll("input[name=view]")) {
    radio.addEventListener("change", () => {
      $("stage").className = radio.value;
      $("wipe").hidden = radio.value !== "wipe";
    });
  }
  $("wipe").addEventListener("input", () => $("stage").style.setProperty("--wipe", `${$("wipe").value}%`));
}

// --- the connection --------------------------------------------------------------------------

function connect() {
  const socket = new WebSocket(`ws://${location.host}/live`, TOKEN ? ["eden-page", TOKEN] : []);
  socket.addEventListener("message", (event) => {
    const message = JSON.parse(event.data);
    if (message.type === "hello") hello(message);
    if (message.type === "run") progress(message);
    if (message.type === "refused") { say(message.reason); $("start").disabled = !state.clip; }
  });
  socket.addEventListener("close", () => {
    $("mode").textContent = "disconnected: the page's server stopped or refused this page";
    $("start").disabled = true;
  });
  $("start").addEventListener("click", () => start(socket));
  $("cancel").addEventListener("click", () => socket.send(JSON.stringify({ type: "cancel" })));
}

function hello(message) {
  state.hello = message;
  $("mode").textContent = message.servers
    ? (message.split ? "through a cloud and an edge server" : "through a server")
    : "in this process";
  const select = $("form").elements["wire-codec"];
  for (const codec of message.codecs) select.append(new Option(codec, codec));
  if (message.sources) listSources();
  document.body.dataset.ready = "true";
}

dropZone();
player();
connect();
