// The scratch pad: write a program, run it in a sandbox through the gateway, watch its output.
import { lintGutter, setDiagnostics } from "@codemirror/lint";
import { Compartment, Prec } from "@codemirror/state";
import { keymap } from "@codemirror/view";
import { basicSetup, EditorView } from "codemirror";
import { Api, ApiError } from "./api.js";
import { showFiles, clearFiles } from "./files.js";
import { exampleFor, grammarFor } from "./languages.js";
import { Session } from "./session.js";
import { describeError, describeResult, describeTruncation, quantityBytes } from "./words.js";
import "./pad.css";

const KEY_STORAGE = "sandpod.apiKey";
const LANGUAGE_STORAGE = "sandpod.language";
const MIB = 2 ** 20;
const $ = (id) => document.getElementById(id);

const api = new Api(() => localStorage.getItem(KEY_STORAGE) || "");
const state = { tenant: null, languages: [], language: null, run: null };
const session = new Session(api, {
  info: $("session-info"),
  endButton: $("session-end"),
  toggle: $("session-toggle"),
  onChange: (open) => {
    $("language").disabled = open;
    $("memory").disabled = open; // a session's runs get the session's resources
  },
  onError: handleError,
});

const grammar = new Compartment();
const editor = new EditorView({
  parent: $("editor"),
  extensions: [
    Prec.highest(keymap.of([{ key: "Mod-Enter", run: () => (run(), true) }])),
    basicSetup,
    grammar.of([]),
    lintGutter(),
    EditorView.updateListener.of((update) => update.docChanged && saveDraft()),
    EditorView.contentAttributes.of({ "aria-label": "Code" }),
  ],
});

// --- messages and status ---------------------------------------------------------------------

function showMessage(text, kind = "error") {
  const element = $("message");
  element.textContent = text;
  element.dataset.kind = kind;
  element.hidden = !text;
}

function setStatus(text, phase, result = "") {
  const element = $("status");
  element.textContent = text;
  element.dataset.state = phase;
  element.dataset.result = result;
}

function handleError(error) {
  if (error.status === 401) askForKey(describeError(error));
  else showMessage(describeError(error));
}

// --- the key ---------------------------------------------------------------------------------

function askForKey(error = "") {
  $("key-error").textContent = error;
  $("key-error").hidden = !error;
  if (!$("key-dialog").open) $("key-dialog").showModal();
  $("key-input").focus();
}

async function saveKey(event) {
  event.preventDefault();
  const key = $("key-input").value.trim();
  if (!key) return;
  localStorage.setItem(KEY_STORAGE, key);
  if (await connect()) {
    $("key-input").value = "";
    $("key-dialog").close();
  }
}

function forgetKey() {
  localStorage.removeItem(KEY_STORAGE);
  $("key-input").value = "";
  $("tenant").textContent = "";
  askForKey();
}

/** Checks the key and loads what depends on it; false when the key is refused. */
async function connect() {
  try {
    const [tenant, list] = await Promise.all([api.get("/v1/tenant"), api.get("/v1/languages")]);
    state.tenant = tenant;
    applyLimits(tenant);
    await fillLanguages(list.languages);
    showMessage("");
    setStatus("Ready when you are.", "idle");
    document.body.dataset.state = "ready";
    return true;
  } catch (error) {
    if (error.status === 401) localStorage.removeItem(KEY_STORAGE);
    handleError(error);
    return false;
  }
}

// --- languages and drafts ----------------------------------------------------------------------

async function fillLanguages(languages) {
  state.languages = languages;
  const select = $("language");
  select.replaceChildren(
    ...languages.map((l) => new Option(l.version ? `${l.name} ${l.version}` : l.name, l.name)),
  );
  const names = languages.map((l) => l.name);
  const saved = localStorage.getItem(LANGUAGE_STORAGE);
  select.value = names.includes(saved) ? saved : names.includes("python") ? "python" : names[0];
  for (const id of ["language", "example", "run"]) $(id).disabled = false;
  session.setLanguage(select.value);
  await selectLanguage(select.value);
}

