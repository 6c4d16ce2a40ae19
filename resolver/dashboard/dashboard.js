// The troupe registry's dashboard. It reads the registry's jobs and endpoints (GET /api/state),
// then follows every change on the server-sent event stream GET /api/events, read with fetch()
// rather than EventSource so that it can carry the cluster token (asked for when the API answers
// 401, kept in sessionStorage, sent as "Authorization: Bearer"). When the stream ends it
// reconnects after a second; the new stream resends the whole view, and what it does not resend
// before "synced" is gone. The overview (#/) lists jobs, running ones first and then ended ones,
// latest first, each with its endpoints and a chart of its traffic from the registry's history
// (GET /api/history); a job's page (#/job/<id>, job.js) has its replicas, events, logs and
// charts; an endpoint's page (#/endpoint/<name>) shows its fields and metadata, its history and,
// every 2 s, a table computed from its Prometheus metrics (GET /api/metrics?endpoint=<name>):
// calls/s, errors, in flight, p50/p99. Charts are drawn by charts.js. Everything that comes from
// the network goes into the page as text, never as HTML.
'use strict';

const TOKEN_KEY = 'troupe.clusterToken';
const RECONNECT_MS = 1000;  // after the event stream ends or fails
const GONE_MS = 2000;       // how long a removed endpoint's row stays, marked gone
const METRICS_MS = 2000;    // the metrics poll period on an endpoint's page
const SILENCE_MS = 45000;   // a stream this silent (keepalives come every 15 s) is dead
const HISTORY_MS = 5000;    // the overview's history poll period

const $ = (id) => document.getElementById(id);
const collate = new Intl.Collator('en', {numeric: true}).compare;
const clone = (id) => $(id).content.firstElementChild.cloneNode(true);

function el(tag, text, className) {
  const e = document.createElement(tag);
  if (text !== undefined) e.textContent = text;
  if (className) e.className = className;
  return e;
}

// Inserts `node` into `parent` before the first child whose data-<attr> sorts after `key`.
function insertSorted(parent, node, attr, key) {
  const next = Array.from(parent.children).find((c) => collate(c.dataset[attr], key) > 0);
  parent.insertBefore(node, next || null);
}

function showNotice(text) {
  $('notice').textContent = text;
  $('notice').hidden = !text;
}

function api(path, signal) {
  const token = sessionStorage.getItem(TOKEN_KEY);
  const headers = token ? {Authorization: 'Bearer ' + token} : {};
  return fetch(path, {headers, signal, cache: 'no-store'});
}

// ---- The model, jobs and endpoints, each entry holding its part of the overview.

const jobs = new Map();       // jobId -> {jobId, state, reason, endedAt, listed, section, ...}
const endpoints = new Map();  // name -> {ep, confirmed, gone, goneTimer, row, cells}
let synced = false;           // the current stream has sent its whole snapshot

// capnp-json leaves out fields holding their default; 64-bit integers arrive as strings.
function normEndpoint(raw) {
  const e = raw || {};
  const name = String(e.name || '');
  const metadata = (Array.isArray(e.metadata) ? e.metadata : []).map((m) => m || {});
  return {name, address: String(e.address || ''), jobId: String(e.jobId || name.split('/')[0]),
          actor: String(e.actor || ''), taskIndex: Number(e.taskIndex || 0),
          incarnation: String(e.incarnation || '0'), state: String(e.state || 'starting'),
          registeredAtMillis: Number(e.registeredAtMillis || 0),
          metadata: metadata.map((m) => ({key: String(m.key || ''), value: String(m.value || '')}))};
}

function formatAge(millis) {
  if (!millis) return '–';
  const s = Math.max(0, Math.floor((Date.now() - millis) / 1000));
  if (s < 60) return s + ' s';
  if (s < 3600) return Math.floor(s / 60) + ' min';
  return s < 86400 ? Math.floor(s / 3600) + ' h' : Math.floor(s / 86400) + ' d';
}

