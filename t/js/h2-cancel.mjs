// One HTTP/2 connection, two streaming completions on it; stream A is
// reset with RST_STREAM (CANCEL) as soon as its first token arrives, B is
// read to the end.  While B runs, /metrics is sampled on the same
// connection; after B, a third request on the same connection shows that
// it stayed open.  Prints one JSON object.
// Usage: node h2-cancel.mjs ORIGIN MODEL MAX_TOKENS PROMPT [LIMIT_S]
import http2 from 'node:http2';

const [origin, model, n, prompt, limit] = process.argv.slice(2);
const max_tokens = Number(n);
const session = http2.connect(origin, { rejectUnauthorized: false });
const out = { samples: [] };

// a server that never answers fails the test instead of hanging it
setTimeout(() => {
    out.timed_out = true;
    console.log(JSON.stringify(out));
    process.exit(1);
}, Number(limit || 60) * 1000).unref();

session.on('error', (e) => { out.session_error = String(e); });

function post(path, obj) {
    const body = JSON.stringify(obj);
    const s = session.request({
        ':method': 'POST', ':path': path,
        'content-type': 'application/json',
        'content-length': Buffer.byteLength(body),
    });
    s.setEncoding('utf8');
    s.end(body);
    return s;
}

function get(path) {
    return new Promise((resolve, reject) => {
        const s = session.request({ ':method': 'GET', ':path': path });
        let data = '';
        s.setEncoding('utf8');
        s.on('data', (d) => { data += d; });
        s.on('end', () => resolve(data));
        s.on('error', reject);
    });
}

// The data: events of an SSE body so far (complete events only).
function events(text) {
    const ev = [];
    for (const block of text.split('\n\n').slice(0, -1)) {
        const m = /^data: (.*)$/s.exec(block);
        if (m) ev.push(m[1] === '[DONE]' ? m[1] : JSON.parse(m[1]));
    }
    return ev;
}

function metric(text, name) {
    const m = new RegExp(`^${name}\\{model="${model}"\\} (\\S+)$`, 'm')
        .exec(text);
    return m ? Number(m[1]) : null;
}

const req = {
    model, prompt, max_tokens, temperature: 0, ignore_eos: true,
    stream: true, stream_options: { include_usage: true },
};

// A: cancelled after its first token

const a = post('/v1/completions', req);
const aDone = new Promise((resolve) => {
    let text = '';
    a.on('response', (h) => { out.a_status = h[':status']; });
    a.on('data', (d) => {
        text += d;
        const ev = events(text).filter((e) => e !== '[DONE]' && e.choices.length);
        if (ev.length >= 1 && out.a_tokens === undefined) {
            out.a_tokens = ev.length;   // events, each at least one token
            out.a_cancelled = true;
            a.close(http2.constants.NGHTTP2_CANCEL);
        }
    });
    a.on('close', () => {
        out.a_rst = a.rstCode;
        out.a_done = events(text).includes('[DONE]');
        resolve();
    });
    a.on('error', () => {});
});

// B: read to the end

let bOpen = true;
const b = post('/v1/completions', req);
const bDone = new Promise((resolve) => {
    let text = '';
    b.on('response', (h) => { out.b_status = h[':status']; });
    b.on('data', (d) => { text += d; });
    b.on('end', () => {
        bOpen = false;
        const ev = events(text);
        out.b_done = ev[ev.length - 1] === '[DONE]';
        out.b_text = ev.filter((e) => e !== '[DONE]' && e.choices.length)
            .map((e) => e.choices[0].text).join('');
        const u = ev.find((e) => e !== '[DONE]' && e.usage);
        out.b_usage = u ? u.usage : null;
        out.b_finish = ev.filter((e) => e !== '[DONE]' && e.choices.length)
            .map((e) => e.choices[0].finish_reason).filter((f) => f)[0];
        resolve();
    });
    b.on('error', (e) => { out.b_error = String(e); bOpen = false; resolve(); });
});

await aDone;

// /metrics on the same connection while B still streams

while (bOpen) {
    const m = await get('/metrics');
    if (!bOpen) break;
    out.samples.push({
        running: metric(m, 'nalar_requests_running'),
        generated: metric(m, 'nalar_generation_tokens_total'),
    });
    await new Promise((r) => setTimeout(r, 10));
}

await bDone;

// the connection is still open: one more request on it

out.session_open = !session.closed && !session.destroyed;
const c = post('/v1/completions', { model, prompt, max_tokens: 4,
                                    ignore_eos: true,
                                    temperature: 0 });
out.c_body = await new Promise((resolve) => {
    let data = '';
    c.on('response', (h) => { out.c_status = h[':status']; });
    c.on('data', (d) => { data += d; });
    c.on('end', () => resolve(data));
    c.on('error', (e) => resolve(String(e)));
});

session.close();
console.log(JSON.stringify(out));
