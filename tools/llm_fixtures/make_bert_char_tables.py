#!/usr/bin/env python3
"""Character tables of the BERT normalizer and pre-tokenizer (llmkv/bert_chars.h), read off
Hugging Face's `tokenizers` library code point by code point. Run by hand, not by CI:

    pip install tokenizers
    python3 tools/llm_fixtures/make_bert_char_tables.py      # writes llmkv/bert_chars_tables.inc

The tables record what the library does, not what the Unicode standard of the day says: its
clean_text removes the characters of the categories Cc, Cf and Co and its punctuation is ASCII
punctuation plus the P* categories, both as the library's own (older) category tables have them;
its strip_accents removes the Mn marks of those tables. For every code point outside the surrogates
the script asks the library for:
  clean_text                 BertNormalizer(clean_text only): removed, turned into ' ', or kept
  handle_chinese_chars       BertNormalizer(handle_chinese_chars only): padded with spaces or not
  strip_accents              BertNormalizer(strip_accents only): NFD with the Mn marks removed
  lowercase                  BertNormalizer(lowercase only)
  BertPreTokenizer           on "a" + c + "a": split off as white space, isolated as punctuation,
                             or part of the word
and checks the assumptions llmkv/bert_chars.cpp makes: Hangul syllables decompose by the
algorithm of the standard; every mapping is a fixed string per character. It also lists how the
tables differ from Python's unicodedata (informative).
"""
import sys
import unicodedata
from pathlib import Path

from tokenizers import __version__ as tokenizers_version
from tokenizers.normalizers import BertNormalizer
from tokenizers.pre_tokenizers import BertPreTokenizer

OUT = Path(__file__).resolve().parents[2] / "llmkv" / "bert_chars_tables.inc"

# Flags, as llmkv/bert_chars.h names them.
DROP, CLEAN_SPACE, CHINESE, SPACE, PUNCT, MARK = 1, 2, 4, 8, 16, 32

HANGUL_BASE, HANGUL_COUNT = 0xAC00, 11172


def hangul_nfd(cp):
    s = cp - HANGUL_BASE
    l, v, t = 0x1100 + s // 588, 0x1161 + (s % 588) // 28, 0x11A7 + s % 28
    return [l, v] + ([t] if t != 0x11A7 else [])


def code_points():
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        yield cp


def probe():
    clean = BertNormalizer(clean_text=True, handle_chinese_chars=False, strip_accents=False, lowercase=False)
    cjk = BertNormalizer(clean_text=False, handle_chinese_chars=True, strip_accents=False, lowercase=False)
    strip = BertNormalizer(clean_text=False, handle_chinese_chars=False, strip_accents=True, lowercase=False)
    lower = BertNormalizer(clean_text=False, handle_chinese_chars=False, strip_accents=False, lowercase=True)
    pre = BertPreTokenizer()
    flags, strips, lowers = {}, {}, {}
    for cp in code_points():
        c = chr(cp)
        f = 0
        n = clean.normalize_str(c)
        if n == "":
            f |= DROP
        elif n == " " and c != " ":
            f |= CLEAN_SPACE
        else:
            assert n == c, (hex(cp), n)
        n = cjk.normalize_str(c)
        if n == f" {c} ":
            f |= CHINESE
        else:
            assert n == c, (hex(cp), n)
        pieces = [p for p, _ in pre.pre_tokenize_str("a" + c + "a")]
        if pieces == ["a", "a"]:
            f |= SPACE
        elif pieces == ["a", c, "a"]:
            f |= PUNCT
        else:
            assert pieces == ["a" + c + "a"], (hex(cp), pieces)
        s = strip.normalize_str(c)
        if s == "":
            f |= MARK
        elif s != c:
            strips[cp] = [ord(x) for x in s]
        lo = lower.normalize_str(c)
        if lo != c:
            lowers[cp] = [ord(x) for x in lo]
        if f:
            flags[cp] = f
    return flags, strips, lowers


def runs(flags):
    """(start, flags) wherever the flags change, from code point 0."""
    out, prev = [], None
    for cp in range(0x110000):
        f = flags.get(cp, 0)
        if f != prev:
            out.append((cp, f))
            prev = f
    return out


def delta_runs(mapping):
    """Single-code-point mappings as (start, count, stride, delta): start + stride * i -> + delta."""
    items = sorted((cp, out[0]) for cp, out in mapping.items() if len(out) == 1)
    out, i = [], 0
    while i < len(items):
        cp, to = items[i]
        delta = to - cp
        best = (1, 1)
        for stride in (1, 2):
            n = 1
            while i + n < len(items) and items[i + n][0] == cp + stride * n and items[i + n][1] - items[i + n][0] == delta:
                n += 1
            if n > best[0]:
                best = (n, stride)
        n, stride = best
        out.append((cp, n, stride, delta))
        i += n
    return out


