// Traffic for bench/soak.sh: mixed requests against one nginx for a fixed
// time, in busy/idle cycles, then one JSON summary on stdout.
//
//   node bench/soak.mjs ref H1_ORIGIN H2_ORIGIN MODEL OUT.json
//       collects the reference answers, each request alone, one at a time
//   node bench/soak.mjs run H1_ORIGIN H2_ORIGIN MODEL REF.json SECONDS
//       [LOOPS] [BUSY_S] [IDLE_S]
//
// The traffic: LOOPS client loops (a third over one HTTP/2 connection with
// prior knowledge, the rest over HTTP/1.1 keep-alive), each request from
// one of three tenants (X-Tenant), one of:
//   - a greedy request (temperature 0; completions or chat, streamed or
//     not) whose answer is compared with the reference collected alone;
//   - a streamed request abandoned after a few events (HTTP/1.1: the
//     socket is destroyed; HTTP/2: RST_STREAM CANCEL);
//   - a sampled request (temperature 0.9), its answer not compared.
// Every BUSY_S seconds the loops stop, every request ends, and an idle
// point waits (up to IDLE_S + 30 s) for /metrics to show nothing running
// or waiting and every KV block free.  503s (a worker loading after a
// reload) and connection errors (a worker retiring) are counted, not
// failures.  Everything is bounded: the run ends after SECONDS.
import http from 'node:http';
import http2 from 'node:http2';
import fs from 'node:fs';

const [mode, h1origin, h2origin, model, file, secs, loopsArg, busyArg,
       idleArg] = process.argv.slice(2);
const agent = new http.Agent({ keepAlive: true, maxSockets: 64 });
const TENANTS = ['tenant-a', 'tenant-b', 'tenant-c'];

// prompts: a long shared opening (prefix-cache hits within a tenant) with
// different endings, and short ones
const OPEN = 'In the beginning God created the heaven and the earth. And the '
    + 'earth was without form, and void; and darkness was upon the face of '
    + 'the deep. And the Spirit of God moved upon the face of the waters. ';
const PROMPTS = [
    OPEN + 'And God said,', OPEN + 'And the evening', OPEN + 'Let there be',
    'And it came to pass', 'A wise man', 'The LORD is my shepherd',
    'Blessed are the meek, for', 'Now the serpent was more subtil than',
];
const CHATS = [
    [{ role: 'user', content: 'Who made the heaven and the earth?' }],
    [{ role: 'system', content: 'Answer in the words of the King James '
                               + 'Bible.' },
     { role: 'user', content: 'What is love?' }],
    [{ role: 'user', content: 'Tell me of the flood.' }],
];
const MAX_TOKENS = [12, 48];

// the greedy cases: [key, path, body]
function cases() {
    const out = [];
    PROMPTS.forEach((p, i) => MAX_TOKENS.forEach((n) => out.push(
        [`c${i}/${n}`, '/v1/completions',
         { model, prompt: p, max_tokens: n, temperature: 0 }])));
    CHATS.forEach((m, i) => MAX_TOKENS.forEach((n) => out.push(
        [`chat${i}/${n}`, '/v1/chat/completions',
         { model, messages: m, max_tokens: n, temperature: 0 }])));
    return out;
}

function textOf(path, j) {
    const c = j.choices[0];
    return path.includes('chat') ? (c.message ? c.message.content
                                              : c.delta.content || '')
                                 : c.text;
}

// the text of an SSE body (every data: event's choice text), or null
function sseText(path, body) {
    let text = '', done = false;
    for (const block of body.split('\n\n')) {
        const m = /^data: (.*)$/s.exec(block);
        if (!m) continue;
        if (m[1] === '[DONE]') { done = true; continue; }
        const j = JSON.parse(m[1]);
        if (j.error) return null;
        if (j.choices && j.choices.length) text += textOf(path, j) || '';
    }
    return done ? text : null;
}

// --- one request, HTTP/1.1 or HTTP/2; resolves { status, body, aborted,
// err }; abortAfter: abandon after that many data: events ---

