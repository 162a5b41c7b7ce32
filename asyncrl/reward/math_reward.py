"""Math reward: is the completion's final answer equal to the reference answer?

The final answer is found the way people and models write it, strongest marker first: the last
``\\boxed{...}`` (braces balanced, so nested LaTeX survives), an ``<answer>...</answer>`` tag, GSM8K's
``#### 42``, then "the answer is 42" / "answer: 42"; with no marker, math-verify's own extraction over the
end of the text (the last number or formula). The gold answer goes through the same extraction, so a GSM8K
solution, a MATH solution with ``\\boxed{}`` or a bare answer all work as the reference.

Comparison: plain numbers (integers, decimals, ``a/b``, ``\\frac{a}{b}``, thousands separators, ``$`` and
``%`` signs) are compared exactly as fractions (equal, or equal to 6 decimals and within a relative 1e-5), without
sympy; anything else goes to
``math_verify.verify`` (symbolic equivalence: LaTeX vs plain, intervals, sets, expressions). Time is bounded:
math-verify's own alarms in a main thread (a reward worker), and the reward service's per-call timeout
around everything.
"""

from __future__ import annotations

import re
import threading
from fractions import Fraction

TAIL_CHARS = 2000  # without a marker, only the end of a long completion is searched
MAX_ANSWER_CHARS = 1000  # longer "answers" are garbage; sympy on them would only burn time
ROUND_DIGITS = 6

