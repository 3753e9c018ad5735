#!/usr/bin/env python3
"""Writes fuzz/corpus/grammar: the seeds of fuzz_grammar.  Byte 0 of a seed
is '0' (even: the rest is schema text) or '1' (odd: the rest is choices for
a generated schema).  The schema seeds are the ten test schemas
(t/data/grammar/schemas.json) and every hostile schema of the trial the
grammar was hardened against: nested objects 20-32 deep, an enum of 200
strings, a type list of 1000 "null"s, an anyOf chain with 2^18 paths, 100
tools' call schema, tool parameters 24 deep, 10k required properties, left
recursion ({"anyOf":[{"$ref":"#"},{"$ref":"#"}]}, a -> b -> a), a bare
{"$ref":"#"} and recursion that never ends.

    python3 fuzz/gen_grammar_seeds.py   (from the repository root)
"""
import json
import os
import random

out = 'fuzz/corpus/grammar'
os.makedirs(out, exist_ok=True)


def put(name, schema):
    txt = schema if isinstance(schema, str) else \
        json.dumps(schema, separators=(',', ':'))
    with open(os.path.join(out, name), 'wb') as f:
        f.write(b'0' + txt.encode())


def nested(depth, leaf=None):
    s = leaf or {'type': 'integer'}
    for _ in range(depth):
        s = {'type': 'object', 'properties': {'a': s}, 'required': ['a']}
    return s


for i, e in enumerate(json.load(open('t/data/grammar/schemas.json'))):
    put('test-%s' % e['name'], e['schema'])
for d in (20, 24, 32):
    put('nested-%d' % d, nested(d))
put('enum-200', {'enum': ['s%d' % i for i in range(200)]})
put('types-null-1000', {'type': ['null'] * 1000})
defs = {'d%d' % i: {'anyOf': [{'$ref': '#/$defs/d%d' % (i + 1)}] * 2}
        for i in range(18)}
defs['d18'] = {'type': 'integer'}
put('anyof-chain-2-18', {'$defs': defs, '$ref': '#/$defs/d0'})
put('tools-100', {'anyOf': [
    {'type': 'object',
     'properties': {'name': {'const': 'tool_%d' % i},
                    'arguments': {'type': 'object',
                                  'properties': {'x': {'type': 'integer'}},
                                  'required': ['x']}},
     'required': ['name', 'arguments']} for i in range(100)]})
put('tool-params-24', {'type': 'object',
                       'properties': {'name': {'const': 'deep'},
                                      'arguments': nested(24)},
                       'required': ['name', 'arguments']})
put('required-10k', {'type': 'object',
                     'properties': {'p%d' % i: {'type': 'boolean'}
                                    for i in range(10000)},
                     'required': ['p%d' % i for i in range(10000)]})
put('left-rec-anyof', '{"anyOf":[{"$ref":"#"},{"$ref":"#"}]}')
put('ref-self', '{"$ref":"#"}')
put('left-rec-a-b-a', {'$defs': {'a': {'$ref': '#/$defs/b'},
                                 'b': {'anyOf': [{'type': 'null'},
                                                 {'$ref': '#/$defs/a'}]}},
                       '$ref': '#/$defs/a'})
put('endless-object', {'type': 'object', 'properties': {'a': {'$ref': '#'}},
                       'required': ['a']})
put('recursive-array', {'anyOf': [{'type': 'null'},
                                  {'type': 'array', 'items': {'$ref': '#'}}]})
rnd = random.Random(1)
for i in range(8):
    with open(os.path.join(out, 'gen-%d' % i), 'wb') as f:
        f.write(b'1' + bytes(rnd.randrange(256) for _ in range(64)))