function req1(path, body, tenant, abortAfter) {
    return new Promise((resolve) => {
        const data = JSON.stringify(body);
        const r = http.request(h1origin + path, {
            method: 'POST', agent,
            headers: { 'content-type': 'application/json',
                       'content-length': Buffer.byteLength(data),
                       'x-tenant': tenant },
        }, (res) => {
            let text = '', events = 0;
            res.setEncoding('utf8');
            res.on('data', (d) => {
                text += d;
                events += (d.match(/^data: /mg) || []).length;
                if (abortAfter && events >= abortAfter) {
                    r.destroy();
                    resolve({ status: res.statusCode, aborted: true });
                }
            });
            res.on('end', () => resolve({ status: res.statusCode,
                                          body: text }));
            res.on('error', (e) => resolve({ err: String(e) }));
        });
        r.on('error', (e) => resolve({ err: String(e) }));
        r.setTimeout(120000, () => { r.destroy(new Error('timeout')); });
        r.end(data);
    });
}

let session = null;

function h2session() {
    if (session && !session.closed && !session.destroyed) return session;
    session = http2.connect(h2origin);
    session.on('error', () => {});
    session.on('goaway', () => { session = null; });
    session.on('close', () => { session = null; });
    return session;
}

function req2(path, body, tenant, abortAfter) {
    return new Promise((resolve) => {
        const data = JSON.stringify(body);
        let s, status = 0, text = '', events = 0, over = false;
        const end = (v) => { if (!over) { over = true; resolve(v); } };
        try {
            s = h2session().request({
                ':method': 'POST', ':path': path,
                'content-type': 'application/json',
                'content-length': Buffer.byteLength(data),
                'x-tenant': tenant,
            });
        } catch (e) {
            session = null;
            return end({ err: String(e) });
        }
        s.setEncoding('utf8');
        s.setTimeout(120000, () => s.close(http2.constants.NGHTTP2_CANCEL));
        s.on('response', (h) => { status = h[':status']; });
        s.on('data', (d) => {
            text += d;
            events += (d.match(/^data: /mg) || []).length;
            if (abortAfter && events >= abortAfter && !over) {
                s.close(http2.constants.NGHTTP2_CANCEL);
                end({ status, aborted: true });
            }
        });
        s.on('end', () => end({ status, body: text }));
        s.on('close', () => end(status ? { status, body: text }
                                       : { err: 'stream closed' }));
        s.on('error', (e) => end({ err: String(e) }));
        s.end(data);
    });
}

function get(path) {
    return new Promise((resolve) => {
        const r = http.get(h1origin + path, { agent }, (res) => {
            let t = '';
            res.setEncoding('utf8');
            res.on('data', (d) => { t += d; });
            res.on('end', () => resolve(t));
            res.on('error', () => resolve(''));
        });
        r.on('error', () => resolve(''));
        r.setTimeout(10000, () => r.destroy());
    });
}

