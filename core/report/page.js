// core/report/page.js — draws the run report from the JSON in #dew-data (written by core/report/report.cpp):
// a table of the runs, curves as inline SVG (one chart per metric group, every run overlaid, TensorBoard's
// debiased exponential smoothing, log scale for loss-like metrics, values under the pointer), the latest
// image grids and text samples, the config differences between runs and each effective config.
// No network and no library: the page is one file. When done it sets body[data-rendered] (the chart count)
// and body[data-plots] (each plot area's rectangle, in CSS pixels of the page), which the tests read.
(function () {
  'use strict';
  const data = JSON.parse(document.getElementById('dew-data').textContent);
  const runs = data.runs;
  const root = document.getElementById('dew-report');
  const SVGNS = 'http://www.w3.org/2000/svg';
  const PALETTE = ['#1f77b4', '#d62728', '#2ca02c', '#ff7f0e', '#9467bd', '#8c564b', '#e377c2', '#17becf',
                   '#bcbd22', '#7f7f7f'];
  const DASHES = ['', '7 4', '2 3', '10 3 2 3'];
  const state = { smoothing: 0, log: true };
  const W = 480, H = 250, M = { left: 60, right: 14, top: 10, bottom: 30 };

  // ---- small DOM helpers ----
  function el(tag, attrs, children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === 'text') e.textContent = v;
      else if (k === 'class') e.className = v;
      else e.setAttribute(k, v);
    }
    for (const c of children || []) if (c !== null && c !== undefined) e.append(c);
    return e;
  }
  function svg(tag, attrs) {
    const e = document.createElementNS(SVGNS, tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
    return e;
  }
  function fmt(v) {
    if (v === null || v === undefined || !isFinite(v)) return '—';
    const a = Math.abs(v);
    if (a !== 0 && (a >= 1e5 || a < 1e-4)) return v.toExponential(2);
    if (Number.isInteger(v)) return String(v);
    return String(Number(v.toPrecision(4)));
  }
  function finite(y) { return y !== null && y !== undefined && isFinite(y); }
  function utf8(b64) { return new TextDecoder('utf-8').decode(Uint8Array.from(atob(b64), (c) => c.charCodeAt(0))); }

  // ---- which metrics go to which chart ----
  const LOSS_KEYS = ['loss', 'val/loss', 'val/ce'];
  const LOGGABLE = /(^|\/)(loss|ce|mse|perplexity|bits_per_byte|grad_norm)$/;
  const NAMED = {
    'lr': 'learning rate', 'grad_norm': 'gradient norm', 'samples_per_sec': 'throughput (samples/s)',
    'tokens_per_sec': 'throughput (tokens/s)', 'step_time_ms': 'step time (ms)', 'mfu': 'MFU (of measured peak)',
    'allreduce_ms': 'all-reduce (ms)', 'skipped': 'skipped updates (non-finite)',
  };
  const ORDER = ['lr', 'grad_norm', 'samples_per_sec', 'tokens_per_sec', 'step_time_ms', 'mfu'];
  function isMemory(k) { return /^mem_|(^|_)rss(_|$)/.test(k); }

  const allKeys = [];
  for (const r of runs) for (const k of Object.keys(r.series)) if (!allKeys.includes(k)) allKeys.push(k);
  function hasSignal(k) {  // some run has a finite non-zero value
    return runs.some((r) => (r.series[k] || []).some((p) => finite(p[1]) && p[1] !== 0));
  }
  const groups = [];
  const used = new Set();
  function addGroup(title, keys, opts) {
    const present = keys.filter((k) => allKeys.includes(k) && !used.has(k) && hasSignal(k));
    if (!present.length) return;
    present.forEach((k) => used.add(k));
    groups.push(Object.assign({ title: title, keys: present, loggable: present.every((k) => LOGGABLE.test(k)) },
                              opts || {}));
  }
  addGroup('loss (train and validation)', LOSS_KEYS);
  for (const k of allKeys) if (k.startsWith('val/')) addGroup('validation ' + k.slice(4), [k]);
  for (const k of ORDER) addGroup(NAMED[k], [k]);
  addGroup('memory (MiB)', allKeys.filter(isMemory));
  for (const k of allKeys) addGroup(NAMED[k] || 'train ' + k, [k]);
  // TensorBoard's default smoothing, once there are enough points for it to mean something.
  const longest = Math.max(0, ...runs.flatMap((r) => Object.values(r.series).map((s) => s.length)));
  state.smoothing = longest >= 20 ? 0.6 : 0;
  // Not smoothed: validation values (each a whole-split measurement), the schedule, memory.
  function smoothable(k) { return !k.startsWith('val/') && k !== 'lr' && !isMemory(k); }

  // ---- numbers ----
  function smooth(points, w) {
    if (!(w > 0)) return points;
    let last = 0, n = 0;
    return points.map(([x, y]) => {
      if (!finite(y)) return [x, y];
      last = last * w + (1 - w) * y;
      n += 1;
      return [x, last / (1 - Math.pow(w, n))];
    });
  }
  function niceStep(range, count) {
    const raw = range / count;
    const mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const r = raw / mag;
    return (r < 1.5 ? 1 : r < 3 ? 2 : r < 7 ? 5 : 10) * mag;
  }
  function linearTicks(lo, hi, count, integer) {
    let step = niceStep(hi - lo, count);
    if (integer) step = Math.max(1, Math.round(step));
    const out = [];
    for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(Math.abs(v) < step * 1e-9 ? 0 : v);
    return out;
  }
  function logTicks(lo, hi) {  // lo, hi: log10 of the domain
    const out = [];
    if (hi - lo >= 1) {
      const every = Math.max(1, Math.ceil((Math.floor(hi) - Math.ceil(lo) + 1) / 6));
      for (let k = Math.ceil(lo); k <= Math.floor(hi); k += every) out.push(Math.pow(10, k));
      if (out.length >= 2) return out;
    }
    for (let k = Math.floor(lo); k <= Math.ceil(hi); k++)
      for (const m of [1, 2, 5]) {
        const v = m * Math.pow(10, k);
        if (Math.log10(v) >= lo - 1e-9 && Math.log10(v) <= hi + 1e-9) out.push(v);
      }
    if (out.length >= 2) return out;
    return linearTicks(Math.pow(10, lo), Math.pow(10, hi), 4, false).filter((v) => v > 0);
  }

  // ---- the series of a group: one per (run, key) with data ----
  function seriesOf(group) {
    const out = [];
    runs.forEach((r, ri) => {
      group.keys.forEach((k, ki) => {
        const pts = (r.series[k] || []).filter((p) => p[0] !== null);
        if (!pts.length) return;
        const many = runs.length > 1;
        out.push({
          label: many ? (group.keys.length > 1 ? r.name + ' · ' + k : r.name) : k,
          color: PALETTE[(many ? ri : ki) % PALETTE.length],
          dash: many ? DASHES[ki % DASHES.length] : '',
          points: pts,
          validation: k.startsWith('val/'),
          smoothable: smoothable(k),
        });
      });
    });
    return out;
  }

  const charts = [];
  function drawChart(chart) {
    const group = chart.group;
    const logScale = state.log && group.loggable;
    const series = seriesOf(group).map((s) => {
      let pts = s.points;
      if (logScale) pts = pts.filter((p) => finite(p[1]) && p[1] > 0);
      const smoothed = s.smoothable && pts.length >= 3 && state.smoothing > 0 ? smooth(pts, state.smoothing) : null;
      return Object.assign({}, s, { pts: pts, smoothed: smoothed });
    });
    let x0 = Infinity, x1 = -Infinity, y0 = Infinity, y1 = -Infinity, hidden = false;
    for (const s of series) {
      if (logScale && s.pts.length < s.points.length) hidden = true;
      for (const [x, y] of s.pts) {
        if (!finite(y)) continue;
        x0 = Math.min(x0, x); x1 = Math.max(x1, x);
        const v = logScale ? Math.log10(y) : y;
        y0 = Math.min(y0, v); y1 = Math.max(y1, v);
      }
    }
    const box = svg('svg', { viewBox: '0 0 ' + W + ' ' + H, role: 'img', 'aria-label': group.title });
    const pw = W - M.left - M.right, ph = H - M.top - M.bottom;
    const area = svg('rect', { x: M.left, y: M.top, width: pw, height: ph, fill: '#ffffff', stroke: '#c9ced8',
                               class: 'plot-area' });
    box.append(area);
    chart.note.textContent = hidden ? 'values <= 0 are not shown on the log scale' : '';
    chart.area = area;
    chart.box.replaceChildren(box);
    if (!isFinite(x0)) {
      const t = svg('text', { x: M.left + pw / 2, y: M.top + ph / 2, 'text-anchor': 'middle' });
      t.textContent = 'no finite values';
      box.append(t);
      return;
    }
    if (x1 === x0) { x0 -= 1; x1 += 1; }
    if (y1 === y0) { const d = Math.abs(y0) * 0.05 || (logScale ? 0.1 : 1); y0 -= d; y1 += d; }
    const pad = (y1 - y0) * 0.05;
    y0 -= pad; y1 += pad;
    const sx = (x) => M.left + (x - x0) / (x1 - x0) * pw;
    const sy = (y) => M.top + ph - ((logScale ? Math.log10(y) : y) - y0) / (y1 - y0) * ph;

    // grid and axes
    const yt = logScale ? logTicks(y0, y1) : linearTicks(y0, y1, 5, false);
    for (const v of yt) {
      const y = sy(v);
      if (y < M.top - 0.5 || y > M.top + ph + 0.5) continue;
      box.append(svg('line', { x1: M.left, x2: M.left + pw, y1: y, y2: y, stroke: '#eceef2' }));
      const t = svg('text', { x: M.left - 6, y: y + 4, 'text-anchor': 'end' });
      t.textContent = fmt(v);
      box.append(t);
    }
    for (const v of linearTicks(x0, x1, 6, true)) {
      const x = sx(v);
      if (x < M.left - 0.5 || x > M.left + pw + 0.5) continue;
      box.append(svg('line', { x1: x, x2: x, y1: M.top, y2: M.top + ph, stroke: '#f1f2f5' }));
      const t = svg('text', { x: x, y: M.top + ph + 16, 'text-anchor': 'middle' });
      t.textContent = fmt(v);
      box.append(t);
    }
    const xl = svg('text', { x: M.left + pw, y: H - 2, 'text-anchor': 'end' });
    xl.textContent = 'step';
    box.append(xl);

    // curves: the raw values faint under the smoothed ones; markers on sparse series
    const clip = 'clip-' + chart.index;
    const defs = svg('defs');
    const cp = svg('clipPath', { id: clip });
    cp.append(svg('rect', { x: M.left, y: M.top, width: pw, height: ph }));
    defs.append(cp);
    box.append(defs);
    const layer = svg('g', { 'clip-path': 'url(#' + clip + ')' });
    box.append(layer);
    function path(pts) {
      let d = '', pen = false;
      for (const [x, y] of pts) {
        if (!finite(y)) { pen = false; continue; }
        d += (pen ? 'L' : 'M') + sx(x).toFixed(2) + ' ' + sy(y).toFixed(2);
        pen = true;
      }
      return d;
    }
    for (const s of series) {
      const attrs = { fill: 'none', stroke: s.color, 'stroke-width': 1.6, 'stroke-linejoin': 'round' };
      if (s.dash) attrs['stroke-dasharray'] = s.dash;
      if (s.smoothed) {
        layer.append(svg('path', Object.assign({}, attrs, { d: path(s.pts), 'stroke-opacity': 0.28 })));
        layer.append(svg('path', Object.assign({}, attrs, { d: path(s.smoothed), 'stroke-width': 2 })));
      } else {
        layer.append(svg('path', Object.assign({}, attrs, { d: path(s.pts) })));
      }
      if (s.validation || s.pts.length <= 40)
        for (const [x, y] of s.pts)
          if (finite(y)) layer.append(svg('circle', { cx: sx(x), cy: sy(y), r: 2.6, fill: s.color }));
    }

    // values under the pointer
    const cursor = svg('line', { y1: M.top, y2: M.top + ph, stroke: '#9aa1ad', 'stroke-dasharray': '3 3',
                                 visibility: 'hidden' });
    box.append(cursor);
    box.addEventListener('mousemove', (ev) => {
      const r = box.getBoundingClientRect();
      const px = (ev.clientX - r.left) / r.width * W;
      if (px < M.left || px > M.left + pw) { cursor.setAttribute('visibility', 'hidden'); chart.tip.style.display = 'none'; return; }
      const step = x0 + (px - M.left) / pw * (x1 - x0);
      const lines = [];
      let at = null;
      for (const s of series) {
        if (!s.pts.length) continue;
        let best = 0;
        for (let i = 1; i < s.pts.length; i++)
          if (Math.abs(s.pts[i][0] - step) < Math.abs(s.pts[best][0] - step)) best = i;
        const p = s.pts[best];
        if (at === null || Math.abs(p[0] - step) < Math.abs(at - step)) at = p[0];
        const sm = s.smoothed ? ' (smoothed ' + fmt(s.smoothed[best][1]) + ')' : '';
        lines.push([s.color, s.label + ': ' + fmt(p[1]) + sm + ' @ ' + p[0]]);
      }
      cursor.setAttribute('x1', sx(at)); cursor.setAttribute('x2', sx(at));
      cursor.setAttribute('visibility', 'visible');
      chart.tip.replaceChildren(...lines.map(([c, t]) => el('div', {}, [el('span', { class: 'swatch', style: 'background:' + c }), t])));
      chart.tip.style.display = 'block';
      const cx = ev.clientX - chart.div.getBoundingClientRect().left;
      chart.tip.style.left = Math.min(cx + 12, chart.div.clientWidth - chart.tip.offsetWidth - 4) + 'px';
      chart.tip.style.top = '28px';
    });
    box.addEventListener('mouseleave', () => { cursor.setAttribute('visibility', 'hidden'); chart.tip.style.display = 'none'; });
  }

  function legendOf(group) {
    return seriesOf(group).map((s) => el('span', { class: 'item' }, [
      el('span', { class: 'swatch', style: 'background:' + s.color + (s.dash ? ';opacity:0.7' : '') }),
      s.label + (s.dash ? ' (dashed)' : '')]));
  }

  function lastValue(run, key) {
    const s = run.series[key] || [];
    for (let i = s.length - 1; i >= 0; i--) if (finite(s[i][1])) return s[i];
    return null;
  }

  // ---- the page ----
  const names = runs.map((r) => r.name).join(' vs ');
  root.append(el('h1', { text: 'dew run report: ' + names }));
  root.append(el('div', { class: 'muted', text: 'generated ' + data.generated + ' by dew-run report' }));

  // runs table
  const valKeys = allKeys.filter((k) => k.startsWith('val/'));
  const head = el('tr', {}, [el('th', { text: 'run' }), el('th', { text: 'directory' }), el('th', { text: 'model' }),
    el('th', { text: 'objective' }), el('th', { text: 'last step' }), el('th', { text: 'train loss' }),
    ...valKeys.map((k) => el('th', { text: k }))]);
  const rows = runs.map((r, i) => {
    const lastStep = Object.values(r.series).reduce((m, s) => Math.max(m, s.length ? s[s.length - 1][0] : 0), 0);
    const loss = lastValue(r, 'loss');
    return el('tr', {}, [
      el('td', {}, [el('span', { class: 'swatch', style: 'background:' + PALETTE[i % PALETTE.length] }), r.name]),
      el('td', { text: r.dir }), el('td', { text: r.config['model.plugin'] || '' }),
      el('td', { text: r.config['objective.plugin'] || '' }), el('td', { class: 'num', text: String(lastStep) }),
      el('td', { class: 'num', text: loss ? fmt(loss[1]) : '—' }),
      ...valKeys.map((k) => { const v = lastValue(r, k); return el('td', { class: 'num', text: v ? fmt(v[1]) + ' @ ' + v[0] : '—' }); }),
    ]);
  });
  root.append(el('div', { class: 'wide' }, [el('table', { id: 'runs' }, [head, ...rows])]));

  // controls
  const slider = el('input', { type: 'range', min: '0', max: '0.99', step: '0.01', value: String(state.smoothing), id: 'smoothing' });
  const sval = el('span', { text: state.smoothing.toFixed(2) });
  const logBox = el('input', { type: 'checkbox', id: 'logscale' });
  logBox.checked = state.log;
  root.append(el('div', { class: 'controls' }, [
    el('label', {}, ['smoothing ', slider, ' ', sval]),
    el('label', {}, [logBox, ' log scale (loss-like charts)']),
    el('span', { class: 'muted', text: 'raw values faint, smoothed solid; dots: validation and sparse series; hover for values' }),
  ]));

  // charts
  root.append(el('h2', { text: 'Curves' }));
  const grid = el('div', { class: 'charts', id: 'charts' });
  root.append(grid);
  groups.forEach((g, i) => {
    const div = el('div', { class: 'chart', 'data-chart': g.title });
    const chart = { group: g, index: i, div: div, box: el('div'), note: el('div', { class: 'note' }), tip: el('div', { class: 'tip' }) };
    div.append(el('div', { class: 'title', text: g.title }), el('div', { class: 'legend' }, legendOf(g)), chart.box, chart.note, chart.tip);
    grid.append(div);
    charts.push(chart);
  });
  if (!groups.length) grid.append(el('p', { class: 'muted', text: 'metrics.jsonl has no values yet' }));

  // samples
  const hasSamples = runs.some((r) => r.images.length || r.texts.length);
  if (hasSamples) {
    root.append(el('h2', { text: 'Samples (latest validation)' }));
    const wrap = el('div', { class: 'samples' });
    runs.forEach((r, i) => {
      const col = el('div', { class: 'sample-run' }, [el('h3', {}, [el('span', { class: 'swatch', style: 'background:' + PALETTE[i % PALETTE.length] }), r.name])]);
      const tags = [...new Set(r.images.map((im) => im.tag))];
      for (const tag of tags) {
        const ims = r.images.filter((im) => im.tag === tag);
        col.append(el('div', { class: 'muted', text: tag + ' at step ' + ims[0].step + ' (' + ims[0].file + ')' }));
        const big = el('img', { src: ims[0].src, alt: ims[0].file, class: 'grid-image' });
        big.addEventListener('load', () => {
          const k = Math.max(1, Math.floor(320 / Math.max(1, big.naturalWidth)));
          big.style.width = big.naturalWidth * k + 'px';
        });
        col.append(big);
        if (ims.length > 1) {
          const thumbs = el('div', { class: 'thumbs' });
          for (const im of ims.slice(1)) {
            const t = el('img', { src: im.src, alt: im.file });
            t.addEventListener('load', () => { t.style.width = Math.min(96, t.naturalWidth * Math.max(1, Math.floor(96 / t.naturalWidth))) + 'px'; });
            thumbs.append(el('figure', {}, [t, el('figcaption', { text: 'step ' + im.step })]));
          }
          col.append(el('div', { class: 'muted', text: 'earlier' }), thumbs);
        }
      }
      const ttags = [...new Set(r.texts.map((t) => t.tag))];
      for (const tag of ttags) {
        const ts = r.texts.filter((t) => t.tag === tag);
        col.append(el('div', { class: 'muted', text: tag + ' at step ' + ts[0].step + ' (' + ts[0].file + ')' }));
        col.append(el('pre', { class: 'sample-text', text: utf8(ts[0].base64) }));
        for (const t of ts.slice(1))
          col.append(el('details', {}, [el('summary', { text: tag + ' at step ' + t.step }), el('pre', { text: utf8(t.base64) })]));
      }
      if (!r.images.length && !r.texts.length) col.append(el('div', { class: 'muted', text: 'no samples' }));
      wrap.append(col);
    });
    root.append(wrap);
  }

  // config: differences between runs, then each effective config
  root.append(el('h2', { text: 'Config' }));
  if (runs.length > 1) {
    const keys = [...new Set(runs.flatMap((r) => Object.keys(r.config)))].sort();
    const differ = keys.filter((k) => new Set(runs.map((r) => (k in r.config ? r.config[k] : '\u0000'))).size > 1);
    root.append(el('h3', { text: differ.length ? 'Differences (' + differ.length + ' keys)' : 'No differences' }));
    if (differ.length) {
      const th = el('tr', {}, [el('th', { text: 'key' }), ...runs.map((r) => el('th', { text: r.name }))]);
      const trs = differ.map((k) => el('tr', { class: 'differs' }, [el('td', { text: k }),
        ...runs.map((r) => el('td', { text: k in r.config ? r.config[k] : '(absent)' }))]));
      root.append(el('div', { class: 'wide' }, [el('table', { id: 'config-diff' }, [th, ...trs])]));
    }
  }
  runs.forEach((r, i) => {
    const d = el('details', {}, [el('summary', { text: 'effective config of ' + r.name + ' (' + r.dir + '/config.ini)' }),
      el('pre', { class: 'config', text: r.config_ini })]);
    d.open = runs.length === 1;
    root.append(d);
  });

  // draw, and tell the tests where the plots are
  function drawAll() {
    for (const c of charts) drawChart(c);
    const plots = charts.map((c) => {
      const r = c.area.getBoundingClientRect();
      return { title: c.group.title, x: Math.round(r.left + window.scrollX), y: Math.round(r.top + window.scrollY),
               w: Math.round(r.width), h: Math.round(r.height) };
    });
    document.body.setAttribute('data-plots', JSON.stringify(plots));
    document.body.setAttribute('data-rendered', String(charts.length));
  }
  slider.addEventListener('input', () => { state.smoothing = Number(slider.value); sval.textContent = state.smoothing.toFixed(2); drawAll(); });
  logBox.addEventListener('change', () => { state.log = logBox.checked; drawAll(); });
  drawAll();
})();
