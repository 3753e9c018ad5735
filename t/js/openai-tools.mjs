// A tools round trip with the official OpenAI Node.js client: a call the
// model must make (tool_choice "required"), the tool's answer sent back as
// a `role: "tool"` message, then the final message; once not streamed and
// once streamed (the stream's deltas assembled as a client does).
// Usage: node openai-tools.mjs BASE_URL MODEL SEED; prints one JSON object.
import OpenAI from 'openai';

const [base, model, seed] = process.argv.slice(2);
const client = new OpenAI({ baseURL: base, apiKey: 'sk-none', maxRetries: 0 });

const tools = [
    {
        type: 'function',
        function: {
            name: 'get_weather',
            description: 'The weather in a city',
            parameters: {
                type: 'object',
                properties: {
                    city: { type: 'string', maxLength: 12 },
                    unit: { type: 'string', enum: ['celsius', 'fahrenheit'] },
                },
                required: ['city', 'unit'],
                additionalProperties: false,
            },
        },
    },
    {
        type: 'function',
        function: {
            name: 'get_time',
            parameters: {
                type: 'object',
                properties: { zone: { type: 'integer' } },
                required: ['zone'],
                additionalProperties: false,
            },
        },
    },
];

const common = { model, temperature: 1, seed: Number(seed), max_tokens: 400 };
const question = [{ role: 'user', content: 'What is the weather in Paris?' }];
const out = { tools };

// the answer of the tool, and the conversation that goes on with it
function followUp(message, call) {
    return [
        ...question,
        message,
        { role: 'tool', tool_call_id: call.id, content: '{"temperature": 21}' },
    ];
}

// not streamed
const first = await client.chat.completions.create({
    ...common, messages: question, tools, tool_choice: 'required',
});
const msg = first.choices[0].message;
out.call = {
    finish_reason: first.choices[0].finish_reason,
    content: msg.content,
    tool_calls: msg.tool_calls,
};

const final = await client.chat.completions.create({
    ...common, messages: followUp(msg, msg.tool_calls[0]), tools,
    tool_choice: 'none', max_tokens: 8,
});
out.final = {
    finish_reason: final.choices[0].finish_reason,
    content: final.choices[0].message.content,
    tool_calls: final.choices[0].message.tool_calls ?? null,
};

// streamed: the chunks as they came, and the message they make
const s = await client.chat.completions.create({
    ...common, messages: question, tools, tool_choice: 'required',
    stream: true,
});
const chunks = [];
const calls = [];
let finish = null;
let role = null;
for await (const chunk of s) {
    const c = chunk.choices[0];
    if (!c) {
        continue;
    }
    chunks.push(c);
    role = role ?? c.delta?.role ?? null;
    for (const d of c.delta?.tool_calls ?? []) {
        if (!calls[d.index]) {
            calls[d.index] = { id: d.id, type: d.type,
                               function: { name: d.function?.name,
                                           arguments: '' } };
        }
        calls[d.index].function.arguments += d.function?.arguments ?? '';
    }
    finish = c.finish_reason ?? finish;
}
out.stream = { role, finish_reason: finish, tool_calls: calls, chunks };

const smsg = { role: 'assistant', content: null, tool_calls: calls };
const sfinal = await client.chat.completions.create({
    ...common, messages: followUp(smsg, calls[0]), tools,
    tool_choice: 'none', max_tokens: 8, stream: true,
});
out.stream_final = { content: '', finish_reason: null };
for await (const chunk of sfinal) {
    const c = chunk.choices[0];
    out.stream_final.content += c?.delta?.content ?? '';
    out.stream_final.finish_reason = c?.finish_reason
                                     ?? out.stream_final.finish_reason;
}

// an unknown function named in tool_choice
try {
    await client.chat.completions.create({
        ...common, messages: question, tools,
        tool_choice: { type: 'function', function: { name: 'get_mood' } },
    });
    out.error_status = 0;
} catch (e) {
    out.error_status = e.status;
    out.error_param = e.param;
    out.error_message = e.message;
}

console.log(JSON.stringify(out));
