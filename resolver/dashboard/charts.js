// The dashboard's charts: the registry's history (GET /api/history) drawn as SVG line charts,
// built element by element (no markup from the network, nothing inline for the CSP to refuse).
// A chart ends at the registry's "now" and goes back to its oldest sample (at least a minute, at
// most the history's length); a gap of more than two intervals between samples breaks its lines.
'use strict';

const SVG_NS = 'http://www.w3.org/2000/svg';
const CHART_W = 600, CHART_H = 140, SPARK_H = 70;
const PAD = {left: 46, right: 8, top: 10, bottom: 20};

function svg(tag, attrs) {
  const e = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
  return e;
}

// A history series as capnp-json writes it, with numbers for its 64-bit fields.
function normSeries(raw) {
  const s = raw || {};
  const samples = (Array.isArray(s.samples) ? s.samples : []).map((x) => {
    const v = x || {};
    return {at: Number(v.atMillis || 0), calls: Number(v.calls || 0),
            errors: Number(v.errors || 0), p50: Number(v.p50 || 0), p99: Number(v.p99 || 0),
            byCode: (Array.isArray(v.byCode) ? v.byCode : []).map((c) => ({
              code: String((c || {}).code || ''), perSecond: Number((c || {}).perSecond || 0)}))};
  });
  return {name: String(s.name || ''), samples};
}

function normHistory(raw) {
  const h = raw || {};
  return {interval: Number(h.intervalMillis || 0), length: Number(h.lengthMillis || 0),
          now: Number(h.nowMillis || 0), refused: Number(h.refused || 0),
          jobs: (h.jobs || []).map(normSeries), endpoints: (h.endpoints || []).map(normSeries)};
}

// The lines of a traffic chart: calls/s, errors/s, and errors/s of each code seen.
function trafficLines(series) {
  const codes = new Set();
  for (const s of series.samples) for (const c of s.byCode) codes.add(c.code);
  const lines = [{label: 'calls/s', cls: 'calls', value: (s) => s.calls},
                 {label: 'errors/s', cls: 'errors', value: (s) => s.errors}];
  let i = 0;
  for (const code of Array.from(codes).sort()) {
    lines.push({label: code + '/s', cls: 'code code-' + (i++ % 4), value: (s) => {
      const c = s.byCode.find((x) => x.code === code);
      return c ? c.perSecond : 0;
    }});
  }
  return lines;
}

// Latency in ms; intervals without a finished call have none.
function latencyLines() {
  return [{label: 'p50 ms', cls: 'p50', value: (s) => (s.calls > 0 ? s.p50 * 1000 : null)},
          {label: 'p99 ms', cls: 'p99', value: (s) => (s.calls > 0 ? s.p99 * 1000 : null)}];
}

const niceNumber = (v) => (v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v >= 1 ? v.toFixed(2)
                                                                               : v.toPrecision(2));

// A figure: a title, a legend with each line's latest value, and the chart. `history` gives the
// time axis; `series` the samples; `lines` what to draw of them; `h` the chart's height, in the
// units of its 600-wide box.
function drawChart(title, history, series, lines, h = CHART_H) {
  const figure = el('figure', undefined, 'chart');
  figure.dataset.chart = title;
  figure.dataset.points = String(series.samples.length);
  const caption = el('figcaption');
  caption.append(el('span', title, 'chart-title'));
  const last = series.samples[series.samples.length - 1];
  for (const line of lines) {
    const v = last ? line.value(last) : null;
    const item = el('span', line.label + ' ' + (v === null || v === undefined ? '–' : niceNumber(v)),
                    'legend ' + line.cls);
    caption.append(item);
  }
  figure.append(caption);

  const chart = svg('svg', {viewBox: `0 0 ${CHART_W} ${h}`, role: 'img',
                            'aria-label': title});
  const end = history.now || Date.now();
  const first = series.samples.length ? series.samples[0].at : end;
  const start = Math.max(end - (history.length || 15 * 60 * 1000), Math.min(first, end - 60000));
  let max = 0;
  for (const s of series.samples) {
    for (const line of lines) max = Math.max(max, line.value(s) || 0);
  }
  const top = max > 0 ? max * 1.1 : 1;
  const x = (t) => PAD.left + ((t - start) / (end - start)) * (CHART_W - PAD.left - PAD.right);
  const y = (v) => h - PAD.bottom - (v / top) * (h - PAD.top - PAD.bottom);

  chart.append(svg('line', {x1: PAD.left, x2: CHART_W - PAD.right, y1: y(0), y2: y(0),
                            class: 'axis'}));
  chart.append(svg('line', {x1: PAD.left, x2: CHART_W - PAD.right, y1: y(top), y2: y(top),
                            class: 'grid'}));
  const label = (text, attrs) => {
    const t = svg('text', attrs);
    t.textContent = text;
    chart.append(t);
  };
  label(niceNumber(top), {x: PAD.left - 4, y: y(top) + 4, class: 'tick end'});
  label('0', {x: PAD.left - 4, y: y(0) + 4, class: 'tick end'});
  const span = (end - start) / 1000;
  label('−' + (span >= 120 ? Math.round(span / 60) + ' min' : Math.round(span) + ' s'),
        {x: PAD.left, y: h - 4, class: 'tick'});
  label('now', {x: CHART_W - PAD.right, y: h - 4, class: 'tick end'});

  const gap = 2 * (history.interval || 5000);
  for (const line of lines) {
    let d = '';
    let prev = null;
    for (const s of series.samples) {
      const v = line.value(s);
      if (v === null || v === undefined || s.at < start) {
        prev = null;
        continue;
      }
      const cmd = prev !== null && s.at - prev <= gap ? 'L' : 'M';
      d += `${cmd}${x(s.at).toFixed(1)},${y(v).toFixed(1)} `;
      prev = s.at;
    }
    if (d) chart.append(svg('path', {d: d.trim(), class: 'line ' + line.cls}));
  }
  if (series.samples.length === 0) {
    label('no samples yet', {x: CHART_W / 2, y: h / 2, class: 'tick middle'});
  }
  figure.append(chart);
  return figure;
}

// A small chart for a job on the overview: its calls/s and errors/s.
function drawSparkline(history, series) {
  return drawChart('traffic', history, series, trafficLines(series).slice(0, 2), SPARK_H);
}
