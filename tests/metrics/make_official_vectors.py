"""Generate ``data/hotpot_official_vectors.json`` from a local copy of the official HotpotQA scorer.

Usage::

    python tests/metrics/make_official_vectors.py /path/to/hotpot_evaluate_v1.py

The official script is imported (never copied) and run on hand-picked edge cases plus seeded random
strings; its outputs are stored as test vectors that ``test_official_vectors.py`` replays against
``ragrl.metrics``. Floats are stored with ``json`` (``repr``), so they round-trip exactly.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import hashlib
import importlib.util
import io
import json
import random
import sys
import tempfile
from pathlib import Path

OUT = Path(__file__).resolve().parent / "data" / "hotpot_official_vectors.json"
SEED = 20240607

EDGE_STRINGS = [
    "",
    " ",
    "\t\n",
    ".",
    "...",
    "!?",
    "'",
    '"',
    "-",
    "_",
    "__init__",
    "a",
    "an",
    "the",
    "The",
    "THE",
    "a an the",
    "A An The",
    "the the",
    "theory",
    "anthem",
    "a.",
    "the.",
    ".the",
    "t.h.e",
    "an-the",
    "yes",
    "Yes",
    "YES",
    "yes.",
    "no",
    "No",
    "no!",
    "noanswer",
    "no answer",
    "No-Answer",
    "yes no",
    "True",
    "False",
    "true",
    "U.S.",
    "U.S.A.",
    "u s",
    "us",
    "1,000",
    "1.000",
    "1,000.50",
    "3.14",
    "$100",
    "100%",
    "#1",
    "(a)",
    "[the]",
    "{an}",
    "Röntgen",
    "Æthelburh",
    "ÆTHELBURH",
    "Straße",
    "İstanbul",
    "ǅemal",
    "Ångström",
    "naïve café",
    "Chief of Protocol",
    "chief-of-protocol",
    "Kiss and Tell (1945 film)",
    "O'Brien",
    "O’Brien",
    "‘quoted’",
    "“double”",
    "don´t",
    "`tick`",
    "—",
    "a—b",
    "–",
    "…",
    "２０２０",
    "ＡＢＣ",
    "！",
    "？",
    "（the）",
    "，",
    "。",
    "、",
    "non\u00a0breaking",
    "em\u2003space",
    "ideographic\u3000space",
    "line\u2028sep",
    "para\u2029sep",
    "thin\u2009space",
    "zero\u200bwidth",
    "nel\u0085x",
    "vt\x0bff\x0c",
    "\u00a0the\u00a0",
    "the\u3000cat",
    "a\u2003b",
    "Σίσυφος",
    "ΣΊΣΥΦΟΣ",
    "Москва",
    "東京",
    "محمد",
    "ﬁnance",
    "ß",
    "émigré",
    "e\u0301migre\u0301",
    "Ⅻ",
    "²",
    "①",
    "a_b c",
    "snake_case_name",
    "x@y.com",
    "http://example.com/a_b",
    "It's",
    "it’s",
    "rock 'n' roll",
    "the 'The' the",
    "a)",
    "(an",
]

WORDS = [
    "a",
    "an",
    "the",
    "A",
    "The",
    "yes",
    "no",
    "noanswer",
    "Yes",
    "No",
    "True",
    "False",
    "cat",
    "Cat",
    "sat",
    "mat",
    "1945",
    "1,000",
    "3.5",
    "U.S.",
    "Röntgen",
    "Æthelburh",
    "straße",
    "İ",
    "film",
    "O'Brien",
    "O’Brien",
    "Paris",
    "paris",
    "new",
    "york",
    "New-York",
    "a.b",
    "the_x",
    "an's",
    "é",
    "東京",
    "Москва",
    "σ",
    "Σ",
    "—",
    "’",
    "‘",
    "´",
    "`",
    "(",
    ")",
    ",",
    ".",
    "!",
    '"',
    "'",
    "-",
    "_",
    "ＡＢＣ",
    "！",
    "。",
    "noanswer.",
    "yes!",
    "no?",
]
SEPARATORS = [" ", " ", " ", "  ", "\t", "\n", "\u00a0", "\u2003", "\u3000", "\u2028", "", "-", "_"]
CHARS = (
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    + "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"
    + "       \t\n\u00a0\u2003\u3000\u2028\u2009"
    + "éÆæßİıΣσςЖж東京—–’‘“”´…！？，。ＡＢＣ２"
)


def load_official(path: str):
    sys.modules.setdefault("ujson", json)  # the script imports ujson only for json.load
    spec = importlib.util.spec_from_file_location("hotpot_evaluate_v1", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def random_words(rng: random.Random) -> str:
    n = rng.randint(0, 6)
    parts = []
    for _ in range(n):
        parts.append(rng.choice(WORDS))
        parts.append(rng.choice(SEPARATORS))
    return "".join(parts)


def random_chars(rng: random.Random) -> str:
    return "".join(rng.choice(CHARS) for _ in range(rng.randint(0, 14)))


def mutate(rng: random.Random, text: str) -> str:
    tokens = text.split(" ")
    for _ in range(rng.randint(0, 3)):
        op = rng.randrange(4)
        if op == 0 and tokens:
            tokens.pop(rng.randrange(len(tokens)))
        elif op == 1:
            tokens.insert(rng.randint(0, len(tokens)), rng.choice(WORDS))
        elif op == 2 and tokens:
            tokens[rng.randrange(len(tokens))] = rng.choice(WORDS)
        else:
            rng.shuffle(tokens)
    return rng.choice([" ", "  ", "\u00a0"]).join(tokens)


def answer_pairs(rng: random.Random) -> list[tuple[str, str]]:
    pairs: list[tuple[str, str]] = []
    yes_no = ["yes", "no", "noanswer", "Yes.", "NO", "no answer", "yes no", "the yes", "", "maybe"]
    pairs += [(p, g) for p in yes_no for g in yes_no]
    hand = EDGE_STRINGS[:60]
    pairs += [(p, g) for p in hand for g in hand[:30]]
    pairs += [(s, s) for s in EDGE_STRINGS]
    pairs += [(s, "") for s in EDGE_STRINGS] + [("", s) for s in EDGE_STRINGS]
    for _ in range(1500):
        gold = random_words(rng)
        pairs.append((mutate(rng, gold), gold))
    for _ in range(800):
        pairs.append((random_words(rng), random_words(rng)))
    for _ in range(800):
        gold = random_chars(rng)
        pairs.append((gold + rng.choice(["", " ", "."]) + random_chars(rng), gold))
    seen: set[tuple[str, str]] = set()
    out = []
    for pair in pairs:
        if pair not in seen:
            seen.add(pair)
            out.append(pair)
    return out


def random_facts(rng: random.Random, titles: list[str]) -> list[list]:
    return [[rng.choice(titles), rng.randint(0, 3)] for _ in range(rng.randint(0, 5))]


def run_eval(official, pred_answer, pred_sp, gold_answer, gold_sp) -> dict:
    """Run the official ``eval`` on a one-example file pair and parse the metrics it prints."""
    with tempfile.TemporaryDirectory() as tmp:
        pred_path, gold_path = Path(tmp, "pred.json"), Path(tmp, "gold.json")
        pred_path.write_text(json.dumps({"answer": {"x": pred_answer}, "sp": {"x": pred_sp}}))
        gold_path.write_text(json.dumps([{"_id": "x", "answer": gold_answer, "supporting_facts": gold_sp}]))
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            official.eval(str(pred_path), str(gold_path))
    return ast.literal_eval(buf.getvalue().strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("official", help="path to a local copy of hotpot_evaluate_v1.py")
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args()
    official = load_official(args.official)
    rng = random.Random(SEED)

    pairs = answer_pairs(rng)
    strings = sorted({s for pair in pairs for s in pair} | set(EDGE_STRINGS))
    normalize_vectors = [[s, official.normalize_answer(s)] for s in strings]
    answer_vectors = []
    for pred, gold in pairs:
        f1, prec, recall = official.f1_score(pred, gold)
        answer_vectors.append([pred, gold, official.exact_match_score(pred, gold), f1, prec, recall])

    titles = ["Kiss and Tell (1945 film)", "Shirley Temple", "Röntgen", "a", "The"]
    sp_cases = [
        ([], []),
        ([["a", 0]], []),
        ([], [["a", 0]]),
        ([["a", 0]], [["a", 0]]),
        ([["a", 0], ["a", 0]], [["a", 0]]),
        ([["a", 0]], [["a", 1]]),
        ([["a", 0]], [["The", 0]]),
    ]
    sp_cases += [(random_facts(rng, titles), random_facts(rng, titles)) for _ in range(600)]
    sp_vectors = []
    for pred_sp, gold_sp in sp_cases:
        metrics = {"sp_em": 0, "sp_f1": 0, "sp_prec": 0, "sp_recall": 0}
        em, prec, recall = official.update_sp(metrics, pred_sp, gold_sp)
        sp_vectors.append([pred_sp, gold_sp, em, metrics["sp_f1"], prec, recall])

    joint_vectors = []
    joint_answers = [
        ("Chief of Protocol", "Chief of Protocol"),
        ("chief protocol", "Chief of Protocol"),
        ("yes", "no"),
        ("no", "no"),
        ("", ""),
        ("the", "The"),
        ("U.S. army", "US Army"),
    ]
    joint_answers += [(mutate(rng, g), g) for g in (random_words(rng) for _ in range(250))]
    for i, (pred, gold) in enumerate(joint_answers):
        pred_sp, gold_sp = sp_cases[i % len(sp_cases)]
        metrics = run_eval(official, pred, pred_sp, gold, gold_sp)
        joint_vectors.append(
            {"pred": pred, "gold": gold, "pred_sp": pred_sp, "gold_sp": gold_sp, "metrics": metrics}
        )

    data = {
        "generated_by": "tests/metrics/make_official_vectors.py",
        "official_script_sha256": hashlib.sha256(Path(args.official).read_bytes()).hexdigest(),
        "seed": SEED,
        "normalize": normalize_vectors,
        "answer": answer_vectors,
        "sp": sp_vectors,
        "joint": joint_vectors,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(data, ensure_ascii=False, indent=0) + "\n", encoding="utf-8")
    print(
        f"wrote {args.out}: {len(normalize_vectors)} normalize, {len(answer_vectors)} answer, "
        f"{len(sp_vectors)} sp, {len(joint_vectors)} joint vectors"
    )


if __name__ == "__main__":
    main()
