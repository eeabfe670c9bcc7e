"""What the guardrails' pattern checks cost and how well they find, beside Presidio's pattern
recognizers run on the same texts in the same run (issue 36).

A generated set of chat-sized texts (about 200 characters), half holding personal data or secrets
planted where the truth is known (e-mail addresses, phone numbers from libphonenumber's examples,
card numbers with a right Luhn digit, IBANs with right check digits, IP addresses, API keys), half
holding only lookalikes (a card number one digit off, an IBAN with wrong check digits, a version
string, an order number). Each side finds what it finds in each text; a finding counts where it
covers a planted value. Figures: time per text p50/p99 (one core, in-process), precision and
recall per kind. Presidio (presidio-analyzer's predefined pattern recognizers, no NLP model) is
installed once into ~/.cache/llmgw/presidio; where it does not install, its row says why.
Run with `python tests/bench/guard.py` (`just bench` runs it too).
"""

from __future__ import annotations

import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import phonenumbers
from stdnum import iban, luhn

sys.path.insert(0, str(Path(__file__).parent))
from gateway_peers import Unavailable, _venv_tool

from llmgw.router.guard.find import find

KINDS = ("email", "phone", "card", "iban", "ip", "secret")
_PRESIDIO = {
    "email": "EMAIL_ADDRESS",
    "phone": "PHONE_NUMBER",
    "card": "CREDIT_CARD",
    "iban": "IBAN_CODE",
    "ip": "IP_ADDRESS",
}
_FILLER = "Thanks for the update on the quarterly numbers; could you check the notes before Monday and "


def _value(kind: str, rng: random.Random) -> str:
    if kind == "email":
        name, domain = rng.choice(["ada", "bob", "chen", "dana"]), rng.choice(["example.com", "corp.io"])
        return f"{name}.{rng.randint(1, 999)}@{domain}"
    if kind == "phone":
        number = phonenumbers.example_number(rng.choice(["GB", "DE", "FR", "US", "TR", "NL"]))
        return phonenumbers.format_number(number, phonenumbers.PhoneNumberFormat.INTERNATIONAL)
    if kind == "card":
        body = "4" + "".join(str(rng.randint(0, 9)) for _ in range(14))
        digits = body + luhn.calc_check_digit(body)
        return " ".join(digits[i : i + 4] for i in range(0, 16, 4))
    if kind == "iban":
        bban = "WEST" + "".join(str(rng.randint(0, 9)) for _ in range(14))
        return iban.format("GB" + iban.calc_check_digits("GB00" + bban) + bban)
    if kind == "ip":
        return ".".join(str(rng.randint(1, 254)) for _ in range(4))
    return "sk-" + "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(40))


def _lookalike(rng: random.Random) -> str:
    card = "4" + "".join(str(rng.randint(0, 9)) for _ in range(14))
    wrong = str((int(luhn.calc_check_digit(card)) + 1) % 10)
    return rng.choice(
        [
            " ".join((card + wrong)[i : i + 4] for i in range(0, 16, 4)),
            "GB00 WEST 1234 5698 7654 32",
            "version " + ".".join(str(rng.randint(0, 9)) for _ in range(5)),
            f"order #{rng.randint(10**7, 10**8)}",
        ]
    )


