/* governor dashboard: DOM and SVG helpers (hand-drawn charts; every value is set as text). */
"use strict";
window.governorDashboard = (function () {
  const SVG = "http://www.w3.org/2000/svg";

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") node.className = v; else node.setAttribute(k, v);
    }
    for (const c of children) {
      if (c === null || c === undefined) continue;
      node.append(c instanceof Node ? c : String(c));
    }
    return node;
  }

  function svg(tag, attrs) {
    const node = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    return node;
  }

  function duration(s) {
    if (s === null || s === undefined) return "never";
    if (s <= 0) return "0s";
    if (s < 10 && s !== Math.round(s)) return s.toPrecision(3).replace(/\.?0+$/, "") + "s";
    let t = Math.round(s); const out = [];
    for (const [u, n] of [["d", 86400], ["h", 3600], ["m", 60], ["s", 1]]) {
      const c = Math.floor(t / n); t -= c * n; if (c) out.push(c + u);
    }
    return out.join(" ");
  }

  function clock(t) { return new Date(t * 1000).toLocaleTimeString(); }

  function banner(text) {
    const b = document.getElementById("banner");
    if (text) { b.textContent = text; b.hidden = false; } else { b.hidden = true; b.textContent = ""; }
  }

  function bar(used, limit) {
    const ratio = limit > 0 ? Math.min(1, used / limit) : 0;
    const cls = used >= limit ? "full" : ratio >= 0.8 ? "high" : "ok";
    const fill = el("span", { class: "fill " + cls });
    fill.style.width = (ratio * 100).toFixed(1) + "%";
    return el("span", { class: "bar", title: used + " of " + limit }, fill);
  }

  /* starts per second (points [[t, rate]]) against the limit per second, over `span` seconds */
  function chart(points, limit, w, h, span, axes) {
    const root = svg("svg", { viewBox: `0 0 ${w} ${h}`, class: "chart", width: w, height: h,
                              role: "img", "aria-label": "starts per second" });
    const now = points.length ? points[points.length - 1][0] : Date.now() / 1000;
    // the span of what was sampled so far (at least 30 s), up to `span`
    span = Math.min(span, Math.max(30, points.length ? now - points[0][0] : 0));
    const top = Math.max(limit || 0, ...points.map((p) => p[1]), 1e-9) * 1.15;
    const pad = axes ? 34 : 2;
    const x = (t) => pad + (w - pad - 2) * (1 - (now - t) / span);
    const y = (v) => h - 14 - (h - 20) * (v / top);
    root.append(svg("rect", { x: pad, y: 2, width: w - pad - 2, height: h - 16, class: "plot" }));
    if (limit) {
      root.append(svg("line", { x1: pad, x2: w - 2, y1: y(limit), y2: y(limit), class: "limit" }));
      const t = svg("text", { x: w - 4, y: y(limit) - 3, class: "limit-text", "text-anchor": "end" });
      t.textContent = "limit " + (+limit.toFixed(3)) + "/s";
      root.append(t);
    }
    const shown = points.filter((p) => now - p[0] <= span);
    if (shown.length > 1) {
      const d = shown.map((p, i) => (i ? "L" : "M") + x(p[0]).toFixed(1) + " " + y(p[1]).toFixed(1));
      root.append(svg("path", { d: d.join(" "), class: "series" }));
    }
    if (axes) {
      for (const v of [0, top / 1.15 / 2, top / 1.15]) {
        const t = svg("text", { x: pad - 4, y: y(v) + 4, class: "axis", "text-anchor": "end" });
        t.textContent = +v.toFixed(2); root.append(t);
      }
      const t = svg("text", { x: pad, y: h - 2, class: "axis" });
      t.textContent = "-" + duration(span); root.append(t);
      const n = svg("text", { x: w - 2, y: h - 2, class: "axis", "text-anchor": "end" });
      n.textContent = "now"; root.append(n);
    }
    return root;
  }

  return { el: el, svg: svg, duration: duration, clock: clock, banner: banner, bar: bar, chart: chart };
})();
