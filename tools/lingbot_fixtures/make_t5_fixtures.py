#!/usr/bin/env python3
"""Conformance fixtures for the umT5 text encoder and tokenizer of LingBot-World-Fast (hand-run,
never run by CI).

Imports the first-generation upstream code (Robbyant/lingbot-world at commit 91ff5f6,
Apache-2.0: wan/modules/t5.py and wan/modules/tokenizers.py) from a fetched copy and writes, under
tests/dit/fixtures/lingbot/:
  umt5_encoder.safetensors  a reduced umt5_xxl encoder (T5Encoder with a relative position
                            bias in every block) with seeded random weights under upstream's
                            key names (BF16)
  umt5_io.safetensors       float32 references of that encoder: its outputs on a padded
                            batch (mask as the wrapper makes it), a 160-token sequence, each
                            block's output, the per-layer position bias, the bucket table, the
                            context as the pipeline pads it, a bfloat16 run
  umt5_tiny_enc_bf16.pth    a smaller encoder's state dict saved by torch.save in bfloat16, as
                            models_t5_umt5-xxl-enc-bf16.pth is, and its
                            float32 output (in umt5_io): the .pth layout through the runtime's reader
  umt5_spiece.model         a tiny SentencePiece unigram model trained here with T5's special
                            ids (pad 0, eos 1, unk 2)
  umt5_tokenizer.json       ~50 strings: upstream's 'whitespace' cleaning (ftfy, html.unescape,
                            whitespace), SentencePiece's ids + EOS, and upstream's
                            HuggingfaceTokenizer (transformers' T5 tokenizer over the tiny model)
                            ids and masks padded to text_len
See README.md beside this file.

  git -C <clone of prashant182/lingbot-world> archive 91ff5f6 -- wan LICENSE.txt | tar -x -C /tmp/umt5_up
  PYTHONPATH=/tmp/umt5_extra /tmp/torchvenv/bin/python \
      tools/lingbot_fixtures/make_t5_fixtures.py --upstream /tmp/umt5_up
"""

import argparse
import importlib.machinery
import json
import math
import os
import sys
import tempfile
import types

import torch

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DEFAULT_OUT = os.path.join(REPO_ROOT, "tests", "dit", "fixtures", "lingbot")

# umt5_xxl's config (vocab 256384, dim 4096, dim_attn 4096, dim_ffn 10240, 64 heads, 24 layers,
# 32 buckets, shared_pos False) at reduced widths; bucket count and the unshared bias as upstream.
REDUCED = dict(vocab_size=256, dim=64, dim_attn=64, dim_ffn=128, num_heads=4, encoder_layers=3,
               num_buckets=32)
TINY = dict(vocab_size=64, dim=16, dim_attn=16, dim_ffn=40, num_heads=2, encoder_layers=2,
            num_buckets=32)
SEED = 58
TEXT_LEN = 24              # the wrapper's text_len for the batch (512 upstream)
BATCH_LENS = [24, 17, 5, 1]  # real tokens (EOS included) of each padded sequence
LONG_LEN = 160             # longer than max_dist 128: the log buckets and their clamp
BIAS_LEN = 20              # the per-layer position bias stored at this length
BUCKET_RANGE = 300         # the bucket table for relative positions -300..300
TOKENIZER_TEXT_LEN = 32    # text_len of the tokenizer fixture's padded batch
SPM_VOCAB = 300


def load_upstream(upstream):
    """wan.modules.t5 and wan.modules.tokenizers from the copy, without running wan/__init__.py
    (which imports every pipeline). t5.py evaluates torch.cuda.current_device() as a default
    argument at import: patched to 'cpu' first."""
    torch.cuda.current_device = lambda: "cpu"
    sys.path.insert(0, upstream)
    for name, sub in (("wan", "wan"), ("wan.modules", os.path.join("wan", "modules"))):
        pkg = types.ModuleType(name)
        pkg.__path__ = [os.path.join(upstream, sub)]
        pkg.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
        sys.modules[name] = pkg
    import wan.modules.t5 as t5
    import wan.modules.tokenizers as tok
    return t5, tok


def fixture_ids(seed, n, vocab):
    """n token ids in [3, vocab - 1) (0 pad, 1 EOS, 2 unk are T5's specials), then EOS."""
    g = torch.Generator().manual_seed(seed)
    body = torch.randint(3, vocab - 1, (n - 1,), generator=g)
    return torch.cat([body, torch.tensor([1])]).long()


