// The official openai client with response_format: zodResponseFormat and
// beta.chat.completions.parse, a json_schema streamed, and the 400 of an
// unsupported keyword.  Prints one JSON object for t/76-openai-response-format.t.
import OpenAI from 'openai';
import { zodResponseFormat } from 'openai/helpers/zod';
import { z } from 'zod';

const [base] = process.argv.slice(2);
const client = new OpenAI({ baseURL: base, apiKey: 'none', maxRetries: 0 });
const messages = [{ role: 'user', content: 'A wise man' }];
const out = {};

const Item = z.object({
    color: z.enum(['red', 'green', 'blue']),
    count: z.number().int(),
    ok: z.boolean(),
    tags: z.array(z.enum(['a', 'b'])).max(2),
});
const rf = zodResponseFormat(Item, 'item');
out.schema = rf.json_schema.schema;

const c = await client.beta.chat.completions.parse({
    model: 'kjv', messages, response_format: rf, max_tokens: 200,
    temperature: 0,
});
out.parsed = c.choices[0].message.parsed;
out.content = c.choices[0].message.content;
out.finish = c.choices[0].finish_reason;

const schema = {
    type: 'object',
    properties: { answer: { enum: ['yes', 'no'] }, score: { type: 'integer' } },
    required: ['answer', 'score'], additionalProperties: false,
};
const stream = await client.chat.completions.create({
    model: 'kjv', messages, max_tokens: 100, temperature: 0, stream: true,
    response_format: { type: 'json_schema',
                       json_schema: { name: 'verdict', schema, strict: true } },
});
let text = '', chunks = 0;
for await (const ch of stream) {
    text += ch.choices[0]?.delta?.content ?? '';
    if (ch.choices[0]?.finish_reason) out.stream_finish = ch.choices[0].finish_reason;
    chunks++;
}
out.stream_text = text;
out.stream_chunks = chunks;

try {
    await client.chat.completions.create({
        model: 'kjv', messages, max_tokens: 4,
        response_format: { type: 'json_schema', json_schema: {
            name: 'bad', schema: { type: 'string', pattern: '(?=a)' } } },
    });
    out.error_status = 200;
} catch (e) {
    out.error_status = e.status;
    out.error_param = e.param;
    out.error_type = e.type;
    out.error_message = e.message;
}
console.log(JSON.stringify(out));
