// mlxnet app: the page. Plain JavaScript, no build step. The server does the models; the page
// keeps the selection: SAM's mask for the current prompts, plus brush strokes that add to it or
// remove from it, composed on a full-resolution mask canvas that "Erase" sends.
"use strict";

const $ = (id) => document.getElementById(id);
const imageCanvas = $("image"), overlay = $("overlay");
const state = {
  blob: null, imageId: null, width: 0, height: 0, bitmap: null,
  points: [], box: null, mode: "select", busy: 0,
  sam: null, add: null, remove: null, mask: null,   // canvases, image-sized
  labels: null, everything: null,                    // segment-everything label map
  detections: [], history: [], pendingSegment: false, segmenting: false,
};

function canvas(w, h) { const c = document.createElement("canvas"); c.width = w; c.height = h; return c; }

function setStatus(text, isError = false) {
  const s = $("status"); s.textContent = text; s.classList.toggle("error", isError);
}

// --- talking to the server ----------------------------------------------------------------------
async function post(path, fields, { wantBlob = false, withImage = false } = {}) {
  const form = new FormData();
  if (withImage || !state.imageId) form.append("image", state.blob, "image");
  else form.append("image_id", state.imageId);
  for (const [k, v] of Object.entries(fields)) {
    if (v instanceof Blob) form.append(k, v, k + ".png");
    else if (v !== null && v !== undefined) form.append(k, typeof v === "string" ? v : JSON.stringify(v));
  }
  const response = await fetch(path, { method: "POST", body: form });
  if (response.status === 404 && !withImage) return post(path, fields, { wantBlob, withImage: true });
  if (!response.ok) {
    let message = `${response.status}`;
    try { message = (await response.json()).error; } catch (e) { /* not JSON */ }
    throw new Error(message);
  }
  return wantBlob ? response : response.json();
}

async function busy(label, work) {
  state.busy++; setStatus(label + "…"); updateButtons();
  try { const result = await work(); return result; }
  catch (e) { setStatus(`${label}: ${e.message}`, true); return null; }
  finally { state.busy--; updateButtons(); }
}

function updateButtons() {
  const has = !!state.blob, idle = state.busy === 0;
  for (const id of ["detect", "classify"]) $(id).disabled = !has || !idle;
  $("erase").disabled = !has || !idle || maskArea() === 0;
  $("undo").disabled = !idle || state.history.length === 0;
  $("clear").disabled = !has || (maskArea() === 0 && state.points.length === 0 && !state.box);
  $("download-button").disabled = !has;
}

// --- opening an image ---------------------------------------------------------------------------
async function openBlob(blob, { keepHistory = false, imageId = null } = {}) {
  if (!keepHistory) state.history = [];
  state.blob = blob; state.imageId = imageId;
  const info = imageId ? { image_id: imageId } : await busy("Reading the image", () => post("/api/image", {}, { withImage: true }));
  if (!info) return;
  state.imageId = info.image_id;
  const bitmap = await createImageBitmap(blob, { imageOrientation: "from-image" });
  state.width = info.width || bitmap.width; state.height = info.height || bitmap.height;
  state.bitmap = bitmap;
  for (const c of [imageCanvas, overlay]) { c.width = state.width; c.height = state.height; }
  imageCanvas.getContext("2d").drawImage(bitmap, 0, 0, state.width, state.height);
  state.sam = canvas(state.width, state.height);
  state.add = canvas(state.width, state.height);
  state.remove = canvas(state.width, state.height);
  state.mask = canvas(state.width, state.height);
  state.points = []; state.box = null; state.labels = null; state.everything = null; state.detections = [];
  $("results").replaceChildren();
  $("layers").hidden = false; $("hint").hidden = true;
  $("download").href = URL.createObjectURL(blob);
  composeMask(); draw();
  if (!imageId) setStatus(`${state.width}×${state.height}: click an object`);
}

$("file").addEventListener("change", (e) => { if (e.target.files[0]) openBlob(e.target.files[0]); });
const stage = $("stage");
stage.addEventListener("dragover", (e) => { e.preventDefault(); stage.classList.add("dragging"); });
stage.addEventListener("dragleave", () => stage.classList.remove("dragging"));
stage.addEventListener("drop", (e) => {
  e.preventDefault(); stage.classList.remove("dragging");
  const file = [...e.dataTransfer.files].find((f) => f.type.startsWith("image/"));
  if (file) openBlob(file);
});