@torch.no_grad()
def build_encoder(t5, cfg, seed):
    """upstream's umt5_xxl(encoder_only=True) at `cfg`, in float32, eval mode. Its init_weights
    is kept, then the position embeddings are drawn N(0, 1) (upstream's std (2 * 32 * heads)^-0.5
    leaves the bias small beside the logits, and a wrong bucket would hardly show) and the norm
    weights 1 + N(0, 0.1^2); every weight is rounded to bfloat16 (the checkpoint's dtype)."""
    torch.manual_seed(seed)
    model = t5.umt5_xxl(encoder_only=True, return_tokenizer=False, dtype=torch.float32,
                        device="cpu", **cfg).eval().requires_grad_(False)
    for name, p in model.named_parameters():
        if "pos_embedding" in name:
            p.normal_(0.0, 1.0)
        elif "norm" in name:
            p.normal_(0.0, 0.1).add_(1.0)
        p.copy_(p.to(torch.bfloat16).float())
    return model


@torch.no_grad()
def encoder_fixtures(t5, io, out_dir):
    from safetensors.torch import save_file
    model = build_encoder(t5, REDUCED, SEED)
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()},
              os.path.join(out_dir, "umt5_encoder.safetensors"),
              metadata={"about": json.dumps({"upstream": "Robbyant/lingbot-world 91ff5f6 wan/modules/t5.py",
                                             "umt5_xxl": REDUCED})})

    # The padded batch as T5EncoderModel.__call__ makes it: ids padded with 0 to text_len, mask
    # 1 on the real tokens; the encoder runs on all text_len positions with the mask; the pipeline
    # keeps u[:len] and WanModelFast zero-pads it back to text_len.
    ids = torch.zeros(len(BATCH_LENS), TEXT_LEN, dtype=torch.long)
    mask = torch.zeros(len(BATCH_LENS), TEXT_LEN, dtype=torch.long)
    for b, n in enumerate(BATCH_LENS):
        ids[b, :n] = fixture_ids(100 + b, n, REDUCED["vocab_size"])
        mask[b, :n] = 1
    out = model(ids, mask)
    seq_lens = mask.gt(0).sum(dim=1).long()
    cut = [u[:v] for u, v in zip(out, seq_lens)]
    context = torch.stack([torch.cat([u, u.new_zeros(TEXT_LEN - u.size(0), u.size(1))]) for u in cut])
    io.update({"batch.ids": ids, "batch.mask": mask, "batch.out": out, "batch.context": context})

    # Each block's output for the batch's second sequence (padded, masked), before the final norm.
    x = model.token_embedding(ids)
    for i, block in enumerate(model.blocks):
        x = block(x, mask)
        io[f"batch.block{i}"] = x[1].clone()

    long_ids = fixture_ids(200, LONG_LEN, REDUCED["vocab_size"]).unsqueeze(0)
    io["long.ids"] = long_ids
    io["long.out"] = model(long_ids, torch.ones_like(long_ids))

    for i, block in enumerate(model.blocks):
        io[f"bias{i}"] = block.pos_embedding(BIAS_LEN, BIAS_LEN)[0]  # [heads, L, L]
    rel = torch.arange(-BUCKET_RANGE, BUCKET_RANGE + 1)
    io["buckets.rel"] = rel
    io["buckets.bidirectional"] = model.blocks[0].pos_embedding._relative_position_bucket(rel)

    # The same weights computing in bfloat16, as upstream runs the encoder (t5_dtype).
    io["batch.out_bf16"] = model.to(torch.bfloat16)(ids, mask).float()


@torch.no_grad()
def pth_fixture(t5, io, out_dir):
    """A smaller encoder in bfloat16, its state dict written by torch.save as the checkpoint
    upstream loads with `model.load_state_dict(torch.load(path))`, and its float32 output."""
    model = build_encoder(t5, TINY, SEED + 1)
    torch.save(model.to(torch.bfloat16).state_dict(), os.path.join(out_dir, "umt5_tiny_enc_bf16.pth"))
    ids = fixture_ids(300, 12, TINY["vocab_size"]).unsqueeze(0)
    io["tiny.ids"] = ids
    io["tiny.out"] = model.float()(ids, torch.ones_like(ids))


