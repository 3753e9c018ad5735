// Headless Chromium (Debian's, driven by playwright-core) loads the
// playground, streams a completion and reads what the page shows.
// Usage: node playground.mjs URL PROMPT N SCREENSHOT; prints one JSON object.
import { chromium } from 'playwright-core';

const [url, prompt, n, shot] = process.argv.slice(2);
const executablePath = process.env.CHROMIUM || '/usr/bin/chromium';

const browser = await chromium.launch({
    executablePath,
    headless: true,
    args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'],
});
const out = { console: [] };

try {
    const page = await browser.newPage();
    // a backstop for a page that never loads, not a speed bound
    page.setDefaultTimeout(600000);
    page.on('console', (m) => out.console.push(m.type() + ': ' + m.text()));
    page.on('pageerror', (e) => out.console.push('pageerror: ' + e.message));

    await page.goto(url);
    await page.waitForSelector('#model option', { state: 'attached' });
    await page.fill('#prompt', prompt);
    await page.fill('#max_tokens', n);
    await page.fill('#temperature', '0');

    // sample the text while it streams: it must grow in steps (the limit
    // is a backstop for a page that never finishes, not a speed bound)
    const t0 = Date.now();
    await page.click('#run');
    out.samples = [];
    // the done check comes after a sample, so the stream's last pieces may
    // land between the two: one more sample once done is seen takes the
    // final text (the page marks done after the last piece is shown)
    const sample = async () => {
        const text = await page.textContent('#text').catch(() => null);
        if (text !== null && out.samples[out.samples.length - 1] !== text) {
            out.samples.push(text);
        }
    };
    while (Date.now() - t0 < 600000) {
        await sample();
        if (await page.$('#status[data-done="1"]')) {
            await sample();
            break;
        }
        await page.waitForTimeout(5);
    }

    out.reads = Number(await page.getAttribute('#output', 'data-reads'));
    out.text = await page.textContent('#text');
    out.usage = await page.textContent('#usage');
    out.status = await page.textContent('#status');
    await page.screenshot({ path: shot, fullPage: true });
} finally {
    await browser.close();
}

console.log(JSON.stringify(out));
