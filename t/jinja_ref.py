#!/usr/bin/python3
# The reference renderer for t/80-jinja-reference.t: Debian's python3-jinja2
# set up as Hugging Face's apply_chat_template sets it up
# (transformers' chat_template_utils): ImmutableSandboxedEnvironment with
# trim_blocks, lstrip_blocks and loopcontrols; tojson = json.dumps with
# ensure_ascii=False; globals raise_exception and strftime_now (here at a
# fixed time, as `nalar render --now` gives it, formatted in UTC); the
# variables messages, tools and documents (None when not given),
# add_generation_prompt, the special tokens, and the kwargs.
#
#   jinja_ref.py CASES.json  ->  one JSON result per case on stdout:
#   [{"ok": true, "text": ...} | {"ok": false, "raised": bool, "error": ...}]
import datetime
import json
import sys

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment


def make_template(source, now):
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None,
               sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                          separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        t = datetime.datetime.fromtimestamp(now, datetime.timezone.utc)
        return t.strftime(fmt)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True,
        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(source)


def render(case):
    with open(case["template"], encoding="utf-8") as f:
        source = f.read()
    try:
        t = make_template(source, case["now"])
        kwargs = dict(case.get("kwargs") or {})
        text = t.render(messages=case["messages"], tools=case.get("tools"),
                        documents=None,
                        add_generation_prompt=case["add_generation_prompt"],
                        bos_token=case.get("bos", ""),
                        eos_token=case.get("eos", ""), **kwargs)
        return {"ok": True, "text": text}
    except jinja2.exceptions.TemplateError as e:
        # raise_exception raises TemplateError itself; jinja2's own errors
        # are its subclasses
        return {"ok": False, "raised": type(e) is jinja2.exceptions.TemplateError,
                "error": str(e)}
    except Exception as e:      # TypeError and the like from Python
        return {"ok": False, "raised": False, "error": repr(e)}


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        cases = json.load(f)
    json.dump([render(c) for c in cases], sys.stdout, ensure_ascii=True)


main()
