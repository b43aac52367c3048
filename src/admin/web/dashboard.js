// sluice - dashboard.js: the admin console's page, refreshed from /api/stats.
// Every value from the server (route names, keys: client bytes) goes into
// the page with textContent or as a number attribute, never as markup.
"use strict";
(function () {
  var REFRESH_MS = 2000, SVG = "http://www.w3.org/2000/svg", KINDS = ["allowed", "limited", "delayed"];

  function $(id) { return document.getElementById(id); }
  function text(id, v) { $(id).textContent = v; }
  function el(tag, cls, txt) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (txt !== undefined) e.textContent = txt;
    return e;
  }
  function fmtTime(unix) {
    if (!unix) return "-";
    return new Date(unix * 1000).toLocaleString();
  }
  function fmtDur(s) {
    if (s < 120) return s + " s";
    if (s < 7200) return Math.floor(s / 60) + " min";
    return Math.floor(s / 3600) + " h";
  }
  function ms(v) { return v === null || v === undefined ? "-" : v.toFixed(2) + " ms"; }

  // Stacked bars: one per bucket, allowed at the bottom.
  function chart(svg, series, n) {
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    var w = 600, h = 120, max = 1;
    svg.setAttribute("viewBox", "0 0 " + w + " " + h);
    svg.setAttribute("preserveAspectRatio", "none");
    for (var i = 0; i < n; i++) {
      var t = 0;
      KINDS.forEach(function (k) { t += (series[k] || [])[i] || 0; });
      if (t > max) max = t;
    }
    var bw = w / n;
    for (var j = 0; j < n; j++) {
      var y = h;
      KINDS.forEach(function (k) {
        var v = (series[k] || [])[j] || 0;
        if (!v) return;
        var bh = v / max * (h - 4);
        var r = document.createElementNS(SVG, "rect");
        r.setAttribute("class", "bar " + k);
        r.setAttribute("x", (j * bw + 0.5).toFixed(1));
        r.setAttribute("width", Math.max(bw - 1, 1).toFixed(1));
        r.setAttribute("y", (y - bh).toFixed(1));
        r.setAttribute("height", bh.toFixed(1));
        var tip = document.createElementNS(SVG, "title");
        tip.textContent = k + ": " + v;
        r.appendChild(tip);
        svg.appendChild(r);
        y -= bh;
      });
    }
  }

  function routeCard(box, r, n) {
    var card = null;
    for (var c = box.firstChild; c; c = c.nextSibling)
      if (c.routeName === r.route) card = c;
    if (!card) {
      card = el("div", "card route");
      card.routeName = r.route;
      card.setAttribute("data-route", r.route);
      card.appendChild(el("h3", "route-name", r.route));
      card.appendChild(document.createElementNS(SVG, "svg"));
      var counts = el("div", "counts");
      KINDS.forEach(function (k) {
        var s = el("span", k);
        s.appendChild(document.createTextNode(k + " "));
        s.appendChild(el("b", "n-" + k, "0"));
        counts.appendChild(s);
      });
      var tot = el("span", "muted");
      tot.appendChild(document.createTextNode("all time "));
      tot.appendChild(el("b", "n-total", "0"));
      counts.appendChild(tot);
      card.appendChild(counts);
      box.appendChild(card);
    }
    chart(card.querySelector("svg"), r.series, n);
    KINDS.forEach(function (k) {
      card.querySelector(".n-" + k).textContent = String(r.window[k] || 0);
    });
    card.querySelector(".n-total").textContent = String(r.total.requests || 0);
  }

  function render(s) {
    text("status", "updated " + new Date().toLocaleTimeString());
    var st = $("redis-state");
    st.textContent = s.redis.state;
    st.className = "big " + (s.redis.state === "down" ? "bad" : "good");
    text("lat-p50", ms(s.redis.latency_ms.p50));
    text("lat-p99", ms(s.redis.latency_ms.p99));
    text("redis-detail", s.redis.backend === "redis"
      ? s.redis.connected + " of " + s.workers + " workers connected, " + s.redis.errors_total + " errors"
      : "decisions in process");
    text("deny-window", String(s.deny_cache.hits_window));
    text("deny-total", String(s.deny_cache.hits_total));
    text("workers", String(s.workers));
    text("uptime", fmtDur(s.uptime_s));
    text("conn-client", String(s.connections.client));
    text("conn-upstream", String(s.connections.upstream));
    var rr = $("reload-result");
    rr.textContent = s.config.last_reload.ok ? "loaded" : "reload failed";
    rr.className = "big " + (s.config.last_reload.ok ? "good" : "bad");
    text("config-loaded", fmtTime(s.config.loaded_at));
    text("config-load-ms", ms(s.config.load_ms));
    text("reload-error", s.config.last_reload.error
      ? "at " + fmtTime(s.config.last_reload.at) + ": " + s.config.last_reload.error : "");

    var box = $("routes");
    s.routes.forEach(function (r) { routeCard(box, r, s.buckets); });

    var body = $("top-body");
    while (body.firstChild) body.removeChild(body.firstChild);
    if (!s.top.length) {
      var tr0 = el("tr");
      var td0 = el("td", "muted", "no key limited lately");
      td0.colSpan = 4;
      tr0.appendChild(td0);
      body.appendChild(tr0);
    }
    s.top.forEach(function (t) {
      var tr = el("tr");
      tr.appendChild(el("td", "route", t.route));
      tr.appendChild(el("td", "limit", t.limit));
      tr.appendChild(el("td", "key", t.key.join(" | ") + (t.truncated ? " \u2026" : "")));
      tr.appendChild(el("td", "num count", String(t.count)));
      body.appendChild(tr);
    });
  }

  // The plan view: GET /api/plans?key=K (the token is needed: it shows a
  // client's key), refreshed with the stats while a key is shown.
  var planKey = null;
  function authHeaders() {
    var token = sessionStorage.getItem("sluice-token"), headers = {};
    if (token) headers.Authorization = "Bearer " + token;
    return headers;
  }
  function fmtMs(v) { return v < 1000 ? v + " ms" : fmtDur(Math.ceil(v / 1000)); }
  function renderPlan(p) {
    text("plan-status", "");
    var st = $("plan-status");
    st.appendChild(document.createTextNode("client "));
    st.appendChild(el("b", "plan-client", p.key));
    st.appendChild(document.createTextNode(" is on plan "));
    st.appendChild(el("b", "plan-name", p.plan));
    st.appendChild(document.createTextNode(" (" + p.source + ")"));
    var body = $("plan-body");
    while (body.firstChild) body.removeChild(body.firstChild);
    p.limits.forEach(function (l) {
      var tr = el("tr"), s = l.state;
      tr.appendChild(el("td", "limit", l.limit));
      tr.appendChild(el("td", "algorithm", l.algorithm));
      tr.appendChild(el("td", "num used", s ? String(s.used) : "-"));
      tr.appendChild(el("td", "num of", s ? String(s.limit) : "-"));
      tr.appendChild(el("td", "num remaining", s ? String(s.remaining) : "-"));
      tr.appendChild(el("td", "num resets", s ? fmtMs(s.allowed ? s.reset_ms : s.retry_ms) : "not read"));
      body.appendChild(tr);
    });
    $("plan-wrap").hidden = false;
  }
  function lookPlan() {
    if (planKey === null) return Promise.resolve();
    return fetch("/api/plans?key=" + encodeURIComponent(planKey), { cache: "no-store", headers: authHeaders() })
      .then(function (r) {
        return r.json().then(function (j) {
          if (r.status === 401) throw new Error("open this page as /#token=TOKEN");
          if (!r.ok) throw new Error(j && j.error ? j.error : "HTTP " + r.status);
          return j;
        });
      })
      .then(renderPlan)
      .catch(function (e) { $("plan-wrap").hidden = true; text("plan-status", "cannot read the plan: " + e.message); });
  }
  $("plan-form").addEventListener("submit", function (ev) {
    ev.preventDefault();
    planKey = $("plan-key").value || null;
    lookPlan();
  });

  // admin.token, when set, is given once as the page's fragment
  // (/#token=TOKEN: never sent to a server, not in any log), kept for the
  // tab's session and sent as a Bearer token with each read. #plan=KEY
  // (after it: #token=TOKEN&plan=KEY) opens a client's plan.
  if (location.hash.length > 1) {
    location.hash.slice(1).split("&").forEach(function (kv) {
      var i = kv.indexOf("="), k = kv.slice(0, i), v = decodeURIComponent(kv.slice(i + 1));
      if (i > 0 && k === "token" && v) sessionStorage.setItem("sluice-token", v);
      if (i > 0 && k === "plan" && v) { planKey = v; $("plan-key").value = v; }
    });
    history.replaceState(null, "", location.pathname);
  }
  function refresh() {
    fetch("/api/stats", { cache: "no-store", headers: authHeaders() })
      .then(function (r) {
        if (r.status === 401) throw new Error("admin.token is set: open this page as /#token=TOKEN");
        if (!r.ok) throw new Error("HTTP " + r.status);
        return r.json();
      })
      .then(render)
      .catch(function (e) { text("status", "cannot read /api/stats: " + e.message); })
      .then(lookPlan)
      .then(function () { setTimeout(refresh, REFRESH_MS); });
  }
  refresh();
})();
