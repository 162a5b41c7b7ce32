"""The math reward: a table of answer forms against gold answers, extraction helpers, bounded time."""

import time
from fractions import Fraction

import pytest

pytest.importorskip("math_verify")

from asyncrl.reward.math_reward import as_number, clean, final_answer, gold_answer, last_boxed, math_reward  # noqa: E402

from timing_for_tests import loaded

GSM8K_GOLD = "Natalie has 3 + 2 = <<3+2=5>>5 boxes.\nShe has 5 * 4 = <<5*4=20>>20 pens.\n#### 20"
MATH_GOLD = "We rationalise: $\\frac{1}{\\sqrt{2}} = \\boxed{\\frac{\\sqrt{2}}{2}}$."

# (completion, gold answer, expected reward)
CASES = [
    # equivalent forms
    ("The answer is 42.", "42", 1.0),
    ("Adding up gives 40 + 2.\n#### 42", "42", 1.0),
    ("So the total is \\boxed{42}.", "42", 1.0),
    ("so \\boxed{\\frac{3}{4}}", "0.75", 1.0),
    ("The answer is 0.75", "\\frac{3}{4}", 1.0),
    ("The answer is 3/4.", "$\\frac{3}{4}$", 1.0),
    ("\\boxed{\\dfrac{3}{4}}", "3/4", 1.0),
    ("\\boxed{2/3}", "0.6666667", 1.0),
    ("The answer is 0.6666667", "\\boxed{2/3}", 1.0),
    ("\\boxed{0.0666668}", "0.066666793", 1.0),
    ("The answer is 1,000.", "1000", 1.0),
    ("The answer is $1,000.", "1000", 1.0),
    ("The answer is 42 apples.", "42", 1.0),
    ("I think it's 70 apples", "70", 1.0),
    ("The answer is 25\\%.", "25", 1.0),
    ("\\boxed{x^2+2x+1}", "(x+1)^2", 1.0),
    ("\\boxed{\\frac{1}{\\sqrt{2}}}", MATH_GOLD, 1.0),
    ("\\boxed{\\left(1, 2\\right)}", "(1,2)", 1.0),
    ("\\boxed{{{3}}}", "3", 1.0),
    ("x = 5", "5", 1.0),
    ("<answer>12</answer>", "12", 1.0),
    ("\\boxed{-7}", "-7", 1.0),
    ("\\boxed{20}", GSM8K_GOLD, 1.0),
    ("The answer is 20.", GSM8K_GOLD, 1.0),
    ("\\boxed{\\sqrt{2}/2}", MATH_GOLD, 1.0),
    ("Final Answer: The final answer is $42$. I hope it is correct.", "42", 1.0),  # MATH's few-shot format
    ("Answer: The answer is 42.", "42", 1.0),
    ("The answer is **42**.", "42", 1.0),
    ("**Answer: 42**", "42", 1.0),
    ("\\boxed{0.333333}", "1/3", 1.0),
    # wrong answers
    ("\\boxed{2.232}", "2.23", 0.0),
    ("\\boxed{7}", "-7", 0.0),
    ("The answer is 43.", "42", 0.0),
    ("\\boxed{\\frac{3}{5}}", "0.75", 0.0),
    ("\\boxed{x^2+1}", "(x+1)^2", 0.0),
    ("\\boxed{19}", GSM8K_GOLD, 0.0),
    ("First \\boxed{20}, no wait, \\boxed{21}", "20", 0.0),
    ("\\boxed{2e-7}", "3e-7", 0.0),  # small numbers are not all equal to 6 decimals
    ("\\boxed{0.0000004}", "0", 0.0),
    ("\\boxed{5 i}", "5", 0.0),  # a letter that is a factor is not a unit
    ("\\boxed{2**3}", "23", 0.0),  # a power, not bold
    ("\\boxed{2**10}", "210", 0.0),
    ("\\boxed{x2}", "x**2", 0.0),
    ("\\boxed{23}", "2**3", 0.0),
    ("\\boxed{x**2 + y**2}", "x2 + y2", 0.0),
    ("The answer is 42. I am confident my answer is right.", "42", 1.0),  # a later marker with no answer
    ("Option (A) says answer = 12, which fails. The answer is B.", "B", 1.0),  # a word answer after a number
    ("Checking x = 2: answer is 5? No. Therefore the answer is even.", "even", 1.0),
    ("The answer is 41. No wait, the answer is 42.", "42", 1.0),
    ("The answer is 3 x.", "3", 0.0),
    ("The answer is 12 m.", "12", 1.0),
    # empty and garbage
    ("", "42", 0.0),
    ("   \n ", "42", 0.0),
    ("\\boxed{}", "42", 0.0),
    ("asdf qwer zxcv", "42", 0.0),
    ("}}}{{{\\boxed{{}}{", "42", 0.0),
    ("The answer is banana.", "42", 0.0),
    ("\\boxed{\\frac{1}{2}", "0.5", 0.0),  # cut off inside the box: no complete answer
    # huge numbers
    ("\\boxed{123456789012345678901234567890}", "123456789012345678901234567890", 1.0),
    ("\\boxed{123456789012345678901234567891}", "123456789012345678901234567890", 0.0),
    ("The answer is 1e400.", "1e400", 1.0),
    ("\\boxed{1e999999}", "5", 0.0),
    ("\\boxed{10^{100}}", "$10^{100}$", 1.0),
    # nested braces
    ("\\boxed{\\frac{\\frac{1}{2}}{\\frac{3}{4}}}", "2/3", 1.0),
    ("\\boxed{\\sqrt{\\frac{16}{\\left(2\\right)^{2}}}}", "2", 1.0),
]


