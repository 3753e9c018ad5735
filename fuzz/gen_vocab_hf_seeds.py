#!/usr/bin/env python3
"""Writes the seed corpus of the Hugging Face tokenizer conversion fuzz
target (fuzz/corpus/vocab_hf): small tokenizer.json files of each kind
src/vocab_hf.c converts (byte-level BPE with the Llama 3, Qwen2, DeepSeek
V3 and GPT-2 pre-tokenizers; BPE over "\u2581" with byte fallback) and of
kinds it refuses, with and without a tokenizer_config.json.  The input
layout is described at the top of fuzz/fuzz_vocab_hf.c: an options byte
(bit 0 skip_template, bit 1 a config), tokenizer.json, and with bit 1 a
0x00 byte and tokenizer_config.json.

    python3 fuzz/gen_vocab_hf_seeds.py [fuzz/corpus]
"""
import json
import os
import sys

out = sys.argv[1] if len(sys.argv) > 1 else "fuzz/corpus"

QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
         r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3 = QWEN2.replace(r"|\p{N}|", r"|\p{N}{1,3}|")
DSV3 = [r"\p{N}{1,3}",
        "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
        "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|"
        "[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|"
        "\\s*[\r\n]+|\\s+(?!\\S)|\\s+"]


def byte_chars():
    """GPT-2's bytes_to_unicode: the 256 characters byte-level BPE uses."""
    bs = (list(range(ord("!"), ord("~") + 1))
          + list(range(ord("\u00a1"), ord("\u00ac") + 1))
          + list(range(ord("\u00ae"), ord("\u00ff") + 1)))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for _, c in sorted(zip(bs, cs))]


def split(rx):
    return {"type": "Split", "pattern": {"Regex": rx},
            "behavior": "Isolated", "invert": False}


def byte_level(pre, norm=None, pairs=False, added=True, post=False):
    chars = byte_chars()
    vocab = {c: i for i, c in enumerate(chars)}
    merges = [("H", "e"), ("l", "l"), ("He", "ll"), ("\u0120", "w"),
              ("o", "r"), ("\u0120w", "or")]
    for l, r in merges:
        vocab.setdefault(l + r, len(vocab))
    tj = {"version": "1.0", "normalizer": norm, "pre_tokenizer": pre,
          "model": {"type": "BPE", "dropout": None, "unk_token": None,
                    "byte_fallback": False,
                    "vocab": vocab,
                    "merges": [[l, r] if pairs else l + " " + r
                               for l, r in merges]},
          "added_tokens": []}
    if added:
        n = len(vocab)
        tj["added_tokens"] = [
            {"id": n, "content": "<|im_start|>", "special": True},
            {"id": n + 1, "content": "<|im_end|>", "special": True},
            {"id": n + 3, "content": "<think>", "special": False}]
    if post:
        tj["post_processor"] = {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<|im_start|>",
                                         "type_id": 0}},
                       {"Sequence": {"id": "A", "type_id": 0}}]}
    return tj


def spm(prepend=True):
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab["<0x%02X>" % b] = len(vocab)
    for p in ["\u2581", "a", "b", "\u2581a", "ab", "\u2581ab"]:
        vocab[p] = len(vocab)
    norm = [{"type": "Replace", "pattern": {"String": " "},
             "content": "\u2581"}]
    if prepend:
        norm.insert(0, {"type": "Prepend", "prepend": "\u2581"})
    return {"version": "1.0",
            "normalizer": {"type": "Sequence", "normalizers": norm},
            "pre_tokenizer": None,
            "model": {"type": "BPE", "unk_token": "<unk>",
                      "byte_fallback": True, "vocab": vocab,
                      "merges": ["\u2581 a", "a b", "\u2581 ab"]},
            "added_tokens": [
                {"id": 0, "content": "<unk>", "special": True},
                {"id": 1, "content": "<s>", "special": True},
                {"id": 2, "content": "</s>", "special": True},
                {"id": len(vocab), "content": "\u2581<tool>",
                 "special": False}]}


def save(name, tj, cfg=None, skip=False):
    os.makedirs(os.path.join(out, "vocab_hf"), exist_ok=True)
    data = bytes([(1 if skip else 0) | (2 if cfg is not None else 0)])
    data += json.dumps(tj, ensure_ascii=False).encode()
    if cfg is not None:
        data += b"\0" + json.dumps(cfg, ensure_ascii=False).encode()
    with open(os.path.join(out, "vocab_hf", name), "wb") as f:
        f.write(data)


BL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
      "use_regex": False}
CFG = {"bos_token": "<|im_start|>", "eos_token": {"content": "<|im_end|>"},
       "pad_token": None, "add_bos_token": False,
       "chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}"}

save("qwen2", byte_level({"type": "Sequence",
                          "pretokenizers": [split(QWEN2), BL]},
                         norm={"type": "NFC"}), CFG)
save("qwen2-skip", byte_level({"type": "Sequence",
                               "pretokenizers": [split(QWEN2), BL]},
                              norm={"type": "Sequence",
                                    "normalizers": [{"type": "NFC"}]}),
     CFG, skip=True)
save("llama3", byte_level({"type": "Sequence",
                           "pretokenizers": [split(LLAMA3), BL]},
                          pairs=True, post=True),
     {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>",
      "chat_template": [{"name": "default", "template": "{{ bos_token }}"},
                        {"name": "tool_use", "template": "x"}]})
save("deepseek-v3", byte_level({"type": "Sequence",
                                "pretokenizers": [split(r) for r in DSV3]
                                + [BL]}))
save("gpt2", byte_level(dict(BL, use_regex=True), added=False))
save("spm", spm(), {"bos_token": "<s>", "eos_token": "</s>",
                    "unk_token": "<unk>", "add_bos_token": True})
save("spm-noprefix", spm(prepend=False))
# merges that are no "left right": empty, a lone space, arrays
odd = spm()
odd["model"]["merges"] = ["", " ", "a", ["\u2581", "a"], ["a"], "a b"]
save("spm-odd-merges", odd)
# an added token that is the unk_token but not in the vocabulary
unk = spm()
del unk["model"]["vocab"]["<unk>"]
save("spm-unk-added", unk)
# refused: a WordPiece model, an unknown pre-tokenizer, NFC without qwen2
save("wordpiece", {"model": {"type": "WordPiece", "vocab": {"a": 0}}})
save("unknown-pre", byte_level({"type": "Whitespace"}))
save("nfc-llama3", byte_level({"type": "Sequence",
                               "pretokenizers": [split(LLAMA3), BL]},
                              norm={"type": "NFC"}))