// --- the mask -----------------------------------------------------------------------------------
// A mask PNG from the server (white = selected) as white-on-transparent, to compose with strokes.
async function maskFromPng(base64) {
  const bitmap = await createImageBitmap(await (await fetch("data:image/png;base64," + base64)).blob());
  const c = canvas(state.width, state.height), ctx = c.getContext("2d");
  ctx.drawImage(bitmap, 0, 0);
  const data = ctx.getImageData(0, 0, c.width, c.height);
  const px = data.data;
  for (let i = 0; i < px.length; i += 4) {
    const on = px[i] > 127;
    px[i] = px[i + 1] = px[i + 2] = 255; px[i + 3] = on ? 255 : 0;
  }
  ctx.putImageData(data, 0, 0);
  return c;
}

function composeMask() {
  if (!state.mask) return;
  const ctx = state.mask.getContext("2d");
  ctx.globalCompositeOperation = "source-over";
  ctx.clearRect(0, 0, state.width, state.height);
  ctx.drawImage(state.sam, 0, 0);
  ctx.drawImage(state.add, 0, 0);
  ctx.globalCompositeOperation = "destination-out";
  ctx.drawImage(state.remove, 0, 0);
  ctx.globalCompositeOperation = "source-over";
  overlay.dataset.maskArea = String(countMask());
}

function countMask() {
  const px = state.mask.getContext("2d").getImageData(0, 0, state.width, state.height).data;
  let n = 0;
  for (let i = 3; i < px.length; i += 4) if (px[i] > 0) n++;
  return n;
}

function maskArea() { return Number(overlay.dataset.maskArea || 0); }

// The mask as the API takes it: an opaque PNG, white where the image is to be filled.
function maskBlob() {
  const c = canvas(state.width, state.height), ctx = c.getContext("2d");
  ctx.fillStyle = "#000"; ctx.fillRect(0, 0, c.width, c.height);
  ctx.drawImage(state.mask, 0, 0);
  return new Promise((resolve) => c.toBlob(resolve, "image/png"));
}

// --- drawing ------------------------------------------------------------------------------------
const PALETTE = ["#e6194b", "#3cb44b", "#4363d8", "#f58231", "#911eb4", "#42d4f4", "#f032e6", "#bfef45",
                 "#469990", "#9a6324", "#800000", "#808000", "#000075"];

function draw() {
  const ctx = overlay.getContext("2d");
  ctx.clearRect(0, 0, overlay.width, overlay.height);
  if (state.everything && state.mode === "everything") ctx.drawImage(state.everything, 0, 0);
  if (state.mask) {
    const tint = canvas(state.width, state.height), t = tint.getContext("2d");
    t.drawImage(state.mask, 0, 0);
    t.globalCompositeOperation = "source-in";
    t.fillStyle = "rgba(37, 99, 235, 0.55)"; t.fillRect(0, 0, tint.width, tint.height);
    ctx.drawImage(tint, 0, 0);
  }
  const r = Math.max(4, Math.round(Math.max(state.width, state.height) / 150));
  for (const [x, y, label] of state.points) {
    ctx.beginPath(); ctx.arc(x, y, r, 0, 2 * Math.PI);
    ctx.fillStyle = label ? "#16a34a" : "#dc2626"; ctx.fill();
    ctx.lineWidth = Math.max(1, r / 3); ctx.strokeStyle = "#fff"; ctx.stroke();
  }
  if (state.box) {
    const [x0, y0, x1, y1] = state.box;
    ctx.lineWidth = Math.max(2, r / 2); ctx.strokeStyle = "#facc15"; ctx.strokeRect(x0, y0, x1 - x0, y1 - y0);
  }
  ctx.font = `${Math.max(12, r * 3)}px system-ui, sans-serif`;
  state.detections.forEach((d, i) => {
    const [x0, y0, x1, y1] = d.box, color = PALETTE[d.class % PALETTE.length];
    ctx.lineWidth = Math.max(2, r / 2); ctx.strokeStyle = color; ctx.strokeRect(x0, y0, x1 - x0, y1 - y0);
    const text = `${d.name} ${(d.score * 100).toFixed(0)}%`, w = ctx.measureText(text).width + 8, h = r * 3 + 6;
    ctx.fillStyle = color; ctx.fillRect(x0, Math.max(0, y0 - h), w, h);
    ctx.fillStyle = "#fff"; ctx.fillText(text, x0 + 4, Math.max(0, y0 - h) + h - 5);
  });
  overlay.dataset.boxes = String(state.detections.length);
  updateButtons();
}

// --- selecting ----------------------------------------------------------------------------------
function toImage(event) {
  const rect = overlay.getBoundingClientRect();
  const x = (event.clientX - rect.left) * (overlay.width / rect.width);
  const y = (event.clientY - rect.top) * (overlay.height / rect.height);
  return [Math.min(Math.max(x, 0), overlay.width), Math.min(Math.max(y, 0), overlay.height)];
}