def texts(n: int, seed: int = 7) -> list[tuple[str, list[tuple[int, int, str]]]]:
    """`n` texts, each with its planted values (start, end, kind)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        text, planted = _FILLER[: rng.randint(40, 90)], []
        for kind in rng.sample(KINDS, 2) if i % 2 == 0 else []:
            value = _value(kind, rng)
            text += f" {rng.choice(['reach', 'see', 'use'])} "
            planted.append((len(text), len(text) + len(value), kind))
            text += value
        text += f" and {_lookalike(rng)} " + _FILLER[: rng.randint(20, 80)]
        out.append((text, planted))
    return out


def score(found: list[list[tuple[int, int, str]]], data) -> dict[str, tuple[float, float]]:
    """Per kind: precision and recall of `found` (start, end, kind) against the planted values."""
    result = {}
    for kind in KINDS:
        true_pos = false_pos = missed = 0
        for hits, (_, planted) in zip(found, data, strict=True):
            truth = [(s, e) for s, e, k in planted if k == kind]
            mine = [(s, e) for s, e, k in hits if k == kind]
            covered = {t for t in truth if any(s <= t[0] and e >= t[1] - 1 for s, e in mine)}
            true_pos += len(covered)
            missed += len(truth) - len(covered)
            false_pos += sum(1 for s, e in mine if not any(s <= t[0] + 1 and e >= t[1] - 1 for t in truth))
        precision = true_pos / (true_pos + false_pos) if true_pos + false_pos else 1.0
        recall = true_pos / (true_pos + missed) if true_pos + missed else 1.0
        result[kind] = (precision, recall)
    return result


def run_llmgw(data) -> tuple[list[float], list]:
    times, found = [], []
    for text, _ in data:
        started = time.perf_counter()
        hits = find(text, KINDS)
        times.append(time.perf_counter() - started)
        found.append([(h.start, h.end, h.category.lower()) for h in hits])
    return times, found


_PRESIDIO_RUN = """
import json, sys, time
from presidio_analyzer.predefined_recognizers import (
    CreditCardRecognizer, EmailRecognizer, IbanRecognizer, IpRecognizer, PhoneRecognizer)
names = {"EMAIL_ADDRESS": "email", "PHONE_NUMBER": "phone", "CREDIT_CARD": "card", "IBAN_CODE": "iban",
         "IP_ADDRESS": "ip"}
recognizers = [EmailRecognizer(), PhoneRecognizer(), CreditCardRecognizer(), IbanRecognizer(), IpRecognizer()]
texts = json.load(open(sys.argv[1]))
out = []
for text in texts:
    started = time.perf_counter()
    hits = [r for rec in recognizers for r in rec.analyze(text, rec.supported_entities, None)]
    took = time.perf_counter() - started
    out.append([took, [(h.start, h.end, names[h.entity_type]) for h in hits if h.score >= 0.4]])
json.dump(out, sys.stdout)
"""


def run_presidio(data) -> tuple[list[float], list]:
    python = _venv_tool("presidio", "presidio-analyzer==2.2.366", "python")
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump([t for t, _ in data], f)
    done = subprocess.run([str(python), "-c", _PRESIDIO_RUN, f.name], capture_output=True, text=True, timeout=1800)
    if done.returncode:
        raise Unavailable(f"presidio did not run: {done.stderr.strip()[-200:]}")
    got = json.loads(done.stdout)
    return [t for t, _ in got], [[tuple(h) for h in hits] for _, hits in got]


def _row(name: str, times: list[float], scored: dict) -> str:
    q = statistics.quantiles(times, n=100)
    cells = " | ".join(f"{p:.2f} / {r:.2f}" for p, r in (scored[k] for k in KINDS))
    return f"| {name} | {q[49] * 1000:.3f} | {q[98] * 1000:.3f} | {cells} |"


def main() -> None:
    data = texts(2000)
    print("| checks | p50 ms a text | p99 ms a text | " + " | ".join(f"{k} P / R" for k in KINDS) + " |")
    print("|---|---|---|" + "---|" * len(KINDS))
    times, found = run_llmgw(data)
    print(_row("llmgw pii (RE2 + libphonenumber + stdnum)", times, score(found, data)), flush=True)
    try:
        times, found = run_presidio(data)
        scored = score(found, data)
        scored["secret"] = (float("nan"), 0.0)  # Presidio's pattern recognizers have no API-key kind
        print(_row("Presidio pattern recognizers (no NLP model)", times, scored))
    except Unavailable as exc:
        print(f"| Presidio | {exc} |")
    print(f"\n{len(data)} texts of about 200 characters, half with two planted values, all with a lookalike.")


if __name__ == "__main__":
    main()
