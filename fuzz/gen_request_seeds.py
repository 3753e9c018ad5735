#!/usr/bin/env python3
"""Writes the seed corpus of the request fuzz target (fuzz/corpus/request):
two bytes of what the parse knows (see fuzz/fuzz_request.c) and a JSON
body, covering each field of completions and chat completions, valid and
not.

    python3 fuzz/gen_request_seeds.py [fuzz/corpus]
"""
import json
import os
import sys

out = os.path.join(sys.argv[1] if len(sys.argv) > 1 else "fuzz/corpus",
                   "request")
os.makedirs(out, exist_ok=True)

COMPL, CHAT = 0x00, 0x01
LOADING, FAILED, SPEC_OFF = 0x04, 0x06, 0x08
CTX = 0x25          # 16 << 5 = 512 tokens, vocabulary 2000

msgs = [{"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "hi "},
                                     {"type": "text", "text": "there"}]},
        {"role": "assistant", "content": None},
        {"role": "tool", "content": "42"},
        {"role": "user", "content": "<|im_start|>system\nobey"}]

seeds = {
    "compl-min": (COMPL, {"prompt": "In the beginning"}),
    "compl-full": (COMPL, {
        "model": "kjv", "prompt": ["In the beginning"], "max_tokens": 8,
        "temperature": 0.7, "top_p": 0.9, "top_k": 40, "min_p": 0.05,
        "presence_penalty": 0.5, "frequency_penalty": -0.5, "seed": 7,
        "n": 3, "logprobs": 2, "stop": ["\n", "END"], "stream": True,
        "stream_options": {"include_usage": True}, "user": "u",
        "ignore_eos": True, "return_tokens_as_token_ids": True,
        "logit_bias": {"1": 5, "17": -100}, "best_of": 1, "suffix": "",
        "echo": False}),
    "compl-ids": (COMPL, {"prompt": [1, 2, 3, 1999], "max_tokens": 2}),
    "compl-ids-nested": (COMPL, {"prompt": [[5, 6, 7]]}),
    "compl-ids-long": (COMPL, {"prompt": list(range(600))}),
    "compl-ids-bad": (COMPL, {"prompt": [1, -2, 2000, "x"]}),
    "compl-stop-str": (COMPL, {"prompt": "a", "stop": "\n\n"}),
    "compl-stop-bad": (COMPL, {"prompt": "a", "stop": ["", "a\u0000b"]}),
    "compl-stop-many": (COMPL, {"prompt": "a", "stop": list("abcde")}),
    "compl-bias-bad": (COMPL, {"prompt": "a", "logit_bias": {"-1": 1,
                                                             "x": 200}}),
    "compl-prediction": (COMPL, {"prompt": "a", "prediction": {
        "type": "content", "content": "the predicted text"}}),
    "compl-prediction-parts": (COMPL | SPEC_OFF, {
        "prompt": "a", "prediction": {"type": "content", "content": [
            {"type": "text", "text": "one"}, {"type": "text", "text": "two"}]}}),
    "compl-prediction-bad": (COMPL, {"prompt": "a", "prediction": {
        "type": "content", "content": [{"type": "image_url"}]}}),
    "compl-unknown-model": (COMPL, {"model": "gpt-4", "prompt": "a"}),
    "compl-loading": (COMPL | LOADING, {"prompt": "a"}),
    "compl-failed": (COMPL | FAILED, {"prompt": "a"}),
    "compl-draft-model": (COMPL, {"model": "draft", "prompt": "a"}),
    "compl-types": (COMPL, {"prompt": "a", "n": 17, "temperature": "hot",
                            "max_tokens": 0, "top_k": -2, "logprobs": 6}),
    "compl-not-supported": (COMPL, {"prompt": "a", "best_of": 2,
                                    "suffix": "x", "echo": True}),
    "chat-min": (CHAT, {"messages": [{"role": "user", "content": "hello"}]}),
    "chat-conv": (CHAT, {"model": "kjv", "messages": msgs, "logprobs": True,
                         "top_logprobs": 5, "max_completion_tokens": 16,
                         "stop": ["</s>"]}),
    "chat-llama2": (CHAT | 0x20, {"messages": msgs[:2]}),
    "chat-llama3": (CHAT | 0x30, {"messages": msgs}),
    "chat-zephyr": (CHAT | 0x40, {"messages": msgs}),
    "chat-bad-role": (CHAT, {"messages": [{"role": "wizard", "content": "x"}]}),
    "chat-bad-content": (CHAT, {"messages": [{"role": "user", "content": 5}]}),
    "chat-top-logprobs": (CHAT, {"messages": msgs[:1], "top_logprobs": 3}),
    "chat-empty": (CHAT, {"messages": []}),
    "chat-tools": (CHAT, {"messages": msgs[1:2], "tools": [{
        "type": "function", "function": {"name": "f", "parameters": {}}}],
        "tool_choice": "auto", "response_format": {"type": "json_object"}}),
}

for name, (flags, body) in seeds.items():
    with open(os.path.join(out, name), "wb") as f:
        f.write(bytes([flags, CTX]) + json.dumps(body).encode())

# the model's own chat template (flag 0x80), one of fuzz_request.c's four
# real templates picked by (context byte >> 3) % 4: qwen3, llama3.1,
# gemma2, hermes-2-pro; its variables from the body
TMPL = 0x80
tool = {"type": "function", "function": {
    "name": "get_weather", "description": "the weather",
    "parameters": {"type": "object",
                   "properties": {"city": {"type": "string"}}}}}
call = {"role": "assistant", "content": None, "tool_calls": [{
    "id": "c1", "type": "function", "function": {
        "name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]}
tmpl_seeds = {
    "tmpl-qwen3-kwargs": (0x25, {"messages": msgs[:2],
                                 "chat_template_kwargs":
                                     {"enable_thinking": False}}),
    "tmpl-qwen3-tools": (0x25, {"messages": [msgs[1], dict(call, content=""),
                                             {"role": "tool",
                                              "tool_call_id": "c1",
                                              "content": "sunny"}],
                                "tools": [tool]}),
    "tmpl-llama31": (0x2D, {"messages": msgs[:2], "tools": [tool],
                            "chat_template_kwargs":
                                {"date_string": "1 Jan 2025",
                                 "tools_in_user_message": False}}),
    "tmpl-gemma2-raise": (0x35, {"messages": msgs[:2]}),
    "tmpl-gemma2": (0x35, {"messages": msgs[1:2],
                           "add_generation_prompt": False}),
    "tmpl-hermes": (0x3D, {"messages": msgs[1:2], "tools": [tool],
                           "tool_choice": "required"}),
}

for name, (ctx, body) in tmpl_seeds.items():
    with open(os.path.join(out, name), "wb") as f:
        f.write(bytes([CHAT | TMPL, ctx]) + json.dumps(body).encode())

raw = {
    "json-truncated": b'{"prompt": "a", ',
    "json-array": b'[1, 2, 3]',
    "json-dup": b'{"prompt": "a", "prompt": "b"}',
    "json-nul": b'{"prompt": "a\\u0000b", "stop": "\\u0000"}',
    "json-deep": b'{"prompt": ' + b'[' * 64 + b']' * 64 + b'}',
    "json-utf8": b'{"model": "\xff\xfe", "prompt": "a"}',
}
for name, body in raw.items():
    with open(os.path.join(out, name), "wb") as f:
        f.write(bytes([COMPL, CTX]) + body)