function jobEntry(jobId) {
  if (jobs.has(jobId)) return jobs.get(jobId);
  const section = clone('job-template');
  section.dataset.job = jobId;
  const link = section.querySelector('.job-id a');
  link.textContent = jobId;
  link.setAttribute('href', '#/job/' + encodeURIComponent(jobId));
  const job = {jobId, state: 'running', reason: '', endedAt: 0, listed: false, section,
               stateEl: section.querySelector('.job-state'),
               reasonEl: section.querySelector('.reason'),
               endedEl: section.querySelector('.ended'),
               sparkEl: section.querySelector('.spark'),
               tbody: section.querySelector('tbody'), emptyEl: section.querySelector('.empty'),
               tableEl: section.querySelector('.table-wrap')};
  jobs.set(jobId, job);
  placeJob(job);
  return job;
}

// Running jobs first, by name; then ended ones, the latest ended first.
function jobOrder(job) {
  if (job.state !== 'ended') return '0 ' + job.jobId;
  return '1 ' + String(9e15 - (job.endedAt || 0)).padStart(16, '0') + ' ' + job.jobId;
}

function placeJob(job) {
  const key = jobOrder(job);
  if (job.section.dataset.order === key && job.section.parentNode) return;
  job.section.dataset.order = key;
  const parent = $('jobs');
  const next = Array.from(parent.children).find((c) => c !== job.section &&
                                                   collate(c.dataset.order, key) > 0);
  parent.insertBefore(job.section, next || null);
}

// Shows the job's state, or drops its section when nothing keeps it: no endpoint rows, not
// ended, not listed by the last /api/state.
function settleJob(job) {
  const rows = job.tbody.children.length;
  if (rows === 0 && job.state !== 'ended' && !job.listed) {
    job.section.remove();
    jobs.delete(job.jobId);
  } else {
    const outcome = jobOutcome(job.state, job.reason);
    job.stateEl.textContent = outcome;
    job.stateEl.className = 'badge job-state job-' + outcome;
    job.reasonEl.textContent = job.reason;
    job.endedEl.textContent = job.state === 'ended' && job.endedAt ?
        'ended ' + formatTime(job.endedAt) : '';
    placeJob(job);
    job.emptyEl.hidden = rows > 0;
    job.tableEl.hidden = rows === 0;
  }
  $('no-jobs').hidden = jobs.size > 0;
}

// A JobStatus (the event stream's jobEnded), or a JobInfo (/api/state) with its times.
function setJobStatus(raw) {
  const info = raw && raw.status ? raw : {status: raw};
  const status = info.status || {};
  if (!status.jobId) return null;
  const job = jobEntry(String(status.jobId));
  job.state = String(status.state || 'running');
  job.reason = String(status.reason || '');
  const ended = Number(info.endedAtMillis || 0);
  job.endedAt = job.state !== 'ended' ? 0 : ended || job.endedAt || Date.now();
  settleJob(job);
  return job;
}

function fillRow(entry) {
  const {ep, cells} = entry;
  const state = entry.gone ? 'gone' : ep.state;
  entry.row.className = entry.gone ? 'gone' : 'state-' + state;
  cells.badge.textContent = state;
  cells.badge.className = 'badge state-' + state;
  cells.address.textContent = ep.address;
  cells.incarnation.textContent = ep.incarnation;
  cells.age.textContent = formatAge(ep.registeredAtMillis);
}

function upsertEndpoint(raw) {
  const ep = normEndpoint(raw);
  if (!ep.name) return;
  if (!endpoints.has(ep.name)) endpoints.set(ep.name, {});
  const entry = endpoints.get(ep.name);
  clearTimeout(entry.goneTimer);
  Object.assign(entry, {ep, confirmed: true, gone: false, goneTimer: 0});
  const job = jobEntry(ep.jobId);
  if (job.state === 'ended') Object.assign(job, {state: 'running', reason: '', endedAt: 0});
  if (!entry.row) {
    entry.row = clone('endpoint-template');
    entry.row.dataset.endpoint = ep.name;
    const link = entry.row.querySelector('a');
    link.textContent = ep.name;
    link.setAttribute('href', '#/endpoint/' + encodeURIComponent(ep.name));
    const cell = (selector) => entry.row.querySelector(selector);
    entry.cells = {badge: cell('.badge'), address: cell('.address'),
                   incarnation: cell('.incarnation'), age: cell('.age')};
    insertSorted(job.tbody, entry.row, 'endpoint', ep.name);
  }
  fillRow(entry);
  settleJob(job);
  if (page.name === ep.name) renderEndpointPage();
}