@pytest.mark.parametrize("completion,gold,expected", CASES)
def test_math_answer_table(completion, gold, expected):
    assert math_reward("q", completion, answer=gold) == expected


def test_table_is_large_enough():
    assert len(CASES) >= 30


def test_last_boxed_keeps_nested_braces_and_takes_the_last():
    assert last_boxed("a \\boxed{1} b \\boxed{\\frac{a}{b^{2}}} c") == "\\frac{a}{b^{2}}"
    assert last_boxed("\\fbox{7}") == "7"
    assert last_boxed("\\boxed 5.") == "5"
    assert last_boxed("\\boxed{\\frac{1}{2}") == ""
    assert last_boxed("no box") is None


def test_final_answer_marker_priority():
    assert final_answer("The answer is 4. So \\boxed{5}") == "5"
    assert final_answer("step\n#### 1,234\n") == "1,234"
    assert final_answer("Therefore the answer is $3.5$. Done") == "$3.5$"
    assert final_answer("nothing marked 17") is None
    assert final_answer("<answer>Tom sat. Ann stood.</answer>") == "Tom sat. Ann stood."  # tags hold it whole


def test_number_parsing_is_exact():
    assert as_number("-1,234.5") == Fraction(-2469, 2)
    assert as_number("\\frac{3}{4}") == Fraction(3, 4)
    assert as_number("$12") == 12
    assert as_number("1/0") is None
    assert as_number("x+1") is None and as_number("e5") is None
    assert clean("\\text{5 dollars}") == "5"


def test_gold_is_extracted_like_a_prediction():
    assert gold_answer(GSM8K_GOLD) == "20"
    assert gold_answer(MATH_GOLD) == "\\frac{\\sqrt{2}}{2}"
    assert gold_answer(" 7 ") == "7"


def test_missing_gold_is_an_error_not_a_zero():
    with pytest.raises(ValueError, match="answer"):
        math_reward("q", "\\boxed{1}", answer="")


def test_time_per_call_is_bounded():
    """A power tower would make sympy run for ever; math-verify's alarm stops it (main thread)."""
    t0 = time.monotonic()
    assert math_reward("q", "\\boxed{9^{9^{9^{9}}}}", answer="5", timeout_s=1) == 0.0
    assert time.monotonic() - t0 < loaded(6)
