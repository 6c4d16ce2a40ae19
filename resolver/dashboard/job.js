// A job's page (#/job/<id>): what the registry knows of the job and what its launcher says
// (GET /api/job?job=<id>: replicas with state, pid, host and restarts; resources; the job's
// events; the last lines of each replica's log), and its history (GET /api/history?job=<id>):
// the job's totals and each endpoint's calls/s, errors/s by code and latency, redrawn every
// JOB_MS.
'use strict';

const JOB_MS = 2000;

const jobPage = {id: null, gen: 0, timer: 0};

function formatTime(millis) {
  return millis ? new Date(millis).toLocaleString() : '–';
}

// "succeeded", "failed", ... for an ended job (its reason's first word when a launcher's final
// phase), "running" otherwise: as `troupe jobs` says it.
function jobOutcome(state, reason) {
  if (state !== 'ended') return 'running';
  const m = /^(succeeded|failed|stopped|unschedulable)(:|$)/.exec(reason || '');
  return m ? m[1] : 'ended';
}

function renderJobSummary(page) {
  const info = page.job || {};
  const status = info.status || {};
  const state = String(status.state || 'running');
  const outcome = jobOutcome(state, status.reason);
  $('job-title').textContent = jobPage.id;
  $('job-state').textContent = outcome;
  $('job-state').className = 'badge job-' + outcome;
  $('job-reason').textContent = String(status.reason || '');
  const fields = $('job-fields');
  fields.replaceChildren();
  const detail = page.detail || null;
  const wanted = Number(info.replicas || 0);
  for (const [key, value] of [
    ['launcher', String(info.launcher || '') || 'none (replicas started by hand)'],
    ['replicas ready', String(Number(info.ready || 0)) + (wanted ? ' of ' + wanted : '')],
    ['endpoints', String(Number(info.endpoints || 0))],
    ['resources', detail ? String(detail.resources || '') : '–'],
    ['created', formatTime(Number(info.createdAtMillis || 0))],
    ['ended', state === 'ended' ? formatTime(Number(info.endedAtMillis || 0)) : '–'],
    ['logs', String(page.logLocation || '') || '–']]) {
    addField(fields, key, value);
  }
}

function renderReplicas(page) {
  const body = $('replicas-body');
  body.replaceChildren();
  const detail = page.detail;
  $('replicas-note').textContent = detail ? '' : String(page.detailError || 'no launcher answered');
  $('replicas-note').hidden = !!detail;
  const replicas = detail && Array.isArray(detail.replicas) ? detail.replicas : [];
  for (const raw of replicas) {
    const r = raw || {};
    const tr = el('tr');
    tr.dataset.replica = String(Number(r.index || 0));
    const state = String(r.state || 'waiting');
    const cells = [String(Number(r.index || 0)), state, r.pid ? String(r.pid) : '–',
                   String(r.host || '') || '–', String(Number(r.restarts || 0))];
    cells.forEach((text, i) => tr.append(el('td', text, i === 0 || i >= 2 ? 'num' : '')));
    tr.cells[1].className = 'replica-' + state.split(' ')[0];
    body.append(tr);
  }
}

function renderEvents(page) {
  const list = $('job-events');
  list.replaceChildren();
  const events = Array.isArray(page.events) ? page.events : [];
  for (const raw of events) {
    const e = raw || {};
    const li = el('li');
    li.append(el('time', formatTime(Number(e.atMillis || 0)), 'muted'), el('span', ' ' + String(e.text || '')));
    list.append(li);
  }
  $('no-events').hidden = events.length > 0;
}

function renderLogs(page) {
  const box = $('job-logs');
  box.replaceChildren();
  const logs = Array.isArray(page.logs) ? page.logs : [];
  for (const raw of logs) {
    const l = raw || {};
    const section = el('div', undefined, 'log');
    section.dataset.replica = String(Number(l.replica || 0));
    section.append(el('h4', 'replica ' + Number(l.replica || 0) + ' (' + Number(l.size || 0) + ' bytes)'));
    section.append(el('pre', String(l.text || '') || '(empty)'));
    box.append(section);
  }
  $('no-logs').hidden = logs.length > 0;
}

function renderJobHistory(history) {
  const charts = $('job-charts');
  charts.replaceChildren();
  const total = history.jobs[0] || {name: jobPage.id, samples: []};
  charts.append(drawChart('job traffic', history, total, trafficLines(total)),
                drawChart('job latency', history, total, latencyLines()));
  const each = $('endpoint-charts');
  each.replaceChildren();
  for (const series of history.endpoints) {
    const card = el('section', undefined, 'endpoint-card');
    card.dataset.endpoint = series.name;
    const link = el('a', series.name);
    link.setAttribute('href', '#/endpoint/' + encodeURIComponent(series.name));
    const head = el('h4');
    head.append(link);
    card.append(head, drawChart(series.name + ' traffic', history, series, trafficLines(series)),
                drawChart(series.name + ' latency', history, series, latencyLines()));
    each.append(card);
  }
  $('history-note').textContent = history.interval === 0
      ? 'this registry keeps no history (troupe registry --history-interval)'
      : 'a sample every ' + history.interval / 1000 + ' s over ' + history.length / 60000 +
        ' min' + (history.refused ? '; ' + history.refused + ' endpoints have none (the registry keeps as many as it may)' : '');
}

async function pollJob(gen) {
  const id = encodeURIComponent(jobPage.id);
  try {
    const [pageRes, historyRes] = await Promise.all([api('/api/job?job=' + id),
                                                     api('/api/history?job=' + id)]);
    if (gen !== jobPage.gen) return;
    if (pageRes.status === 401 || historyRes.status === 401) return needToken();
    if (!pageRes.ok) {
      $('job-status').textContent = 'job unavailable (' + pageRes.status + '): ' + (await pageRes.text());
    } else {
      const page = await pageRes.json();
      if (gen !== jobPage.gen) return;
      renderJobSummary(page);
      renderReplicas(page);
      renderEvents(page);
      renderLogs(page);
      $('job-status').textContent = 'updated ' + new Date().toLocaleTimeString();
    }
    if (historyRes.ok) {
      const history = normHistory(await historyRes.json());
      if (gen === jobPage.gen) renderJobHistory(history);
    }
  } catch (e) {
    if (gen === jobPage.gen) $('job-status').textContent = 'job unavailable: ' + e.message;
  } finally {
    if (gen === jobPage.gen) jobPage.timer = setTimeout(() => pollJob(gen), JOB_MS);
  }
}

// Shows job `id`'s page, or (null) leaves it.
function openJobPage(id) {
  clearTimeout(jobPage.timer);
  Object.assign(jobPage, {id, gen: jobPage.gen + 1});
  $('job-view').hidden = id === null;
  if (id === null) return;
  $('job-title').textContent = id;
  for (const box of ['job-fields', 'replicas-body', 'job-events', 'job-logs', 'job-charts',
                     'endpoint-charts']) {
    $(box).replaceChildren();
  }
  $('job-status').textContent = 'loading…';
  pollJob(jobPage.gen);
}