# ----------------------------------------------------------------------------------------------
# Tokenizer.
# ----------------------------------------------------------------------------------------------
CORPUS_BASE = [
    "A red car drives along a coastal road at sunset, waves crashing against the rocks.",
    "The camera slowly moves forward through a dense forest with tall pine trees.",
    "An old stone castle on a hill, clouds drifting over the towers in the wind.",
    "A cat sits on the windowsill and watches the rain fall on the city street.",
    "First-person view walking down a narrow alley in a medieval village.",
    "Snow covered mountains under a clear blue sky, the sun reflecting off the glacier.",
    "A futuristic city at night with neon lights, flying cars and tall glass buildings.",
    "Underwater scene: colorful fish swim around a coral reef in shallow water.",
    "The drone flies over a wide river valley, green fields on both banks.",
    "Inside a cozy library, shelves full of books, warm light from a lamp.",
    "Une voiture rouge roule le long de la côte au coucher du soleil.",
    "Ein alter Zug fährt durch die verschneiten Berge im Winter.",
    "Un perro corre por la playa mientras las olas llegan a la orilla.",
    "Камера медленно движется по длинному коридору старого дома.",
    "一只小猫坐在窗台上，看着窗外的雨。",
    "カメラは森の中をゆっくりと進み、木々の間から光が差し込む。",
    "Numbers 0 1 2 3 4 5 6 7 8 9 10 100 2024 3.14 50% and symbols: & < > \" ' ( ) [ ] { } # @ ! ?",
    "Hello, world! This is a test of the tokenizer with punctuation; colons: and dashes - too.",
]


def normalization_rules(path):
    """SentencePiece normalisation rules (TSV: source code points, target code points): NFKC for
    every character of the corpus and of the compared strings that NFKC changes, and NFKC's
    composition of the decomposed pairs the strings hold. T5's nmt_nfkc rules compile to a 240 KB
    table; these few keep the model small and do what nmt_nfkc does to these strings."""
    import unicodedata
    chars = sorted({c for t in CORPUS_BASE + [t for t, _ in STRINGS] for c in t})
    rules = {}
    for c in chars:
        n = unicodedata.normalize("NFKC", c)
        if n != c and n.strip():
            rules[(ord(c),)] = tuple(ord(x) for x in n)
    for pair in ("e\u0301", "a\u0308"):
        rules[tuple(ord(x) for x in pair)] = tuple(ord(x) for x in unicodedata.normalize("NFKC", pair))
    with open(path, "w", encoding="utf-8") as f:
        for src, dst in sorted(rules.items()):
            f.write(" ".join(f"{x:X}" for x in src) + "\t" + " ".join(f"{x:X}" for x in dst) + "\n")


def train_spm(model_path):
    """A tiny unigram model with T5's special ids (pad 0, eos 1, unk 2, no bos)."""
    import sentencepiece as spm
    with tempfile.TemporaryDirectory() as tmp:
        corpus = os.path.join(tmp, "corpus.txt")
        with open(corpus, "w", encoding="utf-8") as f:
            for i in range(40):
                for line in CORPUS_BASE:
                    words = line.split(" ")
                    k = i % len(words)
                    f.write(" ".join(words[k:] + words[:k]) + "\n")
        rules = os.path.join(tmp, "rules.tsv")
        normalization_rules(rules)
        prefix = os.path.join(tmp, "m")
        spm.SentencePieceTrainer.train(
            input=corpus, model_prefix=prefix, vocab_size=SPM_VOCAB, model_type="unigram",
            pad_id=0, eos_id=1, unk_id=2, bos_id=-1, character_coverage=0.9995,
            normalization_rule_tsv=rules, byte_fallback=False, num_threads=1,
            input_sentence_size=0, shuffle_input_sentence=False, minloglevel=2)
        # The trainer's temporary paths are stored in the model: cleared, so reruns give the same bytes.
        from sentencepiece import sentencepiece_model_pb2
        proto = sentencepiece_model_pb2.ModelProto()
        with open(prefix + ".model", "rb") as f:
            proto.ParseFromString(f.read())
        proto.trainer_spec.ClearField("input")
        proto.trainer_spec.ClearField("model_prefix")
        proto.normalizer_spec.ClearField("normalization_rule_tsv")
    with open(model_path, "wb") as f:
        f.write(proto.SerializeToString())