async function selectLanguage(name) {
  state.language = name;
  localStorage.setItem(LANGUAGE_STORAGE, name);
  setCode(localStorage.getItem(`sandpod.draft.${name}`) ?? exampleFor(name));
  editor.dispatch({ effects: grammar.reconfigure(await grammarFor(name)) });
  const lint = Boolean(state.languages.find((l) => l.name === name)?.lint);
  $("lint").hidden = !lint;
  $("lint").disabled = !lint;
  session.setLanguage(name);
}

function setCode(text) {
  editor.dispatch({ changes: { from: 0, to: editor.state.doc.length, insert: text } });
  editor.dispatch(setDiagnostics(editor.state, []));
}

function saveDraft() {
  if (state.language) localStorage.setItem(`sandpod.draft.${state.language}`, editor.state.doc.toString());
}

// --- limits and the request ------------------------------------------------------------------

function applyLimits(tenant) {
  const { limits, defaults } = tenant;
  $("tenant").textContent = `tenant ${tenant.name}`;
  Object.assign($("timeout"), { max: limits.max_timeout_seconds, placeholder: defaults.timeout_seconds });
  const maxMiB = Math.floor(quantityBytes(limits.max_memory) / MIB);
  Object.assign($("memory"), { max: maxMiB, placeholder: Math.floor(quantityBytes(defaults.memory) / MIB) });
  $("limits").textContent =
    `Empty fields get ${defaults.timeout_seconds} s and ${defaults.memory}. ` +
    `This tenant may ask for up to ${limits.max_timeout_seconds} s and ${limits.max_memory}, ` +
    `with ${limits.max_concurrent} runs at once.`;
}

function numberInput(id, what) {
  const input = $(id);
  if (input.disabled || input.value === "") return null;
  if (!input.checkValidity()) {
    $("options").open = true;
    input.focus();
    throw new Error(`${what} must be a whole number from ${input.min} to ${input.max}.`);
  }
  return Number(input.value);
}

function runRequest(mode) {
  const request = { language: state.language, code: editor.state.doc.toString() };
  if (mode === "lint") return { ...request, mode };
  const stdin = $("stdin").value;
  const timeout = numberInput("timeout", "The timeout (seconds)");
  const memory = numberInput("memory", "The memory (MiB)");
  if (stdin) request.stdin = stdin;
  if (timeout !== null) request.timeout_seconds = timeout;
  if (memory !== null) request.memory = `${memory}Mi`;
  return request;
}

// --- running -----------------------------------------------------------------------------------

const executionPath = (id) => `/v1/executions/${encodeURIComponent(id)}`;

function setBusy(busy) {
  $("run").disabled = busy;
  $("lint").disabled = busy || $("lint").hidden;
  $("cancel").disabled = !busy;
  session.setBusy(busy);
}

function clearOutput() {
  for (const id of ["stdout", "stderr"]) $(id).textContent = "";
  $("value").hidden = true;
  clearFiles($("files"));
}

function append(stream, text) {
  const pane = $(stream);
  const atEnd = pane.scrollTop + pane.clientHeight >= pane.scrollHeight - 4;
  pane.append(text);
  if (atEnd) pane.scrollTop = pane.scrollHeight;
}

async function run() {
  if (state.run || !state.language) return;
  let request;
  try {
    request = runRequest("run");
  } catch (error) {
    showMessage(error.message);
    return;
  }
  showMessage("");
  clearOutput();
  const timeout = request.timeout_seconds ?? state.tenant.defaults.timeout_seconds;
  // A session's runs stream from the session's route; any run is also one of the tenant's
  // executions (get, cancel, files).
  const base = session.executionsPath() ?? "/v1/executions";
  state.run = { id: null, base, controller: new AbortController(), timeout };
  setBusy(true);
  setStatus("Sending…", "running");
  try {
    const { body } = await api.send("POST", `${base}?wait=false`, request);
    state.run.id = body.id;
    setStatus(describeResult(body), "running");
    finish(await follow(state.run), timeout);
  } catch (error) {
    if (error.name !== "AbortError") handleError(error);
    setStatus("Not run.", "idle");
  } finally {
    state.run = null;
    setBusy(false);
    session.refresh();
  }
}

