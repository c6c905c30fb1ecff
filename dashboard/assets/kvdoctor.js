/* kvdoctor dashboard: the clientside chart router of the Live page (pages/live.py).
 * The server makes every figure and extendData payload (figures.py); this only hands them to the
 * graphs, in the browser, so no rebuild can be overtaken and dropped by the next update. */
window.dash_clientside = Object.assign({}, window.dash_clientside, {
  kvdoctor: {
    /* Interval tick -> a fetch, unless the charts have not yet taken the last one's points:
     * routeCharts writes the tick it applied. Waiting for the fetch's own answer is not enough:
     * if the next fetch starts before routeCharts has run, Dash holds routeCharts back until that
     * fetch answers and then runs it once, with the newer points only (a full frame lost, the
     * charts left empty). (Read as State: an Input would close a loop fetch -> routed -> gate ->
     * tick -> fetch, which Dash refuses.) A lost answer stops blocking after GATE_TIMEOUT_MS. */
    gateTick: function (nIntervals, tick, routed, gate) {
      const skip = window.dash_clientside.no_update;
      const GATE_TIMEOUT_MS = 30000;
      const now = Date.now();
      const current = tick || 0;
      const answered = routed === current;
      const since = (gate && gate.since) || 0;
      if (!answered) {
        if (!since) return [skip, {since: now}];  // the page's first fetch: start its clock
        if (now - since < GATE_TIMEOUT_MS) return [skip, skip];
      }
      return [current + 1, {since: now}];
    },
    /* LIVE_DATA -> [figure, extendData] per graph, then the tick applied (LIVE_ROUTED). */
    routeCharts: function (data) {
      const skip = window.dash_clientside.no_update;
      const n = (data && data.order) ? data.order.length : 4;
      const out = [];
      for (let i = 0; i < n; i++) {
        if (!data || !data.order || data.mode === "none") { out.push(skip, skip); continue; }
        const chart = data.order[i];
        if (data.mode === "full") {
          out.push(data.figures[chart] || skip, skip);
        } else {
          const ext = data.extend ? data.extend[chart] : null;
          out.push(skip, ext || skip);
        }
      }
      out.push(data ? data.tick : skip);
      return out;
    },
  },
});