# The strings compared: (text, ours_differs_before_spm) — the second is True where ftfy changes
# something that the C++ cleaning leaves to SentencePiece's NFKC normaliser (NFC composition,
# half-width forms), so the cleaned strings differ but the tokens must not.
STRINGS = [
    ("A red car drives along a coastal road at sunset.", False),
    ("  leading and trailing spaces  ", False),
    ("many    spaces\tand\ttabs\nand\nnewlines\r\nand CRLF", False),
    ("", False),
    ("   \t\n  ", False),
    ("a", False),
    ("The camera slowly moves forward through a dense forest with tall pine trees.", False),
    ("Une voiture rouge roule le long de la côte au coucher du soleil.", False),
    ("Ein alter Zug fährt durch die verschneiten Berge im Winter.", False),
    ("Камера медленно движется по длинному коридору.", False),
    ("一只小猫坐在窗台上，看着窗外的雨。", False),
    ("カメラは森の中をゆっくりと進む。", False),
    ("curly \u2018single\u2019 and \u201cdouble\u201d quotes, \u201alow\u201b and \u201ehigh\u201f, modifier \u02bcapostrophe", False),
    ("html &amp; entities &lt;b&gt; &quot;quoted&quot; &#39;apos&#39; &#x27;hex&#x27;", False),
    ("double escaped &amp;amp; and triple &amp;amp;amp; and quadruple &amp;amp;amp;amp;", False),
    ("a tag <b> keeps ftfy from unescaping &amp; but html.unescape does", False),
    ("no semicolon &amp and &lt and &gt and &quot text", False),
    ("AT&T and R&D and fish&chips & co", False),
    ("non-breaking\u00a0space and&nbsp;entity", False),
    ("numeric &#65;&#66;&#67; &#x41;&#X42; &#0; &#128; &#x93;quote&#x94; &#1114112; &#xD800;", False),
    ("named &copy; &reg; &hellip; &mdash; &ndash; &eacute; &euro; &deg; &times;", False),
    ("ideographic\u3000space and en\u2002space and thin\u2009space", False),
    ("line\u2028separator and paragraph\u2029separator and next\u0085line", False),
    ("control\x00chars\x07here\x08and\x0bthere\x0c\x1f\x7f", False),
    ("terminal \x1b[31mred\x1b[0m escape", False),
    ("C1 controls \x93quoted\x94 and \x80 euro and \x96 dash", False),
    ("zero\u200bwidth and bom\ufeffhere and word\u2060joiner", False),
    ("ligature \ufb01ne \ufb02ow \ufb00", False),
    ("full-width \uff21\uff22\uff23 \uff11\uff12\uff13 \uff01", False),
    ("decomposed e\u0301 and a\u0308 vs composed \u00e9 \u00e4", True),
    ("emoji \U0001F600 and \U0001F680 rocket", False),
    ("Numbers 0 1 2 3 4 5 6 7 8 9 10 100 2024 3.14 50%", False),
    ("symbols: & < > \" ' ( ) [ ] { } # @ ! ?", False),
    ("under_score and hy-phen and slash/back\\slash", False),
    ("UPPER lower MiXeD", False),
    ("A cat sits on the windowsill and watches the rain fall on the city street.", False),
    ("First-person view walking down a narrow alley in a medieval village.", False),
    ("Snow covered mountains under a clear blue sky.", False),
    ("Underwater scene: colorful fish swim around a coral reef.", False),
    ("Un perro corre por la playa mientras las olas llegan a la orilla.", False),
    ("unknown letters \u0e01\u0e02 \u05d0\u05d1 \u0627\u0644", False),
    ("tokens that are not in the vocabulary: zyxwvq qqqq jjjj", False),
    ("mixed 中文 and English and русский", False),
    ("trailing punctuation!!!", False),
    ("<extra_id_0> looks like a sentinel", False),
    ("</s> and <pad> and <unk> written out", False),
    ("a long prompt " * 12, False),  # longer than TOKENIZER_TEXT_LEN: truncated, EOS kept
    ("The drone flies over a wide river valley, green fields on both banks, " * 3, False),
    ("tab\tat\tevery\tword", False),
    ("\u00a0\u00a0nbsp at both ends\u00a0\u00a0", False),
    ("&lt;&lt; nested &amp;lt; escapes &gt;&gt;", False),
]