// Marks the row gone, then drops it after GONE_MS unless the endpoint comes back by then.
function removeEndpoint(name) {
  const entry = endpoints.get(name);
  if (!entry || entry.gone) return;
  entry.gone = true;
  fillRow(entry);
  entry.goneTimer = setTimeout(() => {
    endpoints.delete(name);
    entry.row.remove();
    const job = jobs.get(entry.ep.jobId);
    if (job) settleJob(Object.assign(job, {listed: false}));
  }, GONE_MS);
  if (page.name === name) renderEndpointPage();
}

function applyState(body) {
  for (const ep of body.endpoints || []) upsertEndpoint(ep);
  const listed = new Set((body.jobs || []).map(setJobStatus));
  for (const job of Array.from(jobs.values())) settleJob(Object.assign(job, {listed: listed.has(job)}));
}

function applyEvent(ev) {
  if (ev.added || ev.changed) return upsertEndpoint(ev.added || ev.changed);
  if (ev.removed) return removeEndpoint(normEndpoint(ev.removed).name);
  if (ev.jobEnded) return setJobStatus(ev.jobEnded);
  if (!('synced' in ev)) return;
  for (const [name, entry] of endpoints) if (!entry.confirmed) removeEndpoint(name);
  synced = true;
  setConnection('live');
  if (page.name !== null) renderEndpointPage();
}

// ---- The overview's charts: each job's traffic, from the registry's history.

let historyTimer = 0;

async function pollHistory() {
  clearTimeout(historyTimer);
  try {
    // Only while the overview shows (route() polls at once on coming back): a job's page and
    // an endpoint's read their own.
    const res = $('overview').hidden ? null : await api('/api/history');
    if (res && res.ok) {
      const history = normHistory(await res.json());
      const byJob = new Map(history.jobs.map((s) => [s.name, s]));
      for (const job of jobs.values()) {
        const series = byJob.get(job.jobId);
        job.sparkEl.replaceChildren();
        if (series && history.interval > 0) job.sparkEl.append(drawSparkline(history, series));
      }
    }
  } catch (e) {
    // The next poll tries again; the connection indicator says what is wrong.
  }
  historyTimer = setTimeout(pollHistory, HISTORY_MS);
}

// ---- The connection: /api/state, then the event stream until it ends, and again.

let cycle = 0;         // the current connection attempt; older ones stop
let controller = null; // aborts the current attempt's fetches

function setConnection(kind) {
  const text = {live: 'live', connecting: 'connecting…', disconnected: 'disconnected',
                token: 'token needed'};
  $('connection').textContent = text[kind];
  $('connection').className = 'connection ' + kind;
}

function needToken() {
  cycle++;
  if (controller) controller.abort();
  const refused = sessionStorage.getItem(TOKEN_KEY) !== null;
  sessionStorage.removeItem(TOKEN_KEY);
  $('token-error').textContent = 'The registry refused that token.';
  $('token-error').hidden = !refused;
  $('token-form').hidden = false;
  $('views').hidden = true;
  setConnection('token');
}

const TOKEN_NEEDED = new Error('token needed');  // what fetchOk() throws on 401

async function fetchOk(path, signal) {
  const res = await api(path, signal);
  if (res.status === 401) throw TOKEN_NEEDED;
  if (!res.ok) throw new Error('GET ' + path + ': ' + res.status + ' ' + (await res.text()));
  return res;
}

