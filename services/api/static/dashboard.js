// Vigil dashboard: follows the page's topics over /events (EventSource) and swaps in row
// fragments rendered (and escaped) by the server. Text from events is only ever set with
// textContent. Controls call the JSON api with fetch(); the session cookie signs them and the
// X-Vigil-Request header marks them as the dashboard's own (see services/api/session.py).
"use strict";

(function () {
  const page = JSON.parse(document.getElementById("vigil-page").textContent || "{}");
  const HEADERS = { "Content-Type": "application/json", "X-Vigil-Request": "dashboard" };
  const FEED_MAX = 100;
  const LOG_MAX = 1000;
  const ROWS_MAX = 200; // rows one refresh asks for (the api's page of rows)
  const PROBLEMS = new Set(["failed", "crashed", "hung"]); // job outcomes listed as errors
  const ENDED = new Set(["succeeded", "failed", "cancelled"]); // job outcomes that end it
  const RESTING = new Set(["completed", "failed", "cancelled", "terminated",
    "failed_to_setup", "failed_on_cluster", "failed_to_post_process",
    "failed_setup_prerequisites", "failed_post_processing_prerequisites"]);

  // ----- small helpers ------------------------------------------------------------------

  function el(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  let flashTimer = null;
  function flash(text, kind) {
    const box = document.getElementById("flash");
    if (!box) return;
    box.textContent = text;
    box.dataset.kind = kind || "info";
    clearTimeout(flashTimer);
    flashTimer = setTimeout(() => { box.textContent = ""; delete box.dataset.kind; }, 10000);
  }

  function describe(data, status) {
    if (data && typeof data.detail === "string") return data.detail;
    if (data && Array.isArray(data.detail)) return data.detail.map((d) => d.msg).join("; ");
    return "request failed (HTTP " + status + ")";
  }

  async function api(method, path, body) {
    const response = await fetch(path, {
      method: method,
      headers: HEADERS,
      credentials: "same-origin",
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    let data = null;
    try { data = await response.json(); } catch (e) { data = null; }
    if (!response.ok) {
      const error = new Error(describe(data, response.status));
      error.status = response.status;
      error.detail = data && data.detail;
      throw error;
    }
    return data;
  }

  // An HTML fragment rendered by the server (already escaped there); null when gone.
  async function fragment(path) {
    const response = await fetch(path, { credentials: "same-origin" });
    if (response.status === 404) return null;
    if (!response.ok) throw new Error("HTTP " + response.status + " for " + path);
    return response.text();
  }

  function parseRow(html) {
    const template = document.createElement("template");
    template.innerHTML = html.trim();
    return template.content.firstElementChild;
  }

  function byData(name, value) {
    return document.querySelector("[" + name + '="' + CSS.escape(value) + '"]');
  }

  const timers = new Map();
  function later(key, fn, ms) {
    if (timers.has(key)) return;
    timers.set(key, setTimeout(() => {
      timers.delete(key);
      fn().catch((e) => console.warn(key, e));
    }, ms));
  }

  // ----- the live stream ----------------------------------------------------------------

  function setLive(state) {
    const badge = document.getElementById("live");
    if (!badge) return;
    badge.dataset.state = state;
    badge.textContent = { on: "● live", retry: "◌ reconnecting", off: "○ offline" }[state];
  }

  let source = null;
  function follow(topics, onEvent, onOpen) {
    if (source) source.close();
    source = null;
    if (!topics || !topics.length) return;
    const query = topics.map((t) => "topic=" + encodeURIComponent(t)).join("&");
    source = new EventSource("/events?" + query);
    source.onopen = () => { setLive("on"); if (onOpen) onOpen(); };
    // A dropped stream reconnects by itself with Last-Event-ID: the api replays what it missed.
    // One the api refused (410: older than the history keeps) starts afresh a little later;
    // onOpen then reads the page's rows again.
    const opened = source;
    source.onerror = () => {
      const closed = opened.readyState === EventSource.CLOSED;
      setLive(closed ? "off" : "retry");
      if (closed) setTimeout(() => { if (source === opened) follow(topics, onEvent, onOpen); }, 5000);
    };
    source.onmessage = (message) => {
      let event;
      try { event = JSON.parse(message.data); } catch (e) { return; }
      addToFeed(event);
      onEvent(event);
    };
  }

  function summary(event) {
    const body = event.body || {};
    if (event.routing_key.startsWith("log.")) return body.line;
    if (body.type === "task_event") return body.state + (body.error_brief ? ": " + body.error_brief : "");
    if (body.type === "job_event") return body.outcome + (body.brief ? ": " + body.brief : "");
    if (body.type === "task_decision") return body.verdict + ": " + body.reason;
    return "";
  }

  // A busy system sends hundreds of events a second: they are drawn in batches (the newest
  // FEED_MAX of each), never one DOM change per event.
  let feedQueue = [];
  function addToFeed(event) {
    if (!document.getElementById("feed")) return;
    feedQueue.push([new Date().toLocaleTimeString(), event]);
    if (feedQueue.length > FEED_MAX) feedQueue = feedQueue.slice(-FEED_MAX);
    later("feed", drawFeed, 250);
  }

  async function drawFeed() {
    const feed = document.getElementById("feed");
    const batch = feedQueue;
    feedQueue = [];
    const items = document.createDocumentFragment();
    for (const [time, event] of batch.reverse()) {
      const item = el("li", "feed-item");
      item.dataset.key = event.routing_key;
      item.append(el("span", "ts", time), " ",
        el("span", "mono key", event.routing_key), " ", el("span", "what", summary(event)));
      items.append(item);
    }
    feed.prepend(items);
    while (feed.childElementCount > FEED_MAX) feed.lastElementChild.remove();
  }

  // ----- forms that call the api ------------------------------------------------------------

  // A form names the api call (`data-method`, `data-path`) and what follows a success
  // (`data-then`: "job" opens the job made, "reload", or a message). Each field's `name` is its
  // path in the body (`policy.limits.memory_mb`) and `data-kind` how its text is read: text,
  // int, float, bool (a checkbox), lines (one value a line), csv, json. Empty fields are left
  // out (the api's default, or no change in an edit). A 422 puts each message next to its field.
  function readField(input) {
    const kind = input.dataset.kind || "text";
    if (kind === "bool") return input.checked ? true : undefined;
    if (kind === "multi") {
      const chosen = Array.from(input.selectedOptions).map((option) => option.value);
      return chosen.length ? chosen : undefined;
    }
    const text = input.value;
    if (!text.trim()) return undefined;
    if (kind === "int" || kind === "float") return Number(text);
    if (kind === "lines") {
      const lines = text.split(/\r?\n/).filter((line) => line.trim() !== "");
      if (!input.form.elements.inputs_json || !input.form.elements.inputs_json.checked) return lines;
      return lines.map((line) => { try { return JSON.parse(line); } catch (e) { return line; } });
    }
    if (kind === "csv") return text.split(",").map((v) => v.trim()).filter((v) => v);
    if (kind === "time") return new Date(text).toISOString(); // the browser's local time, in UTC
    if (kind === "json") {
      try { return JSON.parse(text); } catch (e) { throw new FieldError(input.name, "not valid JSON: " + e.message); }
    }
    return text;
  }

  function FieldError(name, message) { this.name = name; this.message = message; }

  function formBody(form) {
    const body = {};
    for (const input of Array.from(form.querySelectorAll("[name]"))) {
      if (input.dataset.kind === "skip" || input.type === "file") continue;
      const value = readField(input);
      if (value === undefined) continue;
      const path = input.name.split(".");
      let at = body;
      path.slice(0, -1).forEach((key) => { at[key] = at[key] || {}; at = at[key]; });
      at[path[path.length - 1]] = value;
    }
    return body;
  }

  function clearErrors(form) {
    form.querySelectorAll(".field-error").forEach((node) => node.remove());
    const summary = form.querySelector(".form-errors");
    if (summary) { summary.textContent = ""; summary.hidden = true; }
  }

  function showErrors(form, problems) {
    const summary = form.querySelector(".form-errors");
    for (const problem of problems) {
      const path = problem.loc.filter((part) => part !== "body").join(".");
      // the field itself, else the nearest named parent (policy.limits.x -> policy.limits)
      let input = null;
      for (let parts = path.split("."); parts.length && !input; parts = parts.slice(0, -1)) {
        input = form.querySelector('[name="' + CSS.escape(parts.join(".")) + '"]');
      }
      const note = el("small", "field-error", (input ? "" : path + ": ") + problem.msg);
      if (input) input.closest("label, .field, p").append(note);
      else if (summary) { summary.append(note); summary.hidden = false; }
    }
  }

  async function submitForm(form) {
    clearErrors(form);
    let body;
    try {
      body = formBody(form);
    } catch (e) {
      if (!(e instanceof FieldError)) throw e;
      showErrors(form, [{ loc: ["body"].concat(e.name.split(".")), msg: e.message }]);
      return null;
    }
    if (form.dataset.before && !window.confirm(form.dataset.before)) return null;
    try {
      const result = await api(form.dataset.method, form.dataset.path, body);
      const then = form.dataset.then || "";
      if (then === "job") window.location.assign("/ui/jobs/" + encodeURIComponent(result.id));
      else if (then === "token") showIssued(result);
      else if (then === "reload") window.location.reload();
      else flash(then || "done", "ok");
      return result;
    } catch (e) {
      if (e.status === 422 && Array.isArray(e.detail)) showErrors(form, e.detail);
      else showErrors(form, [{ loc: [], msg: e.message }]);
      flash(e.message, "error");
      return null;
    }
  }

  // Global fixes: the form asks for a dry run; its answer says what would change, and only
  // then can the same body be applied (any change to the form asks for a new preview).
  let previewed = null;
  function showFix(result, dryRun) {
    const box = document.getElementById("fix-result");
    box.hidden = false;
    box.replaceChildren();
    const verb = dryRun ? "would" : "did";
    box.append(el("h2", null, dryRun ? "Preview" : "Applied"),
      el("p", "fix-summary", result.matched + " tasks of " + result.jobs + " jobs matched; " +
        result.action.replace(/_/g, " ") + " " + verb + " change " + result.applied +
        ", " + result.refused + " refused"));
    const reasons = Object.entries(result.refusals || {});
    if (reasons.length) {
      const list = el("ul", "refusals");
      reasons.forEach(([why, n]) => list.append(el("li", null, n + " refused: " + why)));
      box.append(list);
    }
    if (result.sample && result.sample.length) {
      const table = el("table", "grid sample");
      const head = el("tr");
      ["job", "#", "task", "state", "class", "host"].forEach((h) => head.append(el("th", null, h)));
      table.append(head);
      result.sample.forEach((t) => {
        const row = el("tr");
        [t.job_id, t.index, t.id, t.state, t.failure_class || "", t.host || ""].forEach((v) => row.append(el("td", null, v)));
        table.append(row);
      });
      box.append(el("p", null, "The first " + result.sample.length + " of them:"), table);
    }
  }

  async function previewFix(form) {
    clearErrors(form);
    const apply = document.getElementById("fix-apply");
    apply.hidden = true;
    previewed = null;
    let body;
    try { body = formBody(form); } catch (e) { showErrors(form, [{ loc: [], msg: e.message }]); return; }
    try {
      const result = await api("POST", "/bulk/actions", Object.assign({}, body, { dry_run: true }));
      showFix(result, true);
      if (result.applied > 0) {
        previewed = body;
        apply.textContent = "Apply to " + result.applied + " tasks";
        apply.hidden = false;
      }
    } catch (e) {
      if (e.status === 422 && Array.isArray(e.detail)) showErrors(form, e.detail);
      else showErrors(form, [{ loc: [], msg: e.message }]);
    }
  }

  async function applyFix() {
    if (!previewed) return;
    const body = previewed;
    if (!window.confirm("Apply " + body.action.replace(/_/g, " ") + " to the tasks the preview showed?")) return;
    document.getElementById("fix-apply").hidden = true;
    previewed = null;
    try {
      const result = await api("POST", "/bulk/actions", Object.assign({}, body, { dry_run: false, confirm: true }));
      showFix(result, false);
      flash("fix applied: " + result.applied + " tasks changed", "ok");
    } catch (e) {
      flash("fix refused: " + e.message, "error");
    }
  }

  document.addEventListener("input", (event) => {
    if (!event.target.closest || !event.target.closest("#fix-form")) return;
    const apply = document.getElementById("fix-apply");
    if (apply) apply.hidden = true;
    previewed = null;
  });

  // Users and tokens (operators): a token is shown once, in the page, never in a dialog.
  function showIssued(result) {
    const box = document.getElementById("issued");
    document.getElementById("issued-for").textContent = result.details.user;
    document.getElementById("issued-token").textContent = result.token;
    box.hidden = false;
    flash("token " + result.details.id + " made for " + result.details.user, "ok");
  }

  async function adminAction(target) {
    const action = target.dataset.adminAction;
    try {
      if (action === "token") {
        const label = window.prompt("What is the new token of " + target.dataset.user + " for?");
        if (label === null) return;
        showIssued(await api("POST", "/admin/users/" + encodeURIComponent(target.dataset.user) + "/tokens",
          label.trim() ? { label: label.trim() } : {}));
        return;
      }
      if (action === "revoke") {
        if (!window.confirm("Revoke token " + target.dataset.token + "? It stops working at once.")) return;
        await api("DELETE", "/admin/tokens/" + encodeURIComponent(target.dataset.token));
      } else if (action === "disable") {
        if (!window.confirm("Disable " + target.dataset.user + "? None of their tokens will work.")) return;
        await api("POST", "/admin/users/" + encodeURIComponent(target.dataset.user) + "/disable");
      }
      window.location.reload();
    } catch (e) {
      flash(action + " refused: " + e.message, "error");
    }
  }

  // A file of inputs fills the inputs box (read here; nothing is uploaded but the lines).
  document.addEventListener("change", (event) => {
    const input = event.target;
    if (input.type !== "file" || !input.dataset.into) return;
    const file = input.files && input.files[0];
    if (!file) return;
    file.text().then((text) => { input.form.elements[input.dataset.into].value = text; });
  });

  // ----- charts -------------------------------------------------------------------------

  // Drawn by the server from per-minute counts the scheduler writes every 5 s: fetched again
  // a little after events come, and once more after the last of a burst.
  const CHARTS_AFTER_MS = 6000;
  let chartsHeard = 0;
  function chartsChanged() {
    if (!document.getElementById("charts")) return;
    chartsHeard = Date.now();
    later("charts", refreshCharts, CHARTS_AFTER_MS);
  }

  async function refreshCharts() {
    const path = page.page === "job" ? "/ui/jobs/" + encodeURIComponent(page.job_id) + "/charts" : "/ui/charts";
    const html = await fragment(path);
    const current = document.getElementById("charts");
    if (html !== null && current) current.replaceWith(parseRow(html));
    if (Date.now() - chartsHeard < CHARTS_AFTER_MS) later("charts", refreshCharts, CHARTS_AFTER_MS);
  }

  // ----- jobs list ----------------------------------------------------------------------

  function jobsTopics() {
    if (page.operator) return page.topics;
    const ids = Array.from(document.querySelectorAll("#jobs tbody tr[data-job-id]"))
      .map((row) => row.dataset.jobId).slice(0, 20);
    return ids.map((id) => "task.*." + id);
  }

  async function refreshJobRow(jobId) {
    const html = await fragment("/ui/jobs/" + encodeURIComponent(jobId) + "/row");
    const row = byData("data-job-id", jobId);
    if (html === null) return false;
    const fresh = parseRow(html);
    if (row) {
      row.replaceWith(fresh);
      return false;
    }
    if (!page.live_new) return false;
    document.querySelector("#jobs tbody").prepend(fresh);
    const empty = document.getElementById("no-jobs");
    if (empty) empty.hidden = true;
    return true;
  }

  function onJobsEvent(event) {
    const jobId = event.body && event.body.job_id;
    if (!jobId) return;
    chartsChanged();
    if (byData("data-job-id", jobId) || page.live_new) {
      later("job:" + jobId, () => refreshJobRow(jobId), 300);
    }
  }

  function refreshUnsettledJobs() {
    document.querySelectorAll("#jobs tbody tr[data-job-id]").forEach((row) => {
      if (!RESTING.has(row.dataset.state)) {
        later("job:" + row.dataset.jobId, () => refreshJobRow(row.dataset.jobId), 50);
      }
    });
  }

  // A user may not follow every job (only their own, by id): new ones are looked for here.
  async function lookForNewJobs() {
    const data = await api("GET", "/jobs?limit=10");
    let added = false;
    for (const job of data.items.reverse()) {
      if (!byData("data-job-id", job.id)) added = (await refreshJobRow(job.id)) || added;
    }
    if (added) follow(jobsTopics(), onJobsEvent, refreshUnsettledJobs);
  }

  // `M:SS`, `H:MM:SS` or `D-HH:MM:SS`, as the server's `duration` filter writes them.
  function duration(seconds) {
    const s = Math.floor(seconds);
    const two = (n) => String(n).padStart(2, "0");
    const [d, h, m, sec] = [Math.floor(s / 86400), Math.floor((s % 86400) / 3600),
      Math.floor((s % 3600) / 60), s % 60];
    if (d) return d + "-" + two(h) + ":" + two(m) + ":" + two(sec);
    return h ? h + ":" + two(m) + ":" + two(sec) : m + ":" + two(sec);
  }

  // An unfinished job's elapsed time counts on between refreshes of its row: from the
  // server's figure, by the browser's monotonic clock (no skew between the two clocks).
  function tickElapsed() {
    const now = performance.now();
    document.querySelectorAll("#jobs td.elapsed[data-ticking]").forEach((cell) => {
      if (!cell.dataset.seenAt) cell.dataset.seenAt = String(now);
      const seconds = Number(cell.dataset.elapsed) + (now - Number(cell.dataset.seenAt)) / 1000;
      cell.textContent = duration(seconds);
    });
  }

  function startJobs() {
    follow(jobsTopics(), onJobsEvent, refreshUnsettledJobs);
    setInterval(tickElapsed, 1000);
    if (!page.operator && page.live_new) {
      const poll = () => lookForNewJobs().then(() => { if (!source) setLive("on"); }, (e) => {
        if (!source) setLive("retry");
        console.warn(e);
      });
      poll();
      setInterval(poll, 5000);
    }
  }

  // ----- one job ------------------------------------------------------------------------

  const seenLogs = new Set();
  function logKey(taskId, attempt, ts, line) {
    return taskId + "|" + attempt + "|" + Date.parse(ts) + "|" + line;
  }

  // A line at the end of #logs (once: a line seen live and caught up is shown once), the
  // box kept scrolled to the bottom if it was; false when it was already there.
  function addLogLine(record, showTask) {
    const box = document.getElementById("logs");
    if (!box) return false;
    const key = logKey(record.task_id, record.attempt, record.ts, record.line);
    if (seenLogs.has(key)) return false;
    seenLogs.add(key);
    const atBottom = box.scrollTop + box.clientHeight >= box.scrollHeight - 4;
    const line = el("div", "log sev-" + record.severity);
    if (record.seq !== undefined && record.seq !== null) line.dataset.seq = record.seq;
    line.append(el("span", "ts", new Date(record.ts).toISOString().replace("T", " ").slice(0, 19)), " ");
    if (showTask) line.append(el("span", "mono", record.task_id), " ");
    line.append(el("span", "sev", record.severity), " ", el("span", "line", record.line));
    if (!showTask && !matches(record.line)) line.classList.add("hidden");
    box.append(line);
    while (box.childElementCount > LOG_MAX) box.firstElementChild.remove();
    if (atBottom) box.scrollTop = box.scrollHeight;
    return true;
  }

  let logQueue = [];
  function queueLog(record) {
    logQueue.push(record);
    if (logQueue.length > LOG_MAX) logQueue = logQueue.slice(-LOG_MAX);
    later("logs-draw", drawLogs, 100);
  }

  async function drawLogs() {
    const batch = logQueue;
    logQueue = [];
    const onTaskPage = page.page === "task";
    let added = false;
    for (const record of batch) added = addLogLine(record, !onTaskPage) || added;
    if (added && onTaskPage) {
      const empty = document.getElementById("no-logs");
      if (empty) empty.hidden = true;
      applySearch();
    }
  }

  // The newest lines as stored, in order: what the log shows once the stream (re)opens and
  // once the job or task ends, so that a line the stream missed (it was closed for a while,
  // or the broker dropped the oldest of a flood) is never missing for good. Only the answer
  // to the latest reload is shown: on a busy server an earlier one (asked when the stream
  // opened, before the lines were stored) can come back after it, and would empty the log.
  let logReloads = 0;
  async function reloadLogTail() {
    const asked = ++logReloads;
    let path = "/jobs/" + encodeURIComponent(page.job_id) + "/logs?tail=" + LOG_MAX;
    if (page.page === "task") path += "&task=" + encodeURIComponent(page.task_id) + "&run=" + page.run;
    const data = await api("GET", path);
    if (asked !== logReloads) return; // a later reload's answer is the newer
    const box = document.getElementById("logs");
    if (!box) return;
    const atBottom = box.scrollTop + box.clientHeight >= box.scrollHeight - 4;
    box.replaceChildren();
    seenLogs.clear();
    data.items.forEach((record) => addLogLine(record, page.page !== "task"));
    if (atBottom) box.scrollTop = box.scrollHeight;
    if (page.page === "task") {
      const empty = document.getElementById("no-logs");
      if (empty) empty.hidden = data.items.length > 0;
      applySearch();
    }
  }

  // Tasks whose rows changed: refreshed together, at most every 500 ms, in one request for
  // at most a page of rows (those shown, and new ones when the page takes them).
  const dirtyTasks = new Set();
  function markTask(taskId, ms) {
    if (!byData("data-task-id", taskId) && !page.append_new_tasks) return;
    dirtyTasks.add(taskId);
    later("rows", refreshTaskRows, ms === undefined ? 500 : ms);
  }

  // The first row of a higher index than `fresh`'s (null: none, the end): a resubmitted
  // clone keeps its original's index and goes after the rows of that index.
  function rowAfterIndex(body, fresh) {
    const index = Number(fresh.dataset.index);
    return Array.from(body.querySelectorAll("tr[data-task-id]"))
      .find((row) => Number(row.dataset.index) > index) || null;
  }

  async function refreshTaskRows() {
    const ids = Array.from(dirtyTasks).slice(0, ROWS_MAX);
    ids.forEach((id) => dirtyTasks.delete(id));
    if (!ids.length) return;
    const query = ids.map((id) => "task=" + encodeURIComponent(id)).join("&");
    const html = await fragment("/ui/jobs/" + encodeURIComponent(page.job_id) + "/rows?" + query);
    if (dirtyTasks.size) later("rows", refreshTaskRows, 500);
    if (html === null) return;
    const template = document.createElement("template");
    template.innerHTML = html; // rendered and escaped by the server
    const body = document.querySelector("#tasks tbody");
    for (const fresh of Array.from(template.content.querySelectorAll("tr[data-task-id]"))) {
      const row = byData("data-task-id", fresh.dataset.taskId);
      if (row) row.replaceWith(fresh);
      else if (page.append_new_tasks) body.insertBefore(fresh, rowAfterIndex(body, fresh));
    }
  }

  async function refreshSummary() {
    const html = await fragment("/ui/jobs/" + encodeURIComponent(page.job_id) + "/summary");
    const current = document.getElementById("job-summary");
    if (html !== null && current) current.replaceWith(parseRow(html));
  }

  function addJobError(event) {
    const list = document.getElementById("job-errors");
    const body = event.body || {};
    if (!list) return;
    const item = el("li", "live-error");
    item.append(el("span", "ts", new Date().toLocaleTimeString()), " ",
      el("span", "mono", event.routing_key), " ", el("span", "what", summary(event)));
    list.prepend(item);
    const empty = document.getElementById("no-errors");
    if (empty) empty.hidden = true;
    if (body.task_id) markTask(body.task_id);
  }

  function onJobEvent(event) {
    const key = event.routing_key;
    const body = event.body || {};
    if (key.startsWith("log.")) {
      queueLog(body);
      if (body.progress !== null && body.progress !== undefined) markTask(body.task_id);
      return;
    }
    if (key.startsWith("job.") && PROBLEMS.has(body.outcome)) addJobError(event);
    if (key.startsWith("job.") && ENDED.has(body.outcome)) later("logs", reloadLogTail, 500);
    // Activated: the page's configuring forms are gone, its tasks are new.
    if (key.startsWith("job.") && body.outcome === "activated" && document.getElementById("configure")) {
      later("reload", async () => window.location.reload(), 300);
    }
    if (body.task_id) markTask(body.task_id);
    later("summary", refreshSummary, 400);
    chartsChanged();
  }

  function refreshAfterOpen() {
    later("summary", refreshSummary, 50);
    later("logs", reloadLogTail, 50);
    document.querySelectorAll("#tasks tbody tr[data-task-id]").forEach((row) => {
      if (!RESTING.has(row.dataset.state)) markTask(row.dataset.taskId, 50);
    });
  }

  function startJob() {
    follow(page.topics, onJobEvent, refreshAfterOpen);
  }

  // ----- one task -----------------------------------------------------------------------

  // Lines not matching the search box are hidden (not removed: clearing it shows them again).
  function matches(line) {
    const box = document.getElementById("log-search");
    const wanted = box ? box.value.trim().toLowerCase() : "";
    return !wanted || line.toLowerCase().includes(wanted);
  }

  function applySearch() {
    const lines = document.querySelectorAll("#logs .log");
    let shown = 0;
    lines.forEach((node) => {
      const text = node.querySelector(".line");
      const hit = matches(text ? text.textContent : "");
      node.classList.toggle("hidden", !hit);
      if (hit) shown += 1;
    });
    const count = document.getElementById("log-matches");
    const box = document.getElementById("log-search");
    if (count) count.textContent = box && box.value.trim() ? shown + " of " + lines.length + " lines" : "";
  }

  async function refreshTaskHead() {
    const html = await fragment("/ui/tasks/" + encodeURIComponent(page.task_id) + "/head");
    const current = document.getElementById("task-head");
    if (html !== null && current) current.replaceWith(parseRow(html));
  }

  function onTaskEvent(event) {
    const body = event.body || {};
    if (body.task_id !== page.task_id) return;
    if (event.routing_key.startsWith("log.")) {
      if (page.live_log && body.run_number === page.run) queueLog(body);
      if (body.progress !== null && body.progress !== undefined) later("head", refreshTaskHead, 500);
      return;
    }
    later("head", refreshTaskHead, 250);
    if (page.live_log && RESTING.has(body.state)) later("logs", reloadLogTail, 500);
  }

  function startTask() {
    const search = document.getElementById("log-search");
    if (search) search.addEventListener("input", applySearch);
    follow(page.topics, onTaskEvent, () => {
      later("head", refreshTaskHead, 50);
      if (page.live_log) later("logs", reloadLogTail, 50);
    });
  }

  // ----- hosts --------------------------------------------------------------------------

  // Hosts have no events (heartbeats are not published): the tables are fetched again instead.
  async function refreshTable(path, tableId, emptyId) {
    const html = await fragment(path);
    const body = document.querySelector("#" + tableId + " tbody");
    if (html === null || !body) return;
    body.innerHTML = html; // rendered and escaped by the server
    const empty = document.getElementById(emptyId);
    if (empty) empty.hidden = body.childElementCount > 0;
  }

  async function refreshHosts() {
    await Promise.all([
      refreshTable("/ui/hosts/rows", "hosts", "no-hosts"),
      refreshTable("/ui/hosts/pilots", "pilots", "no-pilots"),
    ]);
  }

  function startHosts() {
    const tick = () => refreshHosts().then(() => setLive("on"), (e) => {
      setLive("retry");
      console.warn(e);
    });
    tick();
    setInterval(tick, 3000);
  }

  // ----- controls -----------------------------------------------------------------------

  async function jobAction(jobId, action, extra) {
    if (action === "cancel" && !window.confirm("Cancel job " + jobId + "? Its running tasks are killed.")) return;
    if (action === "purge" && !window.confirm("Purge job " + jobId + "? Its logs, kept outputs and work dirs are deleted for good.")) return;
    try {
      const job = await api("POST", "/jobs/" + encodeURIComponent(jobId) + "/actions",
        Object.assign({ action: action }, extra || {}));
      flash("job " + jobId + ": " + action.replace("_", " ") + " accepted, now " + job.state, "ok");
    } catch (e) {
      flash("job " + jobId + ": " + action.replace("_", " ") + " refused: " + e.message, "error");
      return;
    }
    if (page.page === "job") later("summary", refreshSummary, 10);
    else later("job:" + jobId, () => refreshJobRow(jobId), 10);
  }

  async function hostAction(hostId, action) {
    const body = { action: action };
    if (action === "quarantine") {
      const reason = window.prompt("Quarantine " + hostId + ": why? (it takes no new task until released)");
      if (reason === null) return;
      body.reason = reason.trim();
    }
    if (action === "drain" && !window.confirm("Drain " + hostId + "? It finishes what it runs and takes no new task.")) return;
    try {
      await api("POST", "/hosts/" + encodeURIComponent(hostId) + "/actions", body);
      flash("host " + hostId + ": " + action + " accepted", "ok");
    } catch (e) {
      flash("host " + hostId + ": " + action + " refused: " + e.message, "error");
      return;
    }
    await refreshHosts();
    await showQuarantine();
  }

  async function taskAction(taskId, action) {
    if (action === "cancel" && !window.confirm("Cancel this task?")) return;
    try {
      const result = await api("POST", "/tasks/" + encodeURIComponent(taskId) + "/actions", { action: action });
      flash("task " + taskId + ": " + action.replace(/_/g, " ") + " accepted, now " + result.task.state, "ok");
      if (result.created && page.page === "job") markTask(result.created.id, 10);
    } catch (e) {
      flash("task " + taskId + ": " + action.replace(/_/g, " ") + " refused: " + e.message, "error");
    }
    if (page.page === "task") later("head", refreshTaskHead, 10);
    else markTask(taskId, 10);
  }

  async function emergencyStop() {
    const reason = window.prompt("Emergency stop: every job is suspended and all running work is killed.\nReason:");
    if (reason === null) return;
    if (!reason.trim()) { flash("an emergency stop needs a reason", "error"); return; }
    try {
      await api("POST", "/admin/emergency-stop", { reason: reason.trim() });
      flash("emergency stop in force: " + reason.trim(), "ok");
    } catch (e) {
      flash("emergency stop refused: " + e.message, "error");
    }
    await showEmergency();
  }

  async function emergencyResume() {
    try {
      await api("POST", "/admin/resume");
      flash("emergency stop lifted", "ok");
    } catch (e) {
      flash("resume refused: " + e.message, "error");
    }
    await showEmergency();
  }

  async function showEmergency() {
    if (!page.operator) return;
    let status;
    try { status = await api("GET", "/admin/emergency-stop"); } catch (e) { return; }
    let banner = document.getElementById("emergency-banner");
    if (!status.in_force) { if (banner) banner.remove(); return; }
    if (!banner) {
      banner = el("div", "banner");
      banner.id = "emergency-banner";
      document.querySelector("main").prepend(banner);
    }
    const latest = status.latest || {};
    banner.replaceChildren(el("b", "", "Emergency stop in force"),
      " ", el("span", "reason", latest.reason || ""), " ");
    const resume = el("button", "act", "Resume");
    resume.type = "button";
    resume.id = "emergency-resume";
    banner.append(resume);
  }

  // Every page: a banner while hosts are quarantined (their breaker shut or probing, or an
  // operator's), refreshed every 5 s, gone once every host takes work again.
  async function showQuarantine() {
    let hosts;
    try { hosts = await api("GET", "/hosts"); } catch (e) { return; }
    const out = hosts.filter((h) => h.quarantined);
    let banner = document.getElementById("quarantine-banner");
    if (!out.length) { if (banner) banner.remove(); return; }
    if (!banner) {
      banner = el("div", "banner");
      banner.id = "quarantine-banner";
      document.querySelector("main").prepend(banner);
    }
    const parts = out.map((h) => {
      const what = h.probing_since ? "probing, one task at a time"
        : (h.breaker ? "shut until " : "quarantined until ") + (h.quarantined_until || "released");
      return el("span", "host", h.id + ": " + what + (h.quarantine_reason ? " (" + h.quarantine_reason + ")" : ""));
    });
    const all = out.length === hosts.filter((h) => h.worker).length;
    banner.replaceChildren(
      el("b", "", all ? "Every host is quarantined" : out.length + " host(s) quarantined"), " ");
    parts.forEach((p, i) => banner.append(i ? "; " : "", p));
  }

  document.addEventListener("click", (event) => {
    const target = event.target.closest("button");
    if (!target) return;
    if (target.dataset.jobAction) {
      jobAction(target.dataset.job, target.dataset.jobAction);
    } else if (target.dataset.hostAction) {
      hostAction(target.dataset.host, target.dataset.hostAction);
    } else if (target.hasAttribute("data-task-apply")) {
      const select = target.closest("tr, p").querySelector("select.task-action");
      if (select) taskAction(target.dataset.task, select.value);
    } else if (target.dataset.adminAction) {
      adminAction(target);
    } else if (target.id === "fix-apply") {
      applyFix();
    } else if (target.id === "emergency-stop") {
      emergencyStop();
    } else if (target.id === "emergency-resume") {
      emergencyResume();
    }
  });

  document.addEventListener("submit", (event) => {
    if (event.target.dataset.path) {
      event.preventDefault();
      if (event.target.id === "fix-form") previewFix(event.target);
      else submitForm(event.target);
      return;
    }
    if (event.target.id !== "throttle") return;
    event.preventDefault();
    const form = event.target;
    jobAction(page.job_id, "throttle", {
      max_in_flight: Number(form.elements.max_in_flight.value),
      release_per_tick: Number(form.elements.release_per_tick.value),
    });
  });

  if (page.page === "jobs") startJobs();
  else if (page.page === "job") startJob();
  else if (page.page === "task") startTask();
  else if (page.page === "hosts") startHosts();
  showEmergency();
  showQuarantine();
  setInterval(showQuarantine, 5000);
})();
