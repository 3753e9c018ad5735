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

    // every text the page shows while it streams, recorded in the page by
    // a MutationObserver (each change of the output, delivered before the
    // page reads the stream's next piece), so what is seen does not hang
    // on how fast this script polls: it must grow in steps
    await page.evaluate(() => {
        window.nalarTexts = [];
        new MutationObserver(() => {
            const text = document.getElementById('text');
            const seen = window.nalarTexts;

            if (text !== null && seen[seen.length - 1] !== text.textContent) {
                seen.push(text.textContent);
            }
        }).observe(document.getElementById('output'),
                   { childList: true, subtree: true, characterData: true });
    });
    await page.click('#run');
    // wait for the page to say done (the page marks done after the last
    // piece is shown); the limit is a backstop, not a speed bound
    await page.waitForSelector('#status[data-done="1"]',
                               { state: 'attached', timeout: 600000 });
    out.samples = await page.evaluate(() => window.nalarTexts);

    out.reads = Number(await page.getAttribute('#output', 'data-reads'));
    out.text = await page.textContent('#text');
    out.usage = await page.textContent('#usage');
    out.status = await page.textContent('#status');
    await page.screenshot({ path: shot, fullPage: true });
} finally {
    await browser.close();
}

console.log(JSON.stringify(out));