ANSWER_TAG_RE = re.compile(r"<answer>\s*(.*?)\s*</answer>", re.DOTALL | re.IGNORECASE)
GSM8K_RE = re.compile(r"####\s*([^\n]+)")
BOLD_RE = r"(?<![\w)\]}])\*\*(?=\S)(.+?)(?<=\S)\*\*(?![\w(\[{])"
"""A pair of markdown bold markers: not next to an operand (then ``**`` is a power)."""
VARIABLES = set("abcdeijknpqrtxyz")
"""A single letter after a number that is a factor, not a unit: ``5 i`` (imaginary), ``3 x``, ``2 n``."""
ANSWER_IS_RE = re.compile(r"answer\s*(?:is|:|=)\s*:?\s*", re.IGNORECASE)  # the answer follows the last one
NUMBER_RE = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)?(?:\.\d+)?(?:[eE][-+]?\d+)?")
FRAC_RE = re.compile(r"^([-+]?)\\[dt]?frac\{([-+]?\d+)\}\{([-+]?\d+)\}$")


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` or ``\\fbox{...}`` (nested braces kept), or ``\\boxed 5``; ''
    when the box is never closed (a cut-off completion); None when there is no box."""
    boxed, fbox = text.rfind("\\boxed"), text.rfind("\\fbox")
    if max(boxed, fbox) < 0:
        return None
    rest = text[boxed + len("\\boxed") :] if boxed > fbox else text[fbox + len("\\fbox") :]
    if not rest.lstrip().startswith("{"):
        token = rest.split()
        return token[0].rstrip(".$") if rest[:1].isspace() and token else None
    rest = rest.lstrip()
    depth = 0
    for j, ch in enumerate(rest):
        depth += ch == "{"
        depth -= ch == "}"
        if depth == 0:
            return rest[1:j]
    return ""  # unbalanced: the completion was cut off inside the box, so it has no complete answer


def final_answer(text: str) -> str | None:
    """The marked final answer of ``text`` (see module docstring), or None when nothing is marked."""
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    tagged = ANSWER_TAG_RE.findall(text)
    if tagged:  # the tags delimit the answer: a sentence inside them is the answer
        return tagged[-1].strip()
    found = GSM8K_RE.findall(text)
    if found:
        return _trim_sentence(found[-1])
    # "Final Answer: The final answer is $42$." -> the last marker; "The answer is 42. I am sure my answer is
    # right." -> the one before a last marker that only vouches for it
    found = [_trim_sentence(text[m.end() :].split("\n", 1)[0]) for m in ANSWER_IS_RE.finditer(text)]
    found = [f for f in found if f]
    while len(found) > 1 and _vouches(found[-1]):
        found.pop()
    return found[-1] if found else None


VOUCHING = ("right", "correct", "confirmed", "checked", "verified", "sound", "consistent")
"""Words after a later "my answer is" that vouch for the answer given before instead of giving one."""


def _vouches(s: str) -> bool:
    words = re.findall(r"[a-z]+", s.lower())
    return bool(words) and words[0] in VOUCHING and not any(ch.isdigit() for ch in s)


def _trim_sentence(s: str) -> str:
    """'72. So John has...' -> '72'; '$3.5$.' -> '$3.5$' (a period that ends the sentence is not a decimal)."""
    s = s.strip()
    m = re.match(r"(.*?)\.(?:\s|$)", s)
    if m and m.group(1).strip():
        s = m.group(1)
    return s.strip().rstrip(".").strip()


def clean(answer: str) -> str:
    """Drop decoration that never changes the value: math delimiters, currency, percent, spacing macros,
    ``\\text{}`` wrappers and a sentence-final period."""
    s = re.sub(BOLD_RE, r"\1", answer.strip())  # markdown bold (2**3, x**2 + y**2 are powers: kept)
    s = re.sub(r"^\*\*|\*\*$", "", s)  # bold cut by the marker: '**Answer: 42**'
    s = re.sub(r"\\text\{([^{}]*)\}", r"\1", s)
    s = re.sub(r"\\(?:left|right|displaystyle|!|,|;|:)", "", s)
    s = s.replace("\\$", "").replace("$", "").replace("\\%", "").replace("%", "")
    s = s.replace("^\\circ", "").replace("^{\\circ}", "")
    unit = re.match(r"^(.*\d)\s+([A-Za-z]+(?:\s+[A-Za-z]+)*)$", s.strip())  # '42 apples' -> '42'
    if unit and unit.group(2) not in VARIABLES:
        s = unit.group(1)
    return s.strip().rstrip(".").strip()


def as_number(answer: str) -> Fraction | None:
    """Exact value of a plain number (``-1,234.5``, ``3/4``, ``1e5``, ``\\frac{3}{4}``), else None."""
    s = clean(answer).replace(" ", "")
    m = FRAC_RE.match(s)
    if m:
        sign, num, den = m.groups()
        return None if int(den) == 0 else Fraction(int(num), int(den)) * (-1 if sign == "-" else 1)
    parts = s.split("/")
    if len(parts) == 2:
        num, den = as_number(parts[0]), as_number(parts[1])
        return None if num is None or not den else num / den
    if not s or not NUMBER_RE.fullmatch(s) or not any(ch.isdigit() for ch in s):
        return None
    mantissa, _, exponent = s.replace(",", "").lower().partition("e")
    if not any(ch.isdigit() for ch in mantissa) or (exponent and abs(int(exponent)) > 10_000):
        return None  # 'e5' is no number; 1e999999 would allocate a huge integer
    return Fraction(mantissa) * Fraction(10) ** int(exponent or 0)


def numbers_equal(a: Fraction, b: Fraction) -> bool:
    """Equal, or equal to 6 decimals and within a relative 1e-5 (0.333333 is 1/3; 2e-7 is not 3e-7, nor 4e-7 0)."""
    return a == b or (
        round(a, ROUND_DIGITS) == round(b, ROUND_DIGITS) and abs(a - b) <= Fraction(1, 100_000) * max(abs(a), abs(b))
    )


def _verify_symbolic(gold: str, pred: str | None, pred_text: str, timeout_s: int) -> bool:
    """math-verify's parse + verify; ``pred=None`` lets it extract from the free text ``pred_text``."""
    try:
        from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify
    except ImportError:  # optional extra 'math': without it only plain numbers are compared
        return False

    timeout = timeout_s if threading.current_thread() is threading.main_thread() else None
    configs = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]
    gold_parsed = parse("\\boxed{" + gold + "}", extraction_config=configs, parsing_timeout=timeout)
    if not gold_parsed:
        gold_parsed = parse(gold, parsing_timeout=timeout)
    if pred is not None:
        pred_parsed = parse("\\boxed{" + pred + "}", extraction_config=configs, parsing_timeout=timeout)
    else:
        pred_parsed = parse(pred_text, parsing_timeout=timeout)
    if not gold_parsed or not pred_parsed:
        return False
    return bool(verify(gold_parsed, pred_parsed, float_rounding=ROUND_DIGITS, timeout_seconds=timeout))


def gold_answer(answer: str) -> str:
    """The reference answer, extracted the same way when it is a whole solution (GSM8K/MATH)."""
    text = str(answer).strip()
    marked = final_answer(text)
    return clean(marked if marked is not None else text)


def math_reward(
    prompt: str, completion: str, answer: str | int | float | None = None, *, timeout_s: int = 5, **_
) -> float:
    """1.0 if the completion's final answer equals ``answer`` (numerically or symbolically), else 0.0."""
    if answer is None or str(answer).strip() == "":
        raise ValueError("math_reward needs a non-empty 'answer' field on the item")
    gold = gold_answer(str(answer))
    if not completion or not completion.strip():
        return 0.0
    marked = final_answer(completion)
    pred = clean(marked) if marked is not None else None
    if pred is not None:
        if not pred or len(pred) > MAX_ANSWER_CHARS:
            return 0.0
        g, p = as_number(gold), as_number(pred)
        if g is not None and p is not None:
            return float(numbers_equal(g, p))
        if pred == gold:
            return 1.0
    return float(_verify_symbolic(gold, pred, completion[-TAIL_CHARS:], max(1, int(timeout_s))))