async function connect() {
  const gen = ++cycle;
  const mine = controller = new AbortController();
  setConnection('connecting');
  synced = false;
  try {
    const state = await (await fetchOk('/api/state', mine.signal)).json();
    if (gen !== cycle) return;
    applyState(state);
    const stream = await fetchOk('/api/events', mine.signal);
    for (const entry of endpoints.values()) entry.confirmed = false;
    showNotice('');
    await readEvents(stream, mine, (type, data) => {
      if (gen !== cycle) return;
      if (type === 'refused') return showNotice('The registry refused the event stream: ' + data);
      let event = null;
      try {
        event = JSON.parse(data);
      } catch (e) {
        return console.error('unreadable event', data);
      }
      if (type === 'message' && event) applyEvent(event);
    });
  } catch (e) {
    if (e === TOKEN_NEEDED && gen === cycle) return needToken();
    if (gen === cycle && e.name !== 'AbortError') showNotice(String(e.message || e));
  }
  if (gen !== cycle) return;
  mine.abort();
  synced = false;
  setConnection('disconnected');
  setTimeout(() => { if (gen === cycle) connect(); }, RECONNECT_MS);
}

// Reads the server-sent event framing: "field: value" lines, a blank line ends an event, lines
// starting with ':' are comments. Resolves when the stream ends.
async function readEvents(response, abort, onEvent) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = '', type = '', data = [], watchdog = 0;
  try {
    for (;;) {
      clearTimeout(watchdog);
      watchdog = setTimeout(() => abort.abort(), SILENCE_MS);
      const {value, done} = await reader.read();
      if (done) return;
      const lines = (buffer + decoder.decode(value, {stream: true})).split('\n');
      buffer = lines.pop();  // the incomplete last line
      for (const raw of lines) {
        const line = raw.endsWith('\r') ? raw.slice(0, -1) : raw;
        if (line === '') {
          if (data.length > 0) onEvent(type || 'message', data.join('\n'));
          type = '';
          data = [];
        } else if (!line.startsWith(':')) {
          const colon = line.includes(':') ? line.indexOf(':') : line.length;
          const text = line.slice(colon + 1).replace(/^ /, '');
          if (line.slice(0, colon) === 'data') data.push(text);
          if (line.slice(0, colon) === 'event') type = text;
        }
      }
    }
  } finally {
    clearTimeout(watchdog);
  }
}

// ---- The Prometheus text format (0.0.4), and the metrics table's figures.

function parseNumber(text) {
  const special = {'+Inf': Infinity, 'Inf': Infinity, '-Inf': -Infinity, 'NaN': NaN};
  if (text in special) return special[text];
  return /^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$/.test(text) ? Number(text) : undefined;
}

