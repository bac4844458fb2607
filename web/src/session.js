// The session switch: runs share one sandbox (and, in Python, JavaScript and TypeScript, its
// variables) until it ends.
import { clock } from "./words.js";

const ENDINGS = {
  IdleTimeout: "it was idle for too long",
  LifetimeExceeded: "it reached its maximum lifetime",
  Deleted: "it was ended",
  SandboxLost: "its sandbox was lost",
};

export class Session {
  constructor(api, { info, endButton, toggle, onChange, onError }) {
    Object.assign(this, { api, info, endButton, toggle, onChange, onError });
    this.current = null;
    this.timer = null;
    this.refreshing = false;
    this.refreshedAt = 0;
    toggle.addEventListener("change", () => (toggle.checked ? this.start() : this.end()));
    endButton.addEventListener("click", () => this.end());
  }

  get path() {
    return `/v1/sessions/${encodeURIComponent(this.current.id)}`;
  }

  /** Where runs go while a session is open, else null. */
  executionsPath() {
    return this.current ? `${this.path}/executions` : null;
  }

  setLanguage(name) {
    this.language = name;
    this.toggle.disabled = !name;
  }

  setBusy(busy) {
    this.toggle.disabled = busy;
    this.endButton.disabled = busy;
  }

  async start() {
    this.toggle.disabled = true;
    this.info.textContent = "Starting a session…";
    try {
      const { body } = await this.api.send("POST", "/v1/sessions", { language: this.language });
      this.current = body;
      this.endButton.hidden = false;
      this.onChange(true);
      this.timer = setInterval(() => this.render(), 1000);
      this.render();
    } catch (error) {
      this.toggle.checked = false;
      this.info.textContent = "";
      this.onError(error);
    } finally {
      this.toggle.disabled = false;
    }
  }

  async end() {
    if (!this.current) return;
    const path = this.path;
    const id = this.current.id;
    this.closed(`Session ${id} ended.`);
    try {
      await this.api.send("DELETE", path);
    } catch (error) {
      if (error.status !== 404) this.onError(error);
    }
  }

  /** Reads the session again (after a run, or when its countdown ran out). */
  async refresh() {
    if (!this.current || this.refreshing) return;
    this.refreshing = true;
    this.refreshedAt = Date.now();
    try {
      this.update(await this.api.get(this.path));
    } catch (error) {
      if (error.status === 404) this.closed("The session is gone.");
      else this.onError(error);
    } finally {
      this.refreshing = false;
    }
  }

  update(session) {
    if (!this.current) return;
    this.current = session;
    if (session.status === "ended") {
      const why = ENDINGS[session.reason];
      this.closed(`Session ${session.id} ended${why ? `: ${why}` : ""}.`);
    } else {
      this.render();
    }
  }

  render() {
    const session = this.current;
    if (!session) return;
    const expires = Date.parse(session.expires_at);
    const left = Number.isNaN(expires) ? null : (expires - Date.now()) / 1000;
    const runs = session.execution_count ?? 0;
    const parts = [`Session ${session.id}`, session.status, `${runs} run${runs === 1 ? "" : "s"}`];
    if (left !== null) parts.push(left > 0 ? `ends in ${clock(left)} if idle` : "ending…");
    this.info.textContent = parts.filter(Boolean).join(" · ");
    // A starting session has no deadline yet; one past its deadline is ending: ask again.
    const stale = Date.now() - this.refreshedAt > 2000;
    if (stale && (session.status === "starting" || (left !== null && left <= 0))) this.refresh();
  }

  closed(text) {
    clearInterval(this.timer);
    this.current = null;
    this.toggle.checked = false;
    this.endButton.hidden = true;
    this.info.textContent = text;
    this.onChange(false);
  }
}
