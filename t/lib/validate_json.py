#!/usr/bin/python3
# Validates JSON lines {"schema": NAME, "output": TEXT} against the schemas
# of t/data/grammar/schemas.json (or {"schema_json": {...}, "output": ...})
# with python3-jsonschema, an independent validator: prints one line per
# failure and, last, "checked N invalid M".
import json
import sys

import jsonschema

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
                            format_checker=jsonschema.FormatChecker())
    except Exception as e:
        bad += 1
        print("invalid %s: %r: %s" % (rec.get("schema", "?"), rec["output"],
                                      str(e).splitlines()[0]))
print("checked %d invalid %d" % (n, bad))
