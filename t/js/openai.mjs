// The official OpenAI Node.js client against the nginx module: completions
// and chat completions, streamed and not, /v1/models, /v1/models/{id} and
// errors.
// Usage: node openai.mjs BASE_URL PROMPT N; prints one JSON object.
import OpenAI from 'openai';

const [base, prompt, n] = process.argv.slice(2);
const max_tokens = Number(n);
const client = new OpenAI({ baseURL: base, apiKey: 'sk-none', maxRetries: 0 });
const out = {};

// ignore_eos is the server's extension (as vLLM's); the client passes it on
const common = { model: 'kjv', max_tokens, temperature: 0, ignore_eos: true };

const c = await client.completions.create({ ...common, prompt });
out.completion = c.choices[0].text;
out.completion_finish = c.choices[0].finish_reason;
out.completion_object = c.object;
out.usage = c.usage;

const s = await client.completions.create({
    ...common, prompt, stream: true, stream_options: { include_usage: true },
});
out.completion_stream = '';
out.completion_chunks = 0;
for await (const chunk of s) {
    if (chunk.choices.length) {
        out.completion_stream += chunk.choices[0].text;
        out.completion_chunks++;
    } else {
        out.stream_usage = chunk.usage;
    }
}

const messages = [{ role: 'user', content: prompt }];

const cc = await client.chat.completions.create({ ...common, messages });
out.chat = cc.choices[0].message.content;
out.chat_object = cc.object;

const cs = await client.chat.completions.create({
    ...common, messages, stream: true,
});
out.chat_stream = '';
for await (const chunk of cs) {
    out.chat_stream += chunk.choices[0]?.delta?.content ?? '';
}

const models = await client.models.list();
out.models = models.data.map((m) => m.id);

const model = await client.models.retrieve('kjv');
out.model = { id: model.id, object: model.object, owned_by: model.owned_by,
              created: model.created };

try {
    await client.models.retrieve('nope');
    out.retrieve_error_status = 0;
} catch (e) {
    out.retrieve_error_status = e.status;
    out.retrieve_error_code = e.code;
    out.retrieve_error_type = e.type;
}

try {
    await client.completions.create({ model: 'nope', prompt: 'x' });
    out.error_status = 0;
} catch (e) {
    out.error_status = e.status;
    out.error_code = e.code;
    out.error_type = e.type;
    out.error_param = e.param;
}

console.log(JSON.stringify(out));