function metric(text, name) {
    const m = new RegExp(`^${name}\\{model="${model}"\\} (\\S+)$`, 'm')
        .exec(text);
    return m ? Number(m[1]) : null;
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// --- ref: every greedy case alone, non-streamed, retried through 503 ---

async function collectRefs() {
    const ref = {};
    for (const [key, path, body] of cases()) {
        for (let i = 0; i < 600; i++) {
            const r = await req1(path, body, TENANTS[0], 0);
            if (r.status === 200) {
                ref[key] = textOf(path, JSON.parse(r.body));
                break;
            }
            await sleep(100);
        }
        if (ref[key] === undefined) {
            console.error(`soak.mjs: no reference answer for ${key}`);
            process.exit(1);
        }
    }
    fs.writeFileSync(file, JSON.stringify(ref, null, 1));
}

// --- run ---

const stats = {
    requests: 0, greedy: 0, greedy_checked: 0, mismatches: [],
    aborted: 0, sampled: 0, h2_requests: 0, h2_cancels: 0, status: {},
    errors: {}, idle_points: [],
};

async function count(r) {
    stats.requests++;
    if (r.status === 503) {
        // a worker loading after a reload: Retry-After, roughly
        await sleep(250);
    }
    if (r.err) {
        const k = r.err.replace(/\d+/g, 'N').slice(0, 60);
        stats.errors[k] = (stats.errors[k] || 0) + 1;
    } else {
        stats.status[r.status] = (stats.status[r.status] || 0) + 1;
    }
}

async function one(ref, all, h2) {
    const send = h2 ? req2 : req1;
    const tenant = TENANTS[Math.floor(Math.random() * 3)];
    const x = Math.random();

    if (h2) stats.h2_requests++;

    if (x < 0.55) {
        const [key, path, body0] = all[Math.floor(Math.random()
                                                  * all.length)];
        const stream = Math.random() < 0.5;
        const body = stream ? { ...body0, stream: true } : body0;
        const r = await send(path, body, tenant, 0);
        await count(r);
        stats.greedy++;
        if (r.status !== 200 || r.body === undefined) return;
        const got = stream ? sseText(path, r.body)
                           : textOf(path, JSON.parse(r.body));
        if (got === null) {
            stats.errors['stream ended without [DONE]'] =
                (stats.errors['stream ended without [DONE]'] || 0) + 1;
            return;
        }
        stats.greedy_checked++;
        if (got !== ref[key]) {
            stats.mismatches.push({ key, tenant, stream, h2, got,
                                    want: ref[key] });
        }
    } else if (x < 0.8) {
        const p = PROMPTS[Math.floor(Math.random() * PROMPTS.length)];
        const r = await send('/v1/completions',
                             { model, prompt: p, max_tokens: 200,
                               temperature: 0, ignore_eos: true,
                               stream: true }, tenant,
                             1 + Math.floor(Math.random() * 8));
        await count(r);
        if (r.aborted) stats.aborted++;
        if (r.aborted && h2) stats.h2_cancels++;
    } else {
        const p = PROMPTS[Math.floor(Math.random() * PROMPTS.length)];
        const r = await send('/v1/completions',
                             { model, prompt: p, max_tokens: 32,
                               temperature: 0.9,
                               stream: Math.random() < 0.5 }, tenant, 0);
        await count(r);
        stats.sampled++;
    }
}

async function idlePoint(t0, idleS) {
    const until = Date.now() + (idleS + 30) * 1000;
    const pt = { t: Math.round((Date.now() - t0) / 1000) };

    for (;;) {
        const m = await get('/metrics');
        pt.running = metric(m, 'nalar_requests_running');
        pt.waiting = metric(m, 'nalar_requests_waiting');
        pt.kv_free = metric(m, 'nalar_kv_blocks_free');
        pt.kv_total = metric(m, 'nalar_kv_blocks_capacity');
        pt.ok = pt.running === 0 && pt.waiting === 0 && pt.kv_total > 0
                && pt.kv_free === pt.kv_total;
        if (pt.ok || Date.now() > until) break;
        await sleep(200);
    }
    pt.waited_s = Math.round((Date.now() - t0) / 1000) - pt.t;
    stats.idle_points.push(pt);
    // the rest of the idle time, nothing sent
    const rest = idleS * 1000 - pt.waited_s * 1000;
    if (rest > 0) await sleep(rest);
}

async function run() {
    const ref = JSON.parse(fs.readFileSync(file, 'utf8'));
    const all = cases();
    const total = Number(secs) * 1000;
    const loops = Number(loopsArg || 6);
    const busy = Number(busyArg || 45) * 1000;
    const idleS = Number(idleArg || 15);
    const t0 = Date.now();

    // whatever happens, stop
    setTimeout(() => {
        stats.hard_stop = true;
        console.log(JSON.stringify(stats));
        process.exit(1);
    }, total + 300000).unref();

    while (Date.now() - t0 < total) {
        const phaseEnd = Math.min(Date.now() + busy, t0 + total);
        const workers = [];
        for (let i = 0; i < loops; i++) {
            workers.push((async () => {
                while (Date.now() < phaseEnd) {
                    await one(ref, all, i % 3 === 2);
                }
            })());
        }
        await Promise.all(workers);
        await idlePoint(t0, idleS);
    }
    if (session) session.close();
    agent.destroy();
    console.log(JSON.stringify(stats));
}

if (mode === 'ref') {
    await collectRefs();
    agent.destroy();
} else {
    await run();
}