async function segment() {
  if (state.segmenting) { state.pendingSegment = true; return; }
  state.segmenting = true;
  try {
    do {
      state.pendingSegment = false;
      const points = state.points.map(([x, y, l]) => [Math.round(x), Math.round(y), l]);
      if (!points.some((p) => p[2] === 1) && !state.box) {
        state.sam.getContext("2d").clearRect(0, 0, state.width, state.height);
        composeMask(); draw(); return;
      }
      const started = performance.now();
      const result = await busy("Selecting", () => post("/api/segment", { points, box: state.box }));
      if (!result) return;
      state.sam = await maskFromPng(result.mask);
      composeMask(); draw();
      const page = performance.now() - started;
      $("timing").textContent = `mask: ${result.ms.mask} ms on the server` +
        (result.ms.embed ? ` (+ ${result.ms.embed} ms embedding the image once)` : "") +
        `, ${page.toFixed(0)} ms in the page`;
      setStatus(`selected ${maskArea()} pixels (SAM score ${result.score.toFixed(3)})`);
    } while (state.pendingSegment);
  } finally { state.segmenting = false; }
}

let drag = null;
overlay.addEventListener("contextmenu", (e) => e.preventDefault());
overlay.addEventListener("pointerdown", (e) => {
  if (!state.blob || state.busy && state.mode !== "select") return;
  overlay.setPointerCapture(e.pointerId);
  drag = { start: toImage(e), negative: e.button === 2 || e.shiftKey, moved: false, last: toImage(e) };
  if (state.mode === "add" || state.mode === "remove") stroke(drag.last, drag.last);
});
overlay.addEventListener("pointermove", (e) => {
  if (!drag) return;
  const here = toImage(e);
  const far = Math.hypot(here[0] - drag.start[0], here[1] - drag.start[1]) > Math.max(5, state.width / 200);
  drag.moved = drag.moved || far;
  if (state.mode === "add" || state.mode === "remove") { stroke(drag.last, here); drag.last = here; }
  else if (state.mode === "select" && drag.moved) { state.box = boxOf(drag.start, here); draw(); }
});
overlay.addEventListener("pointerup", (e) => {
  if (!drag) return;
  const here = toImage(e), d = drag; drag = null;
  if (state.mode === "select") {
    if (d.moved) state.box = boxOf(d.start, here);
    else state.points.push([here[0], here[1], d.negative ? 0 : 1]);
    draw(); segment();
  } else if (state.mode === "everything") {
    pickRegion(here);
  } else {
    composeMask(); draw();
    setStatus(`selected ${maskArea()} pixels (${state.mode === "add" ? "brush added" : "brush removed"})`);
  }
});

function boxOf(a, b) {
  return [Math.min(a[0], b[0]), Math.min(a[1], b[1]), Math.max(a[0], b[0]), Math.max(a[1], b[1])].map(Math.round);
}

function stroke(from, to) {
  const target = state.mode === "add" ? state.add : state.remove, other = state.mode === "add" ? state.remove : state.add;
  const size = Number($("brush").value) * Math.max(1, state.width / overlay.getBoundingClientRect().width);
  for (const [c, op] of [[target, "source-over"], [other, "destination-out"]]) {
    const ctx = c.getContext("2d");
    ctx.globalCompositeOperation = op;
    ctx.strokeStyle = "#fff"; ctx.lineWidth = size; ctx.lineCap = "round";
    ctx.beginPath(); ctx.moveTo(...from); ctx.lineTo(...to); ctx.stroke();
    ctx.globalCompositeOperation = "source-over";
  }
  composeMask(); draw();
}

// --- segment everything -------------------------------------------------------------------------
async function everything() {
  const result = await busy("Segmenting everything", () => post("/api/everything", {}));
  if (!result) return;
  const bitmap = await createImageBitmap(await (await fetch("data:image/png;base64," + result.labels)).blob());
  const c = canvas(state.width, state.height), ctx = c.getContext("2d");
  ctx.drawImage(bitmap, 0, 0);
  state.labels = ctx.getImageData(0, 0, c.width, c.height).data;
  const shown = ctx.createImageData(c.width, c.height);
  for (let i = 0; i < state.labels.length; i += 4) {
    const label = state.labels[i];
    if (!label) continue;
    const hex = PALETTE[label % PALETTE.length];
    shown.data[i] = parseInt(hex.slice(1, 3), 16); shown.data[i + 1] = parseInt(hex.slice(3, 5), 16);
    shown.data[i + 2] = parseInt(hex.slice(5, 7), 16); shown.data[i + 3] = 110;
  }
  ctx.putImageData(shown, 0, 0);
  state.everything = c; draw();
  setStatus(`${result.count} regions in ${result.ms} ms: click one to select it`);
}

