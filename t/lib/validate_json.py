#!/usr/bin/python3
# Validates JSON lines {"schema": NAME, "output": TEXT} against the schemas
# of a JSON file of [{"name", "schema"}] (t/data/grammar/schemas.json,
# keywords.json), or {"schema_json": {...}, "output": ...}, with
# python3-jsonschema, an independent validator, formats asserted as draft
# 2020-12 defines them (uri by RFC 3986's grammar below where the rfc3987
# module is missing): prints one line per failure and, last,
# "checked N invalid M".
import copy
import json
import re
import sys

import jsonschema

checker = copy.deepcopy(jsonschema.Draft202012Validator.FORMAT_CHECKER)

if "uri" not in checker.checkers:
    # RFC 3986 section 3: URI = scheme ":" hier-part ["?" query]
    # ["#" fragment]
    UNRES = r"A-Za-z0-9\-._~"
    SUB = r"!$&'()*+,;="
    PCT = r"%[0-9A-Fa-f]{2}"
    PCHAR = r"(?:[%s%s:@]|%s)" % (UNRES, SUB, PCT)
    AUTH = (r"(?:(?:[%s%s:]|%s)*@)?(?:\[[0-9A-Fa-f:.]+\]|(?:[%s%s]|%s)*)"
            r"(?::[0-9]*)?" % (UNRES, SUB, PCT, UNRES, SUB, PCT))
    URI = re.compile(
        r"[A-Za-z][A-Za-z0-9+\-.]*:"
        r"(?://%s(?:/%s*)*|/(?:%s+(?:/%s*)*)?|%s+(?:/%s*)*|)"
        r"(?:\?(?:%s|[/?])*)?(?:#(?:%s|[/?])*)?"
        % (AUTH, PCHAR, PCHAR, PCHAR, PCHAR, PCHAR, PCHAR, PCHAR), re.ASCII)

    @checker.checks("uri")
    def is_uri(instance):
        return not isinstance(instance, str) or bool(URI.fullmatch(instance))

schemas = {e["name"]: e["schema"]
           for e in json.load(open(sys.argv[1]))}
n = bad = 0
for line in open(sys.argv[2]):
    if not line.strip():
        continue
    rec = json.loads(line)
    schema = rec.get("schema_json") or schemas[rec["schema"]]
    n += 1
    try:
        value = json.loads(rec["output"])
        jsonschema.validate(value, schema,
                            cls=jsonschema.Draft202012Validator,
                            format_checker=checker)
    except Exception as e:
        bad += 1
        print("invalid %s: %r: %s" % (rec.get("schema", "?"), rec["output"],
                                      str(e).splitlines()[0]))
print("checked %d invalid %d" % (n, bad))