def check_against_unicodedata(flags, strips, lowers):
    notes = []
    gc = unicodedata.category
    for cp in code_points():
        c = chr(cp)
        f = flags.get(cp, 0)
        ud_punct = gc(c).startswith("P") or (cp < 128 and c in "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")
        if bool(f & PUNCT) != ud_punct:
            notes.append(f"U+{cp:04X} {gc(c)}: punctuation here {bool(f & PUNCT)}, unicodedata {ud_punct}")
        ud_drop = cp == 0 or cp == 0xFFFD or (gc(c) in ("Cc", "Cf", "Co") and c not in "\t\n\r")
        if bool(f & DROP) != ud_drop:
            notes.append(f"U+{cp:04X} {gc(c)}: removed by clean_text here {bool(f & DROP)}, unicodedata {ud_drop}")
    return notes


def main():
    flags, strips, lowers = probe()
    hangul = {cp: hangul_nfd(cp) for cp in range(HANGUL_BASE, HANGUL_BASE + HANGUL_COUNT)}
    for cp, want in hangul.items():
        assert strips.pop(cp) == want, hex(cp)
    multi_strip = {cp: v for cp, v in strips.items() if len(v) > 1}
    multi_lower = {cp: v for cp, v in lowers.items() if len(v) > 1}
    assert max(len(v) for v in strips.values()) <= 3 and max(len(v) for v in lowers.values()) <= 3
    # Characters that NFD may reorder and that strip_accents keeps: canonical reordering moves such
    # a character only past another with a different non-zero combining class.
    kept_ccc = [cp for cp in code_points() if unicodedata.combining(chr(cp)) and not flags.get(cp, 0) & MARK]

    flag_runs = runs(flags)
    strip_runs = delta_runs(strips)
    lower_runs = delta_runs(lowers)
    lines = [
        "// Generated by tools/llm_fixtures/make_bert_char_tables.py from Hugging Face tokenizers "
        f"{tokenizers_version}; do not edit.",
        "// Included by llmkv/bert_chars.cpp, which defines CharRun, DeltaRun and MultiMap.",
        "",
        f"// Flags from a code point on, until the next entry ({len(flag_runs)} runs).",
        "constexpr CharRun kFlagRuns[] = {",
    ]
    row = []
    for cp, f in flag_runs:
        row.append(f"{{0x{cp:X},{f}}}")
        if len(row) == 8:
            lines.append("    " + ",".join(row) + ",")
            row = []
    if row:
        lines.append("    " + ",".join(row) + ",")
    lines.append("};")

    def emit_delta(name, what, data):
        lines.append("")
        lines.append(f"// {what}: start + stride * i -> itself + delta, i < count ({len(data)} runs).")
        lines.append(f"constexpr DeltaRun {name}[] = {{")
        row = []
        for cp, n, stride, delta in data:
            row.append(f"{{0x{cp:X},{n},{stride},{delta}}}")
            if len(row) == 6:
                lines.append("    " + ",".join(row) + ",")
                row = []
        if row:
            lines.append("    " + ",".join(row) + ",")
        lines.append("};")

    def emit_multi(name, what, data):
        lines.append("")
        lines.append(f"// {what} ({len(data)} characters).")
        lines.append(f"constexpr MultiMap {name}[] = {{")
        for cp in sorted(data):
            out = data[cp] + [0] * (3 - len(data[cp]))
            lines.append(f"    {{0x{cp:X},{{{','.join(f'0x{x:X}' for x in out)}}}}},")
        if not data:
            lines.append("    {0, {0, 0, 0}},  // none")
        lines.append("};")

    emit_delta("kStripRuns", "strip_accents to one code point (Hangul syllables apart)", strip_runs)
    emit_multi("kStripMulti", "strip_accents to several code points (Hangul syllables apart)", multi_strip)
    emit_delta("kLowerRuns", "lowercase to one code point", lower_runs)
    emit_multi("kLowerMulti", "lowercase to several code points", multi_lower)
    OUT.write_text("\n".join(lines) + "\n", encoding="utf-8")

    print(f"tokenizers {tokenizers_version}; unicodedata {unicodedata.unidata_version}")
    print(f"{len(flag_runs)} flag runs, strip: {len(strip_runs)} runs + {len(multi_strip)} multi, "
          f"lower: {len(lower_runs)} runs + {len(multi_lower)} multi; {OUT.stat().st_size} bytes in {OUT}")
    print(f"{len(kept_ccc)} code points kept by strip_accents with a non-zero combining class (canonical "
          "reordering is not applied to them):", " ".join(f"U+{cp:04X}" for cp in kept_ccc[:20]), "...")
    notes = check_against_unicodedata(flags, strips, lowers)
    print(f"{len(notes)} code points where the library differs from unicodedata {unicodedata.unidata_version}",
          file=sys.stderr)
    for n in notes[:60]:
        print("  " + n, file=sys.stderr)


if __name__ == "__main__":
    main()