# Python's html.unescape alone (basic_clean applies it twice after ftfy).
HTML_CASES = [
    "&amp", "&amp;", "&ampx;", "&AMP;", "&Amp;", "&notit;", "&not", "&noti", "&copy2024", "&lang;", "&rang;",
    "&#65", "&#65;", "&#x41;", "&#X41", "&#xg;", "&#;", "&#", "&", "&;", "& amp;", "&&amp;", "&#0;", "&#13;",
    "&#x9d;", "&#x81;", "&#127;", "&#11;", "&#xFFFE;", "&#x1FFFF;", "&#xFDD0;", "&#55296;", "&#1114111;",
    "&#99999999999999999999;", "&apos;", "&apos", "&nbsp;&nbsp", "&eacute&egrave;", "&checkmark;",
    "&aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa;", "a&b&c;", "&lt;&gt;&quot;&#39;",
]


def tokenizer_fixtures(tok, out_dir):
    import sentencepiece as spm
    model_path = os.path.join(out_dir, "umt5_spiece.model")
    train_spm(model_path)
    sp = spm.SentencePieceProcessor(model_file=model_path)
    with tempfile.TemporaryDirectory() as tmp:
        # A tokenizer folder as google/umt5-xxl is laid out (spiece.model + tokenizer_config.json),
        # read by upstream's HuggingfaceTokenizer through AutoTokenizer.
        with open(model_path, "rb") as f, open(os.path.join(tmp, "spiece.model"), "wb") as g:
            g.write(f.read())
        with open(os.path.join(tmp, "tokenizer_config.json"), "w") as f:
            json.dump({"tokenizer_class": "T5Tokenizer", "extra_ids": 0, "eos_token": "</s>",
                       "unk_token": "<unk>", "pad_token": "<pad>"}, f)
        hf = tok.HuggingfaceTokenizer(name=tmp, seq_len=TOKENIZER_TEXT_LEN, clean="whitespace")
        texts = [t for t, _ in STRINGS]
        hf_ids, hf_mask = hf(texts, return_mask=True, add_special_tokens=True)
        hf_class = type(hf.tokenizer).__name__
        hf_full = [hf.tokenizer(hf._clean(t)).input_ids for t in texts]
    specials = [sp.id_to_piece(i) for i in range(sp.get_piece_size())
                if sp.is_control(i) or sp.is_unknown(i)]
    cases = []
    for i, (text, differs) in enumerate(STRINGS):
        cleaned = tok.whitespace_clean(tok.basic_clean(text))
        cases.append({
            "text": text,
            "cleaned": cleaned,
            "ours_differs_before_spm": differs,
            "has_special_string": any(p in cleaned for p in specials),
            "spm_ids": sp.encode(cleaned) + [sp.eos_id()],
            "hf_ids_full": hf_full[i],
            "hf_ids": hf_ids[i].tolist(),
            "hf_mask": hf_mask[i].tolist(),
        })
    import ftfy
    import html
    import sentencepiece
    import transformers
    doc = {
        "html_unescape": [[t, html.unescape(t)] for t in HTML_CASES],
        "text_len": TOKENIZER_TEXT_LEN,
        "pad_id": sp.pad_id(), "eos_id": sp.eos_id(), "unk_id": sp.unk_id(),
        "versions": {"sentencepiece": sentencepiece.__version__, "transformers": transformers.__version__,
                     "ftfy": ftfy.__version__, "hf_tokenizer_class": hf_class},
        "cases": cases,
    }
    with open(os.path.join(out_dir, "umt5_tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=True, indent=1)
    return doc


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--upstream", required=True, help="a copy of lingbot-world at 91ff5f6")
    ap.add_argument("--out", default=DEFAULT_OUT)
    args = ap.parse_args()
    torch.set_num_threads(1)
    t5, tok = load_upstream(args.upstream)
    io = {}
    encoder_fixtures(t5, io, args.out)
    pth_fixture(t5, io, args.out)
    from safetensors.torch import save_file
    save_file({k: v.contiguous() for k, v in io.items()}, os.path.join(args.out, "umt5_io.safetensors"),
              metadata={"about": json.dumps({"upstream": "Robbyant/lingbot-world 91ff5f6 wan/modules/t5.py",
                                             "umt5_xxl": REDUCED, "tiny": TINY})})
    doc = tokenizer_fixtures(tok, args.out)
    mism = [c["text"] for c in doc["cases"] if c["spm_ids"] != c["hf_ids_full"]]
    print(f"wrote {args.out}: {len(io)} tensors, {len(doc['cases'])} strings; transformers' ids "
          f"differ from SentencePiece's + EOS on {len(mism)}: {mism}")


if __name__ == "__main__":
    main()
