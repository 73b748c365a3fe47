/* governor dashboard: polls the JSON API and draws it; every value is set as text (never HTML). */
"use strict";
(function () {
  const body = document.body;
  const page = body.dataset.page;
  const interval = Number(body.dataset.interval) || 1000;
  const writes = body.dataset.writes === "yes";
  const { el, duration, clock, banner, bar, chart } = window.governorDashboard;

  function stateParts(s) {
    const parts = [];
    if (s.blocked) {
      const what = s.paused ? "PAUSED by upstream " : "BLOCKED ";
      parts.push([s.paused ? "blocked paused" : "blocked", what + duration(s.blocked_for) + (s.block_reason ? ": " + s.block_reason : "")]);
    } else if (s.rules.length) {
      const wait = Math.max(...s.rules.map((r) => r.next_free_in || 0));
      parts.push(wait > 0 ? ["full", "full: next in " + duration(wait)] : ["ok", "ok"]);
    }
    if (s.concurrency) {
      const c = s.concurrency;
      parts.push([c.running >= c.limit ? "full" : "ok", c.running + "/" + c.limit + " running"]);
      if (c.waiting) parts.push(["wait", c.waiting + " waiting for a slot"]);
    }
    if (s.fair_waiting) {
      const tenants = Object.entries(s.fair_waiting).sort((a, b) => b[1] - a[1]);
      const total = tenants.reduce((n, t) => n + t[1], 0);
      if (total) {
        const top = tenants.slice(0, 3).map(([t, n]) => (t || "-") + ": " + n).join(", ");
        parts.push(["wait", total + " waiting fairly (" + top + (tenants.length > 3 ? ", +" + (tenants.length - 3) + " tenants" : "") + ")"]);
      }
    }
    if (s.booked_for > 0) parts.push(["booked", "booked up to " + duration(s.booked_for) + " ahead"]);
    else if (s.booked) parts.push(["booked", s.booked + " booked"]);
    return parts;
  }

  function stateCell(s) {
    return el("td", { class: "state" }, ...stateParts(s).map(([cls, text]) => el("span", { class: "tag " + cls }, text)));
  }

  function inspectHref(name, subject) {
    return "inspect?" + new URLSearchParams({ name: name, subject: subject }).toString();
  }

  function limitHref(label) {
    return "limit?" + new URLSearchParams({ label: label }).toString();
  }

  /* what makes a limit's rules what they are now: set live (by whom, replacing what), adaptive */
  function ruleMarks(lim) {
    const marks = [];
    if (lim.live) {
      marks.push(el("span", { class: "tag live", title: "set with `governor limits set`; workers use it in place of the configuration" },
        "live" + (lim.live.by ? " · set by " + lim.live.by : "") + (lim.live.at ? " at " + clock(lim.live.at) : "") +
        (lim.live.configured ? " · configured: " + lim.live.configured : "")));
    }
    if (lim.adaptive_factor !== null && lim.adaptive_factor !== undefined) {
      marks.push(el("span", { class: "tag " + (lim.adaptive_factor < 1 ? "wait" : "ok") }, "adaptive: " + Math.round(lim.adaptive_factor * 100) + "% of its rules"));
    }
    return marks;
  }

  /* one subject's rows: a row per rule (and its cap), the first with the subject's link */
  function subjectRows(lim, s) {
    const rows = [];
    const link = el("a", { href: inspectHref(lim.name, s.subject), class: "subject" }, s.subject);
    const extra = s.concurrency ? [{ rule: "at once", used: s.concurrency.running, limit: s.concurrency.limit }] : [];
    const all = s.rules.concat(extra);
    (all.length ? all : [null]).forEach((r, i) => {
      rows.push(el("tr", { "data-subject": s.subject },
        el("td", {}, i === 0 ? link : ""),
        el("td", { class: "rule" }, r ? (r.meter ? r.meter + " " + r.rule : r.rule) : ""),
        el("td", {}, r ? bar(r.used, r.limit) : ""),
        el("td", { class: "num used" }, r ? r.used_text || r.used + "/" + r.limit : ""),
        i === 0 ? el("td", { class: "num rate" }, s.rate === null ? "-" : s.rate.toFixed(2) + "/s") : el("td"),
        i === 0 ? el("td", { class: "spark" }, s.rate_limit !== null ? chart(s.history, s.rate_limit, 160, 36, 60, false) : "") : el("td"),
        i === 0 ? stateCell(s) : el("td")));
    });
    return rows;
  }

  /* a session that ended (401 with a token set): to the login page, back here after */
  function loginAgain(response) {
    if (response.status !== 401 || !body.dataset.login) return;
    const next = location.pathname + location.search;
    location.assign(body.dataset.login + "?" + new URLSearchParams({ next: next }).toString());
  }

  async function getJSON(url) {
    let response;
    try { response = await fetch(url, { headers: { Accept: "application/json" } }); }
    catch (e) { throw new Error("the dashboard server does not answer (" + e.message + ")"); }
    loginAgain(response);
    let data = null;
    try { data = await response.json(); } catch (e) { data = null; }
    if (!response.ok) {
      const err = new Error((data && data.error) || ("HTTP " + response.status));
      err.status = response.status; throw err;
    }
    return data;
  }

  /* run `step` now and every `interval`; a call while one runs makes one more run after it,
     so an older answer (a search being typed) never lands after a newer one */
  function loop(step) {
    let timer = null, running = false, again = false;
    const run = async () => {
      clearTimeout(timer);
      if (running) { again = true; return; }
      running = true;
      try { await step(); } catch (e) { banner(e.message); }
      running = false;
      if (again) { again = false; run(); return; }
      timer = setTimeout(run, interval);
    };
    run();
    return run;
  }

  function updated(data) {
    const u = document.getElementById("updated");
    u.textContent = "updated " + clock(data.time) + (data.calls ? " · " + data.calls + " Redis calls" : "");
    u.classList.toggle("stale", !!data.error);
  }

  /* -- the overview ------------------------------------------------------------------ */

  function overviewPage() {
    const q = document.getElementById("q");
    const blockedOnly = document.getElementById("blocked-only");
    const params = new URLSearchParams(location.search);
    q.value = params.get("q") || "";
    blockedOnly.checked = params.get("blocked") === "1";
    let pageNo = Number(params.get("page")) || 1;
    let pages = 1;

    function render(data) {
      updated(data);
      banner(data.error ? "Redis is unreachable: " + data.error + (data.limits.length ? " (showing what was read at " + clock(data.time) + ")" : "") : "");
      pages = data.pages; pageNo = data.page;
      document.getElementById("page-info").textContent = "page " + data.page + " of " + data.pages;
      document.getElementById("prev").disabled = data.page <= 1;
      document.getElementById("next").disabled = data.page >= data.pages;
      const sum = data.summary;
      const parked = data.parked.total ? " · " + data.parked.total + " parked" + (data.parked.next_due ? ", next due in " + duration(data.parked.next_due - data.time) : "") : "";
      document.getElementById("summary").textContent =
        data.matched + " of " + sum.limits + " limits · " + sum.subjects + " subjects · " + sum.blocked + " blocked · " + sum.paused + " paused · " + sum.full + " full" + parked;
      const box = document.getElementById("limits");
      const cards = data.limits.map(limitCard);
      if (!cards.length) cards.push(el("p", { class: "empty" }, data.error ? "nothing read yet" : "no limit matches"));
      box.replaceChildren(...cards);
    }

    function limitCard(lim) {
      const head = el("div", { class: "limit-head" },
        el("a", { class: "label", href: limitHref(lim.label) }, lim.label),
        el("span", { class: "rules-text" }, lim.rules_text || "rules unknown" + (lim.kind === "found" ? " (found in Redis; -A APP adds rules)" : "")),
        lim.algorithm ? el("span", { class: "algo" }, lim.algorithm) : null,
        lim.kind === "key" ? el("span", { class: "algo" }, "per key" + (lim.tasks.length && lim.tasks[0] !== lim.name ? "; tasks " + lim.tasks.join(", ") : "")) : null,
        ...ruleMarks(lim),
        lim.parked ? el("span", { class: "tag wait" }, lim.parked + " parked") : null);
      const rows = lim.subjects.flatMap((s) => subjectRows(lim, s));
      const table = el("table", { class: "subjects" },
        el("thead", {}, el("tr", {}, ...["subject", "rule", "usage", "used", "rate", "recent", "state"].map((h) => el("th", {}, h)))),
        el("tbody", {}, ...rows));
      const more = lim.matching_subjects > lim.subjects.length
        ? el("p", { class: "more" }, "… " + (lim.matching_subjects - lim.subjects.length) + " more subjects: ", el("a", { href: limitHref(lim.label) }, "all of " + lim.label))
        : null;
      const capped = lim.subject_count_capped ? el("p", { class: "more" }, "more subjects exist than the dashboard examines per refresh") : null;
      const meters = (lim.meter_lines || []).map((line) => el("p", { class: "more meters" }, line));
      return el("section", { class: "limit", "data-label": lim.label }, head, ...meters,
        lim.subjects.length ? table : el("p", { class: "empty" }, "nothing counted in Redis"), more, capped);
    }

    const refresh = loop(async () => {
      const p = new URLSearchParams();
      if (q.value) p.set("q", q.value);
      if (blockedOnly.checked) p.set("blocked", "1");
      if (pageNo > 1) p.set("page", String(pageNo));
      history.replaceState(null, "", p.toString() ? "?" + p.toString() : location.pathname);
      render(await getJSON("api/limits?" + p.toString()));
    });
    q.addEventListener("input", () => { pageNo = 1; refresh(); });
    blockedOnly.addEventListener("change", () => { pageNo = 1; refresh(); });
    document.getElementById("prev").addEventListener("click", () => { if (pageNo > 1) { pageNo--; refresh(); } });
    document.getElementById("next").addEventListener("click", () => { if (pageNo < pages) { pageNo++; refresh(); } });
  }

  /* -- one subject ------------------------------------------------------------------- */

  function inspectPage() {
    const name = body.dataset.name, subject = body.dataset.subject;
    const url = "api/inspect?" + new URLSearchParams({ name: name, subject: subject }).toString();

    function render(s) {
      updated(s); banner("");
      document.getElementById("rules-text").replaceChildren(s.rules_text || "rules unknown", " ", ...ruleMarks(s));
      document.getElementById("rules").replaceChildren(...s.rules.map((r) => el("tr", {},
        el("td", {}, r.meter ? r.meter + " " + r.rule : r.rule), el("td", {}, bar(r.used, r.limit)), el("td", { class: "num" }, r.used_text || r.used),
        el("td", { class: "num" }, r.limit), el("td", { class: "num" }, r.remaining),
        el("td", { class: "num" }, duration(r.next_free_in)), el("td", { class: "num" }, duration(r.fully_free_in)))));
      const box = document.getElementById("chart");
      if (s.rate_limit !== null) {
        document.getElementById("chart-note").textContent = "(units counted by its shortest rule per second of that rule's window; now " + s.rate.toFixed(2) + "/s)";
        box.replaceChildren(chart(s.history, s.rate_limit, 720, 200, 300, true));
      } else {
        box.replaceChildren(el("p", { class: "empty" }, "rules unknown: start the dashboard with -A APP to chart this limit"));
      }
      const d = [];
      const add = (k, ...v) => { d.push(el("dt", {}, k)); d.push(el("dd", {}, ...v)); };
      add("admits one more now", el("span", { class: "tag " + (s.admits_now ? "ok" : "full"), id: "admits" }, s.admits_now ? "yes" : "no"));
      add("block", s.blocked ? el("span", { class: "tag blocked", id: "block-state" }, (s.paused ? "paused by upstream for " : "blocked for ") + duration(s.blocked_for) + " (until " + clock(s.now + s.blocked_for) + "): " + (s.block_reason || "(no reason given)")) : el("span", { id: "block-state" }, "none"));
      add("bookings", s.booked_for > 0 ? "held up to " + duration(s.booked_for) + " ahead (the last starts at " + clock(s.now + s.booked_for) + ")" : (s.booked === null ? "unknown" : s.booked + " held"));
      if (s.concurrency) {
        const c = s.concurrency;
        add("running", c.running + " of " + c.limit + " at once; " + c.waiting + " waiting",
          el("ul", {}, ...c.holders.map((h) => el("li", {}, h.holder + " · " + (h.handed_over ? "handed over, not started" : "running") + " since " + clock(h.since) + " · lease ends in " + duration(h.lease_ends_in) + (h.info ? " · " + h.info : "")))));
      }
      if (s.fair_waiting) {
        const t = Object.entries(s.fair_waiting).sort((a, b) => b[1] - a[1]);
        add("waiting fairly", t.length ? el("ul", {}, ...t.map(([k, n]) => el("li", {}, (k || "-") + ": " + n))) : "nobody");
      }
      document.getElementById("details").replaceChildren(...d);
    }

    const refresh = loop(async () => {
      try { render(await getJSON(url)); }
      catch (e) {
        if (e.status === 404) { banner(e.message); return; }
        throw new Error(e.status === 503 ? "Redis is unreachable: " + e.message : e.message);
      }
    });

    if (writes) {
      const result = document.getElementById("write-result");
      async function post(action, payload, question) {
        if (!window.confirm(question)) { result.textContent = "cancelled"; return; }
        try {
          const r = await fetch("api/" + action, { method: "POST", headers: { "Content-Type": "application/json" },
                                                   body: JSON.stringify({ name: name, subject: subject, ...payload }) });
          loginAgain(r);
          const data = await r.json();
          result.textContent = r.ok ? action + ": done" : action + " failed: " + data.error;
        } catch (e) { result.textContent = action + " failed: " + e.message; }
        refresh();
      }
      document.getElementById("block").addEventListener("click", () => {
        const dur = document.getElementById("duration").value, reason = document.getElementById("reason").value;
        post("block", { duration: dur, reason: reason }, "Block " + subject + " of " + name + " for " + dur + "? Every call for it is denied until then.");
      });
      document.getElementById("unblock").addEventListener("click", () => post("unblock", {}, "Lift the block of " + subject + " of " + name + "?"));
      document.getElementById("reset").addEventListener("click", () => post("reset", {}, "Forget everything counted for " + subject + " of " + name + " (a block stays)?"));
    }
  }

  Object.assign(window.governorDashboard, { getJSON, loop, updated, subjectRows, ruleMarks });
  if (page === "overview") overviewPage();
  else if (page === "inspect") inspectPage();
  else if (page !== "limit") document.getElementById("updated").textContent = "";
})();
