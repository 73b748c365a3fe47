/* governor dashboard: one limit's page, every subject it has, paged (see limit_page.py). */
"use strict";
(function () {
  const body = document.body;
  if (body.dataset.page !== "limit") return;
  const { el, clock, banner, getJSON, loop, updated, subjectRows, ruleMarks } = window.governorDashboard;
  const label = body.dataset.label;
  const q = document.getElementById("q");
  const params = new URLSearchParams(location.search);
  q.value = params.get("q") || "";
  let pageNo = Number(params.get("page")) || 1;
  let pages = 1;

  function render(lim) {
    updated(lim); banner("");
    pages = lim.pages; pageNo = lim.page;
    document.getElementById("rules-text").replaceChildren(lim.rules_text || "rules unknown", " ", ...ruleMarks(lim));
    const d = [];
    const add = (k, ...v) => { d.push(el("dt", {}, k)); d.push(el("dd", {}, ...v)); };
    add("kind", lim.kind === "key" ? "per key (one state per subject)" : lim.kind === "found" ? "found in Redis (start with -A APP for its rules)" : lim.kind);
    if (lim.algorithm) add("algorithm", lim.algorithm);
    if (lim.tasks.length) add("tasks", lim.tasks.join(", "));
    if (lim.live) {
      add("set live", el("span", { id: "live-state" }, "by " + (lim.live.by || "?") + (lim.live.at ? " at " + clock(lim.live.at) : "") +
        "; the configuration says " + (lim.live.configured || "nothing") + " (governor limits reset " + lim.label + " goes back to it)"));
    }
    add("parked", lim.parked ? lim.parked + " parked tasks wait for it" : "none");
    document.getElementById("details").replaceChildren(...d);
    document.getElementById("page-info").textContent = "page " + lim.page + " of " + lim.pages;
    document.getElementById("prev").disabled = lim.page <= 1;
    document.getElementById("next").disabled = lim.page >= lim.pages;
    document.getElementById("summary").textContent = lim.matched + " of " + lim.subject_count + " subjects" +
      (lim.subject_count_capped ? " (more exist: only the first are listed)" : "") +
      " · on this page " + lim.blocked + " blocked, " + lim.paused + " paused";
    document.getElementById("subject-note").textContent = "(by name; " + lim.per + " a page)";
    const rows = lim.subjects.flatMap((s) => subjectRows(lim, s));
    if (!rows.length) rows.push(el("tr", {}, el("td", { colspan: 7, class: "empty" }, q.value ? "no subject matches" : "nothing counted in Redis")));
    document.getElementById("subjects").replaceChildren(...rows);
  }

  const refresh = loop(async () => {
    const p = new URLSearchParams({ label: label });
    if (q.value) p.set("q", q.value);
    if (pageNo > 1) p.set("page", String(pageNo));
    history.replaceState(null, "", "?" + p.toString());
    try { render(await getJSON("api/limit?" + p.toString())); }
    catch (e) { throw new Error(e.status === 503 ? "Redis is unreachable: " + e.message : e.message); }
  });
  q.addEventListener("input", () => { pageNo = 1; refresh(); });
  document.getElementById("prev").addEventListener("click", () => { if (pageNo > 1) { pageNo--; refresh(); } });
  document.getElementById("next").addEventListener("click", () => { if (pageNo < pages) { pageNo++; refresh(); } });
})();
