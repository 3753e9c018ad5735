#!/usr/bin/python3
# Random small templates for t/82-jinja-random.t: expressions and
# statements drawn from what chat templates use (filters, tests, methods,
# operators, slices, loops, whitespace control), over fixed variables.
# Deterministic for a seed.  Slices are taken of variables only: jinja2
# folds constant expressions at compile time, where a failing subscript
# quietly becomes undefined instead of failing as it does at run time.
#
#   jinja_gen.py SEED COUNT DIR  ->  DIR/t*.jinja and DIR/cases.json
import json
import os
import random
import sys

ATOMS = ["messages", "messages[0]", "messages[0].content", "messages[1]['role']",
         "x", "none", "true", "false", "1", "0", "-2", "2.5", "'a b'", "\"Q\\\"q\"",
         "''", "[1, 'x', none]", "{'k': 'v', 'n': 2}", "(1, 2)", "tools",
         "tools[0].function.name", "ns.v", "loop.index", "'  pad '",
         "'<|im_end|>'", "range(3)", "1e5", "3.0", "messages[0].content|trim"]
VARS = ["messages", "messages[0].content", "messages[1]['role']", "tools", "ns.v"]
FILTERS = ["trim", "length", "upper", "lower", "tojson", "tojson(indent=2)",
           "first", "last", "list", "string", "default('d')", "default('e', true)",
           "join(',')", "replace('a', 'Z')", "indent(2)", "int", "float",
           "capitalize", "title", "unique|list", "sort", "reverse|list", "abs",
           "items|list", "safe", "e", "count",
           "selectattr('role', 'equalto', 'user')|list",
           "map(attribute='role')|list", "reject('none')|list", "sum", "max"]
TESTS = ["defined", "none", "string", "mapping", "iterable", "sequence", "number",
         "integer", "float", "boolean", "true", "false", "odd", "even", "undefined",
         "equalto 1", "in [1, 2]", "lt 3", "callable"]
OPS = ["+", "-", "*", "/", "//", "%", "~", "==", "!=", "<", ">=", "in", "not in",
       "and", "or"]
METHODS = ["strip()", "split()", "split(' ')", "upper()", "startswith('a')",
           "endswith('b')", "replace('a','b')", "items()", "keys()", "values()",
           "get('role')", "get('nope', 5)", "lower()", "title()", "find('a')"]


def expr(r, d=0):
    x = r.random()
    if d > 3 or x < 0.3:
        return r.choice(ATOMS)
    if x < 0.45:
        return expr(r, d + 1) + "|" + r.choice(FILTERS)
    if x < 0.55:
        return expr(r, d + 1) + " is " + r.choice(["", "not "]) + r.choice(TESTS)
    if x < 0.7:
        return "(%s %s %s)" % (expr(r, d + 1), r.choice(OPS), expr(r, d + 1))
    if x < 0.78:
        return "(%s).%s" % (expr(r, d + 1), r.choice(METHODS))
    if x < 0.84:
        return "(%s if %s else %s)" % (expr(r, d + 1), expr(r, d + 1), expr(r, d + 1))
    if x < 0.9:
        return "not " + expr(r, d + 1)
    if x < 0.95:
        return "(%s)[%s]" % (r.choice(VARS), r.choice(
            ["0", "-1", "1:", "::-1", ":2", "'role'", "'content'"]))
    return "[%s, %s]" % (expr(r, d + 1), expr(r, d + 1))


def stmt(r, d=0):
    ws = ["", "-"]
    x = r.random()
    if d > 2 or x < 0.35:
        return "{{%s %s %s}}" % (r.choice(ws), expr(r), r.choice(ws))
    if x < 0.45:
        return r.choice(["text", " sp ", "\n", "  \n  ", "\t", "a\nb"])
    if x < 0.6:
        return "{%% if %s %%}%s{%% else %%}%s{%% endif %%}" % (
            expr(r), body(r, d + 1), body(r, d + 1))
    if x < 0.72:
        return ("{%%%s for it in %s %%}%s{{ loop.index }}{%% if loop.last %%}L"
                "{%% endif %%}{%% else %%}E{%%%s endfor %%}") % (
            r.choice(ws), expr(r), body(r, d + 1), r.choice(ws))
    if x < 0.8:
        return "{%% set ns.v = %s %%}" % expr(r)
    if x < 0.86:
        return "\n  {%% if %s %%}\n  %s\n  {%% endif %%}\n" % (expr(r), body(r, d + 1))
    if x < 0.92:
        return "{# c #}" + body(r, d + 1)
    return "{%% set y = %s %%}{{ y }}" % expr(r)


def body(r, d=0):
    return "".join(stmt(r, d) for _ in range(r.randint(1, 3)))


def main():
    seed, count, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    r = random.Random(seed)
    os.makedirs(out, exist_ok=True)
    msgs = [{"role": "user", "content": " hi <b> "},
            {"role": "assistant", "content": "ok"}]
    tools = [{"type": "function", "function": {
        "name": "f", "description": "d",
        "parameters": {"type": "object", "properties": {}}}}]
    cases = []
    for i in range(count):
        path = os.path.join(out, "t%d.jinja" % i)
        with open(path, "w", encoding="utf-8") as f:
            f.write("{% set ns = namespace(v=0) %}" + body(r))
        cases.append({"template": path, "messages": msgs, "tools": tools,
                      "kwargs": {}, "add_generation_prompt": True,
                      "bos": "<s>", "eos": "</s>", "now": 0})
    with open(os.path.join(out, "cases.json"), "w", encoding="utf-8") as f:
        json.dump(cases, f)


main()
