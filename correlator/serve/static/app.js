// rootrank serve: paste or drop logs, send them to this server, show what it found.
// Log text is data: everything from the server goes into the page as text (textContent), never as markup.
'use strict';

(() => {
  const PROGRESS_FROM = 2 * 1024 * 1024; // a bar for uploads of a few MiB and more
  const $ = (id) => document.getElementById(id);
  const maxBytes = Number(document.body.dataset.maxBytes);
  const picked = new Map(); // relative path -> File, in the order they came
  let busy = false;

  const setState = (state) => { document.body.dataset.state = state; };

  function human(n) {
    if (n >= 1024 * 1024) return `${(n / (1024 * 1024)).toFixed(1)} MiB`;
    if (n >= 1024) return `${(n / 1024).toFixed(1)} KiB`;
    return `${n} B`;
  }

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined) continue;
      if (key === 'class') node.className = value;
      else if (key.startsWith('data-') || key === 'id' || key === 'type' || key === 'title') node.setAttribute(key, value);
      else node[key] = value;
    }
    for (const child of children) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  // --- choosing the input ---------------------------------------------------------------------

  function addFile(path, file) {
    picked.set(path.replace(/^\/+/, '') || file.name, file);
  }

  function showPicked() {
    const list = $('files');
    list.replaceChildren(...Array.from(picked, ([path, file]) =>
      el('li', {'data-path': path}, path, el('span', {class: 'size'}, human(file.size)))));
    $('picked').hidden = picked.size === 0;
  }

  function readEntries(reader) {
    return new Promise((resolve, reject) => reader.readEntries(resolve, reject));
  }

  async function walk(entry, found) {
    if (entry.isFile) {
      const file = await new Promise((resolve, reject) => entry.file(resolve, reject));
      found.push([entry.fullPath, file]);
    } else if (entry.isDirectory) {
      const reader = entry.createReader();
      for (;;) { // a folder's entries come in batches
        const batch = await readEntries(reader);
        if (!batch.length) break;
        for (const child of batch) await walk(child, found);
      }
    }
  }

  async function onDrop(event) {
    event.preventDefault();
    $('dropzone').classList.remove('over');
    const data = event.dataTransfer;
    if (!data) return;
    // Taken now: the drop's data is emptied once this handler awaits.
    const items = Array.from(data.items || []).filter((item) => item.kind === 'file');
    const entries = items.map((item) => (item.webkitGetAsEntry ? item.webkitGetAsEntry() : null));
    const files = Array.from(data.files || []);
    const found = [];
    try {
      if (entries.length && entries.every(Boolean)) {
        for (const entry of entries) await walk(entry, found);
      } else {
        for (const file of files) found.push([file.name, file]);
      }
    } catch (err) {
      showError(`Could not read what was dropped: ${err && err.message ? err.message : err}`);
      return;
    }
    for (const [path, file] of found) addFile(path, file);
    showPicked();
  }

  function onPick(event) {
    for (const file of Array.from(event.target.files || [])) addFile(file.webkitRelativePath || file.name, file);
    event.target.value = '';
    showPicked();
  }

  // --- sending ------------------------------------------------------------------------------

  function showError(message) {
    const box = $('error');
    box.textContent = message;
    box.hidden = false;
    $('status').textContent = '';
    setState('error');
  }

  function progress(loaded, total) {
    const bar = $('progress');
    bar.dataset.loaded = String(loaded);
    bar.dataset.total = String(total);
    $('progress-bar').value = total ? loaded / total : 0;
    $('progress-text').textContent = `${human(loaded)} of ${human(total)} sent`;
  }

  function diagnose() {
    if (busy) return;
    const text = $('text').value;
    const form = new FormData();
    let total = 0;
    for (const [path, file] of picked) {
      form.append('file', file, path);
      total += file.size;
    }
    if (text.trim()) {
      const blob = new Blob([text], {type: 'text/plain'}); // a file part: its bytes are sent as they are
      form.append('text', blob, 'pasted.log');
      total += blob.size;
    }
    const job = $('job').value.trim();
    if (job) form.append('job', job);
    $('error').hidden = true;
    if (!picked.size && !text.trim()) {
      showError('Paste a log or drop log files first.');
      return;
    }
    if (total > maxBytes) {
      showError(`The logs are ${human(total)}, over this server's limit of ${human(maxBytes)}: start rootrank serve `
        + 'with --max-upload-mib N to raise it, or run rootrank diagnose on the files.');
      return;
    }
    const xhr = new XMLHttpRequest();
    xhr.open('POST', '/api/diagnose');
    xhr.responseType = 'text';
    const bar = $('progress');
    bar.hidden = total < PROGRESS_FROM;
    progress(0, total);
    xhr.upload.addEventListener('progress', (event) => {
      progress(event.loaded, event.lengthComputable ? event.total : total);
    });
    xhr.upload.addEventListener('load', () => {
      setState('diagnosing');
      $('status').textContent = 'Diagnosing...';
    });
    xhr.addEventListener('load', () => {
      busy = false;
      $('diagnose').disabled = false;
      if (xhr.status === 200) {
        let report;
        try {
          report = JSON.parse(xhr.responseText);
        } catch (err) {
          showError(`The server's answer is not JSON: ${err.message}`);
          return;
        }
        let notes = [];
        try {
          notes = JSON.parse(xhr.getResponseHeader('X-Rootrank-Notes') || '[]');
        } catch (err) {
          notes = [];
        }
        show(report, notes, xhr.responseText);
        return;
      }
      let message = `${xhr.status} ${xhr.statusText}`;
      try {
        message = `${JSON.parse(xhr.responseText).error} (${xhr.status})`;
      } catch (err) {
        // not JSON: the status line says it
      }
      showError(message);
    });
    xhr.addEventListener('error', () => {
      busy = false;
      $('diagnose').disabled = false;
      showError('The connection to rootrank serve was lost (is it still running?).');
    });
    busy = true;
    $('diagnose').disabled = true;
    $('result').hidden = true; // the previous answer is not this one's
    $('status').textContent = total >= PROGRESS_FROM ? 'Sending...' : 'Diagnosing...';
    setState('uploading');
    xhr.send(form);
  }

  // --- the answer ---------------------------------------------------------------------------

  function who(initiator) {
    const parts = [];
    if (initiator.rank !== null) parts.push(`rank ${initiator.rank}`);
    if (initiator.host) parts.push(initiator.host);
    if (initiator.local_rank !== null) parts.push(`local rank ${initiator.local_rank}`);
    if (initiator.gpu !== null) parts.push(`GPU ${initiator.gpu}`);
    if (initiator.pid !== null) parts.push(`pid ${initiator.pid}`);
    return parts.join(' · ') || 'no rank named in these logs';
  }

  function showPicture(incidentId) {
    const frame = $('picture');
    frame.hidden = false;
    frame.dataset.incident = incidentId;
    frame.src = `/incident/${encodeURIComponent(incidentId)}`;
  }

  function otherList(id, title, incidents) {
    if (!incidents.length) return null;
    return el('div', {id},
      el('h3', {}, title),
      el('ul', {}, ...incidents.map((incident) => el('li', {'data-incident': incident.incident_id},
        el('b', {}, incident.class), ` · ${incident.title} · ${who(incident.initiator)} · `,
        el('span', {class: 'mono'}, incident.incident_id),
        el('button', {type: 'button', class: 'quiet', onclick: () => showPicture(incident.incident_id)}, 'picture')))));
  }

  function show(report, notes, raw) {
    const summary = {replaceChildren: (...nodes) => $('summary').replaceChildren(...nodes.filter(Boolean))};
    const incidents = report.incidents || [];
    const recovered = report.recovered || [];
    const download = el('a', {class: 'quiet', download: 'rootrank-diagnose.json',
      href: URL.createObjectURL(new Blob([raw], {type: 'application/json'}))}, 'the JSON');
    const noteBox = notes.length ? el('ul', {class: 'notes', id: 'r-notes'}, ...notes.map((n) => el('li', {}, n))) : null;
    if (!incidents.length) {
      summary.replaceChildren(
        el('p', {class: 'none', id: 'r-none'}, 'No incident: no failure signature in these logs.'),
        otherList('r-recovered', 'Failures the job survived', recovered), noteBox, el('p', {}, download));
      $('picture').hidden = true;
      $('picture').removeAttribute('src');
    } else {
      const first = incidents[0];
      const ini = first.initiator;
      summary.replaceChildren(
        el('h2', {id: 'r-title'}, el('span', {class: `badge sev-${first.severity}`, id: 'r-severity'}, first.severity),
          first.title),
        el('dl', {class: 'kv'},
          el('dt', {}, 'class'), el('dd', {id: 'r-class'}, first.class),
          el('dt', {}, 'initiator'), el('dd', {id: 'r-initiator', 'data-rank': ini.rank === null ? '' : String(ini.rank),
            'data-host': ini.host || ''}, who(ini)),
          el('dt', {}, 'first seen'), el('dd', {}, ini.ts || '-'),
          el('dt', {}, 'line'), el('dd', {class: 'mono', id: 'r-line'}, ini.line),
          el('dt', {}, 'confidence'), el('dd', {}, `${first.confidence.toFixed(2)}: ${first.confidence_reason}`),
          el('dt', {}, 'incident'), el('dd', {}, el('span', {class: 'mono', id: 'r-incident-id'}, first.incident_id),
            ` · job ${first.job_id} · `, download)),
        otherList('r-others', 'Other unexplained failures', incidents.slice(1)),
        otherList('r-recovered', 'Failures the job survived', recovered),
        noteBox);
      showPicture(first.incident_id);
    }
    $('result').hidden = false;
    $('status').textContent = '';
    setState('done');
  }

  function fitPicture() {
    const frame = $('picture');
    try {
      const doc = frame.contentDocument;
      if (doc && doc.documentElement) frame.style.height = `${doc.documentElement.scrollHeight + 4}px`;
    } catch (err) {
      // another origin: keep the default height
    }
    document.body.dataset.picture = frame.dataset.incident || '';
  }

  // --- wiring -------------------------------------------------------------------------------

  document.addEventListener('DOMContentLoaded', () => {
    const zone = $('dropzone');
    for (const name of ['dragenter', 'dragover']) {
      zone.addEventListener(name, (event) => {
        event.preventDefault();
        if (event.dataTransfer) event.dataTransfer.dropEffect = 'copy';
        zone.classList.add('over');
      });
    }
    zone.addEventListener('dragleave', () => zone.classList.remove('over'));
    zone.addEventListener('drop', onDrop);
    // A drop that misses the zone must not make the browser open the file instead of this page.
    window.addEventListener('dragover', (event) => event.preventDefault());
    window.addEventListener('drop', (event) => { if (!zone.contains(event.target)) event.preventDefault(); });
    $('file-input').addEventListener('change', onPick);
    $('folder-input').addEventListener('change', onPick);
    $('clear').addEventListener('click', () => { picked.clear(); showPicked(); });
    $('form').addEventListener('submit', (event) => { event.preventDefault(); diagnose(); });
    $('text').addEventListener('keydown', (event) => {
      if (event.key === 'Enter' && (event.ctrlKey || event.metaKey)) { event.preventDefault(); diagnose(); }
    });
    $('picture').addEventListener('load', fitPicture);
    setState('ready');
  });
})();