// `name{label="value",...} value [timestamp]`; label values may hold \\, \" and \n.
const SAMPLE = /^([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(?:\{((?:[^"}]|"(?:[^"\\]|\\.)*")*)\})?\s+(\S+)(?:\s+\S+)?$/;
const LABEL = /\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)/y;
const unescape = (v) => v.replace(/\\(.)/g, (_, c) => (c === 'n' ? '\n' : c === '\\' || c === '"' ? c : '\\' + c));

// Samples [{name, labels: Map, value}]; comments, HELP, TYPE and malformed lines are skipped.
function parseMetrics(text) {
  const samples = [];
  for (const raw of text.split('\n')) {
    const line = raw.trim();
    const m = line.startsWith('#') ? null : SAMPLE.exec(line);
    const value = m && parseNumber(m[3]);
    if (value === undefined || value === null) continue;
    const body = (m[2] || '').trim();
    const labels = new Map();
    let l = null;
    for (LABEL.lastIndex = 0; LABEL.lastIndex < body.length && (l = LABEL.exec(body));) {
      labels.set(l[1], unescape(l[2]));
    }
    if (body.length === 0 || l) samples.push({name: m[1], labels, value});
  }
  return samples;
}

// Per (actor, method): calls finished, errors among them, in flight, latency buckets (le -> n).
function summarize(samples) {
  const rows = new Map();
  for (const {name, labels, value} of samples) {
    const actor = labels.get('actor'), method = labels.get('method');
    if (!name.startsWith('troupe_call') || actor === undefined || method === undefined) continue;
    const key = actor + '\n' + method;
    if (!rows.has(key)) rows.set(key, {actor, method, calls: 0, errors: 0, inFlight: 0, buckets: new Map()});
    const row = rows.get(key);
    const code = labels.get('code');
    const le = parseNumber(labels.get('le') || '');
    if (name === 'troupe_calls_total') {
      row.calls += value;
      if (code !== 'ok' && code !== 'cancelled') row.errors += value;
    } else if (name === 'troupe_calls_in_flight') {
      row.inFlight += value;
    } else if (name === 'troupe_call_duration_seconds_bucket' && le !== undefined && le === le) {
      row.buckets.set(le, (row.buckets.get(le) || 0) + value);
    }
  }
  return rows;
}

// How much a counter grew; after a reset (the process restarted) all of it is new.
const growth = (now, before) => (now >= before ? now - before : now);

// The interval's bucket counts [[le, n]], sorted by bound, made monotonic as Prometheus does.
function bucketDelta(now, before) {
  const reset = Array.from(now).some(([le, n]) => n < (before.get(le) || 0));
  const buckets = Array.from(now, ([le, n]) => [le, reset ? n : n - (before.get(le) || 0)]);
  buckets.sort((a, b) => a[0] - b[0]);
  buckets.forEach((b, i) => { if (i > 0) b[1] = Math.max(b[1], buckets[i - 1][1]); });
  return buckets;
}

// histogram_quantile(): the bucket holding rank q·total, interpolated linearly within it.
function quantile(q, buckets) {
  const n = buckets.length;
  if (n < 2 || buckets[n - 1][0] !== Infinity || !(buckets[n - 1][1] > 0)) return null;
  const rank = q * buckets[n - 1][1];
  const b = buckets.findIndex(([, count]) => count >= rank);
  if (b === n - 1) return buckets[n - 2][0];
  if (b === 0 && buckets[0][0] <= 0) return buckets[0][0];
  const [start, below] = b === 0 ? [0, 0] : buckets[b - 1];
  return start + (buckets[b][0] - start) * ((rank - below) / (buckets[b][1] - below));
}

const formatRate = (r) => (r === null ? '–' : r.toFixed(r >= 100 ? 0 : r >= 10 ? 1 : 2));
const formatMs = (s) => (s === null ? '–' : (s * 1000).toFixed(s >= 0.1 ? 0 : s >= 0.01 ? 1 : 3));

// ---- The endpoint page.

const page = {name: null, last: null, ageEl: null, gen: 0, timer: 0, prev: null, rows: new Map()};

function addField(list, key, value) {
  const dd = el('dd', value);
  list.append(el('dt', key), dd);
  return dd;
}

function renderEndpointPage() {
  const entry = endpoints.get(page.name);
  if (entry) page.last = entry.ep;
  const gone = entry ? entry.gone : synced;
  const ep = page.last;
  const fields = $('endpoint-fields'), metadata = $('endpoint-metadata');
  $('endpoint-title').textContent = page.name;
  $('endpoint-gone').hidden = !gone;
  fields.replaceChildren();
  metadata.replaceChildren();
  page.ageEl = null;
  $('no-metadata').hidden = !ep || ep.metadata.length > 0;
  if (!ep) return addField(fields, 'state', gone ? 'not registered' : 'waiting for the registry…');
  const when = ep.registeredAtMillis ? new Date(ep.registeredAtMillis).toISOString() : '–';
  for (const [key, value] of [['state', gone ? 'gone (was ' + ep.state + ')' : ep.state],
    ['job', ep.jobId], ['actor', ep.actor], ['task index', String(ep.taskIndex)],
    ['address', ep.address], ['incarnation', ep.incarnation], ['registered', when]]) {
    addField(fields, key, value);
  }
  page.ageEl = addField(fields, 'age', formatAge(ep.registeredAtMillis));
  for (const {key, value} of ep.metadata) addField(metadata, key, value).dataset.metaKey = key;
}

function showMetrics(text) {
  const now = {time: performance.now(), rows: summarize(parseMetrics(text))};
  const prev = page.prev;
  const seconds = prev ? (now.time - prev.time) / 1000 : 0;
  for (const [key, tr] of page.rows) {
    if (!now.rows.has(key)) {
      tr.remove();
      page.rows.delete(key);
    }
  }
  const keys = Array.from(now.rows.keys()).sort(collate);
  for (const key of keys) {
    const r = now.rows.get(key);
    const p = prev && seconds > 0 ? prev.rows.get(key) : undefined;
    const buckets = p ? bucketDelta(r.buckets, p.buckets) : [];
    const texts = [r.actor, r.method,
      formatRate(p ? growth(r.calls, p.calls) / seconds : null),
      formatRate(p ? growth(r.errors, p.errors) / seconds : null),
      String(r.errors), String(r.inFlight),
      formatMs(quantile(0.5, buckets)), formatMs(quantile(0.99, buckets))];
    if (!page.rows.has(key)) {
      const tr = el('tr');
      tr.dataset.actor = r.actor;
      tr.dataset.method = r.method;
      texts.forEach((_, i) => tr.append(el('td', '', i < 2 ? '' : 'num')));
      page.rows.set(key, tr);
    }
    const tr = page.rows.get(key);
    texts.forEach((t, i) => { tr.cells[i].textContent = t; });
    tr.classList.toggle('has-errors', r.errors > 0);
    $('metrics-body').append(tr);  // in sorted order: moves a row already there to its place
  }
  page.prev = now;
  $('metrics-status').textContent = keys.length === 0 ? 'no call metrics' :
      'updated ' + new Date().toLocaleTimeString() + (prev ? '' : '; rates after the next fetch');
}

// The endpoint's history: its traffic and latency charts.
async function endpointHistory(gen) {
  const jobId = page.last ? page.last.jobId : page.name.split('/')[0];
  const res = await api('/api/history?job=' + encodeURIComponent(jobId));
  if (!res.ok || gen !== page.gen) return;
  const history = normHistory(await res.json());
  if (gen !== page.gen) return;
  const series = history.endpoints.find((s) => s.name === page.name) ||
                 {name: page.name, samples: []};
  $('endpoint-history').replaceChildren(
      drawChart('traffic', history, series, trafficLines(series)),
      drawChart('latency', history, series, latencyLines()));
}

function pollMetrics(gen) {
  const status = (text) => { if (gen === page.gen) $('metrics-status').textContent = text; };
  endpointHistory(gen).catch(() => {});
  api('/api/metrics?endpoint=' + encodeURIComponent(page.name))
      .then(async (res) => {
        const text = await res.text();
        if (gen !== page.gen) return;
        if (res.ok) return showMetrics(text);
        status('metrics unavailable (' + res.status + '): ' + text);
      })
      .catch((e) => status('metrics unavailable: ' + e.message))
      .finally(() => {
        if (gen === page.gen) page.timer = setTimeout(() => pollMetrics(gen), METRICS_MS);
      });
}

// ---- Routing: #/ is the overview, #/endpoint/<name> an endpoint's page.

function decode(text) {
  try {
    return decodeURIComponent(text);
  } catch (e) {
    return null;
  }
}

function route() {
  const match = /^#\/endpoint\/(.+)$/.exec(location.hash);
  const name = match ? decode(match[1]) : null;  // a malformed link shows the overview
  const jobMatch = /^#\/job\/(.+)$/.exec(location.hash);
  const jobId = jobMatch ? decode(jobMatch[1]) : null;
  clearTimeout(page.timer);
  Object.assign(page, {name, last: null, ageEl: null, prev: null, gen: page.gen + 1});
  page.rows.clear();
  $('metrics-body').replaceChildren();
  $('endpoint-history').replaceChildren();
  $('overview').hidden = name !== null || jobId !== null;
  $('endpoint-view').hidden = name === null;
  openJobPage(jobId);
  if (name === null && jobId === null) pollHistory();
  if (name === null) return;
  $('metrics-status').textContent = 'loading…';
  renderEndpointPage();
  pollMetrics(page.gen);
}

function tick() {
  for (const {ep, cells} of endpoints.values()) cells.age.textContent = formatAge(ep.registeredAtMillis);
  if (page.ageEl) page.ageEl.textContent = formatAge(page.last.registeredAtMillis);
}

$('token-form').addEventListener('submit', (event) => {
  event.preventDefault();
  const token = $('token-input').value.trim();
  if (!token) return;
  sessionStorage.setItem(TOKEN_KEY, token);
  $('token-input').value = '';
  $('token-form').hidden = true;
  $('views').hidden = false;
  connect();
  route();
});
window.addEventListener('hashchange', route);
setInterval(tick, 1000);
route();
connect();