/** Streams the output into the panes; the result from the stream's end (or a GET). */
async function follow(current) {
  const stream = `${current.base}/${encodeURIComponent(current.id)}/stream`;
  const events = api.events(stream, current.controller.signal);
  for await (const { event, data } of events) {
    const payload = JSON.parse(data);
    if (event === "stdout" || event === "stderr") {
      if ($("status").textContent !== "Running…") setStatus("Running…", "running");
      append(event, payload.data);
    } else if (event === "exit") {
      return payload;
    } else if (event === "error") {
      throw new ApiError(502, payload.code, payload.message);
    }
  }
  return api.get(executionPath(current.id)); // the stream ended early: the result as it stands
}

function finish(result, timeout) {
  for (const stream of ["stdout", "stderr"]) {
    if (!$(stream).textContent && result[stream]) $(stream).textContent = result[stream];
  }
  setStatus(describeResult(result, timeout) + describeTruncation(result), "done", result.status);
  if (result.result != null) {
    $("value").textContent = `→ ${result.result}`;
    $("value").hidden = false;
  }
  if (result.state_lost) {
    showMessage("The session's interpreter was restarted: variables from earlier runs are gone.", "warning");
  }
  showFiles($("files"), result, api, executionPath(result.id), handleError);
}

async function cancel() {
  if (!state.run?.id) return;
  $("cancel").disabled = true;
  setStatus("Cancelling…", "running");
  try {
    await api.send("DELETE", executionPath(state.run.id));
  } catch (error) {
    handleError(error);
  }
}

// --- lint ----------------------------------------------------------------------------------------

/** A ruff diagnostic (1-based line and column) as an editor marker over the word there. */
function editorDiagnostic(editorState, { line, column, code, message }) {
  const { doc } = editorState;
  const row = doc.line(Math.min(Math.max(line ?? 1, 1), doc.lines));
  const from = Math.min(row.from + Math.max((column ?? 1) - 1, 0), row.to);
  const to = editorState.wordAt(from)?.to ?? Math.min(from + 1, row.to);
  return { from, to, severity: "error", source: code || "ruff", message };
}

async function lint() {
  if (state.run) return;
  showMessage("");
  setBusy(true);
  $("cancel").disabled = true;
  setStatus("Linting…", "running");
  try {
    const { body } = await api.send("POST", "/v1/executions", runRequest("lint"));
    if (body.diagnostics == null) {
      setStatus(`Lint did not run. ${describeResult(body)}`, "done", body.status);
      return;
    }
    const found = body.diagnostics.map((d) => editorDiagnostic(editor.state, d));
    editor.dispatch(setDiagnostics(editor.state, found));
    const words = found.length === 1 ? "1 problem" : `${found.length} problems`;
    setStatus(found.length ? `Lint: ${words}, marked in the editor.` : "Lint: no problems found.", "done", "lint");
  } catch (error) {
    handleError(error);
    setStatus("Lint did not run.", "idle");
  } finally {
    setBusy(false);
  }
}

// --- wiring --------------------------------------------------------------------------------------

$("key-form").addEventListener("submit", saveKey);
$("key-forget").addEventListener("click", forgetKey);
$("change-key").addEventListener("click", () => askForKey());
$("language").addEventListener("change", (event) => selectLanguage(event.target.value));
$("example").addEventListener("click", () => setCode(exampleFor(state.language)));
$("run").addEventListener("click", run);
$("cancel").addEventListener("click", cancel);
$("lint").addEventListener("click", lint);
document.addEventListener("keydown", (event) => {
  // Ctrl/Cmd+Enter runs from anywhere on the page (the editor handles it itself).
  if (event.key === "Enter" && (event.ctrlKey || event.metaKey) && !event.defaultPrevented) {
    event.preventDefault();
    run();
  }
});

if (localStorage.getItem(KEY_STORAGE)) connect();
else {
  setStatus("Enter your API key to start.", "idle");
  askForKey();
}