function pickRegion([x, y]) {
  if (!state.labels) return;
  const at = (Math.min(state.height - 1, Math.floor(y)) * state.width + Math.min(state.width - 1, Math.floor(x))) * 4;
  const label = state.labels[at];
  const c = canvas(state.width, state.height), ctx = c.getContext("2d"), data = ctx.createImageData(c.width, c.height);
  for (let i = 0; i < state.labels.length; i += 4) {
    if (label && state.labels[i] === label) { data.data[i] = data.data[i + 1] = data.data[i + 2] = data.data[i + 3] = 255; }
  }
  ctx.putImageData(data, 0, 0);
  state.sam = c; state.points = []; state.box = null;
  composeMask(); draw();
  setStatus(label ? `region ${label}: ${maskArea()} pixels` : "no region there");
}

// --- erase, undo, detect, classify --------------------------------------------------------------
// One erase request (the selection's mask, or every instance of a class); the result replaces
// the image, the previous one kept for undo.
async function eraseWith(label, fields, done) {
  const started = performance.now();
  const response = await busy(label, () => post("/api/erase", fields, { wantBlob: true }));
  if (!response) return;
  const blob = await response.blob();
  state.history.push({ blob: state.blob, imageId: state.imageId });
  await openBlob(blob, { keepHistory: true, imageId: response.headers.get("X-Image-Id") });
  $("timing").textContent = `erase: ${response.headers.get("X-Ms")} ms on the server, ` +
    `${(performance.now() - started).toFixed(0)} ms in the page`;
  setStatus(`${done}${response.headers.get("X-Filled-Pixels")} pixels`);
  updateButtons();
}

$("erase").addEventListener("click", async () => {
  await eraseWith("Erasing", { mask: await maskBlob() }, "erased ");
});

function eraseClass(id, name) {
  return eraseWith(`Erasing every ${name}`, { classes: JSON.stringify([id]), conf: $("conf").value },
    `erased every ${name}: `);
}

$("undo").addEventListener("click", async () => {
  const previous = state.history.pop();
  if (previous) { await openBlob(previous.blob, { keepHistory: true, imageId: previous.imageId }); setStatus("undone"); }
});

$("clear").addEventListener("click", () => {
  state.points = []; state.box = null;
  for (const c of [state.sam, state.add, state.remove]) c.getContext("2d").clearRect(0, 0, c.width, c.height);
  composeMask(); draw(); setStatus("selection cleared");
});

$("detect").addEventListener("click", async () => {
  const result = await busy("Detecting", () => post("/api/detect", { conf: $("conf").value }));
  if (!result) return;
  state.detections = result.detections;
  const list = $("results"); list.replaceChildren();
  for (const d of result.detections) {
    const li = document.createElement("li"); li.className = "detection";
    li.textContent = `${d.name} ${(d.score * 100).toFixed(1)}%`; list.append(li);
  }
  // One button per class found: erase every instance (a segment model's masks, else SAM's).
  const found = new Map(result.detections.map((d) => [d.class, d.name]));
  for (const [id, name] of found) {
    const li = document.createElement("li"); li.className = "erase-class";
    const button = document.createElement("button");
    button.textContent = `Erase every ${name}`; button.dataset.classId = String(id);
    button.addEventListener("click", () => eraseClass(id, name));
    li.append(button); list.append(li);
  }
  draw();
  $("timing").textContent = `detect: ${result.ms} ms on the server`;
  setStatus(`${result.detections.length} objects`);
});

$("classify").addEventListener("click", async () => {
  const result = await busy("Classifying", () => post("/api/classify", {}));
  if (!result) return;
  const list = $("results"); list.replaceChildren();
  for (const t of result.top) {
    const li = document.createElement("li"); li.className = "label";
    li.textContent = `${t.label} ${(t.probability * 100).toFixed(1)}%`; list.append(li);
  }
  $("timing").textContent = `classify: ${result.ms} ms on the server`;
  setStatus(`top: ${result.top[0].label}`);
});

for (const button of document.querySelectorAll("button[data-mode]")) {
  button.addEventListener("click", () => {
    state.mode = button.dataset.mode;
    for (const b of document.querySelectorAll("button[data-mode]")) b.setAttribute("aria-pressed", String(b === button));
    if (state.mode === "everything" && state.blob && !state.everything) everything(); else draw();
  });
}

// For scripts and tests: the current image and mask as PNG data URLs.
window.mlxnet = {
  state,
  maskDataURL: () => { const c = canvas(state.width, state.height), x = c.getContext("2d");
    x.fillStyle = "#000"; x.fillRect(0, 0, c.width, c.height); x.drawImage(state.mask, 0, 0); return c.toDataURL("image/png"); },
  imageDataURL: () => new Promise((resolve) => { const r = new FileReader(); r.onload = () => resolve(r.result); r.readAsDataURL(state.blob); }),
};
