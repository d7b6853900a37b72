"""Rule rewards and the answer normaliser."""

import pytest

from rlweave.rewards.normalize import answers_equal, last_boxed, normalize_answer
from rlweave.rewards.rules import arith_exact, arith_last, extract_number, format_reward, last_number, math_boxed


@pytest.mark.parametrize(
    "response,answer,expected",
    [
        ("19", 19, 1.0),
        (" 19 ", "19", 1.0),
        ("19 and more 12", 19, 1.0),
        ("=19", 19, 1.0),
        ("Answer: 19", 19, 1.0),
        ("the answer: 19", 19, 1.0),
        ("- 4", -4, 1.0),
        ("-4", 4, 0.0),
        ("1", 19, 0.0),
        ("190", 19, 0.0),
        ("19.0", 19, 1.0),
        ("", 19, 0.0),
        ("no digits", 19, 0.0),
    ],
)
def test_arith_exact(response, answer, expected):
    assert arith_exact("12+7=", response, answer=answer) == expected


def test_arith_exact_full_mode_and_errors():
    assert arith_exact("1+1=", "2", answer=2, mode="full") == 1.0
    assert arith_exact("1+1=", "2 junk", answer=2, mode="full") == 0.0
    assert arith_exact("1+1=", "2 junk", answer=2) == 1.0
    with pytest.raises(ValueError, match="answer"):
        arith_exact("1+1=", "2")
    with pytest.raises(ValueError, match="mode"):
        arith_exact("1+1=", "2", answer=2, mode="strict")
    assert extract_number("x") is None


@pytest.mark.parametrize(
    "response,expected",
    [
        ("Tom has 7 apples and buys 5 more, so 7 + 5 = 12.", "12"),
        ("56 - 14 = 42 coins", "42"),
        ("9-4", "4"),                      # an unspaced minus between numbers is not a sign
        ("The change is -3.", "-3"),
        ("(2)-3", "3"),
        ("In total 1,234 shells.", "1234"),
        ("It costs 2.50 dollars", "2.50"),
        ("**Answer: 18**", "18"),
        ("no number here", None),
    ],
)
def test_last_number(response, expected):
    assert last_number(response) == expected


def test_arith_last():
    chat = "Anna has 20 books. She gives away 8, so 20 - 8 = 12. Anna has 12 books left."
    assert arith_last("", chat, answer=12) == 1.0
    assert arith_exact("", chat, answer=12) == 0.0          # first number: 20
    assert arith_last("", chat, answer="12.0") == 1.0
    assert arith_last("", "20 - 8 = 13", answer=12) == 0.0
    assert arith_last("", "I do not know.", answer=12) == 0.0
    with pytest.raises(ValueError, match="answer"):
        arith_last("", "12")


def test_arith_last_is_registered():
    from rlweave.rewards.plugin import rlweave_rewards

    record = next(r for r in rlweave_rewards() if r.name == "arith_last")
    assert record.load() is arith_last


@pytest.mark.parametrize(
    "a,b",
    [
        ("\\frac{1}{2}", "1/2"),
        ("\\dfrac{1}{2}", "0.5"),
        ("\\frac12", "1/2"),
        ("$\\frac{3}{4}$", ".75"),
        ("1,000", "1000"),
        ("12,345.5", "12345.5"),
        ("5.", "5"),
        ("\\left(1,2\\right)", "(1,2)"),
        ("10\\%", "10"),
        ("\\text{5}", "5"),
        ("x = 3", "3"),
        ("2/4", "1/2"),
        ("-\\frac{2}{3}", "-2/3"),
        ("\\frac{\\frac{1}{2}}{2}", "1/4"),
        ("+7", "7"),
        ("\\sqrt2", "\\sqrt{2}"),
        ("3 \\, 000", "3000"),
    ],
)
def test_answers_equal(a, b):
    assert answers_equal(a, b), (normalize_answer(a), normalize_answer(b))


@pytest.mark.parametrize("a,b", [("1/2", "1/3"), ("12", "1,2"), ("", ""), ("1,2", "12"), ("1/0", "1/0x")])
def test_answers_differ(a, b):
    assert not answers_equal(a, b)


def test_last_boxed_balanced():
    assert last_boxed("so \\boxed{1} then \\boxed{\\frac{1}{2}} done") == "\\frac{1}{2}"
    assert last_boxed("\\boxed{{a}{b}}") == "{a}{b}"
    assert last_boxed("\\boxed 5 is it") == "5"
    assert last_boxed("\\boxed{unclosed") is None
    assert last_boxed("nothing") is None


def test_math_boxed():
    assert math_boxed("q", "thus \\boxed{\\dfrac{1}{2}}.", answer="0.5") == 1.0
    assert math_boxed("q", "thus \\boxed{1,000}", answer=1000) == 1.0
    assert math_boxed("q", "thus \\boxed{3}", answer="\\boxed{3}") == 1.0
    assert math_boxed("q", "thus \\boxed{4}", answer=3) == 0.0
    assert math_boxed("q", "the answer is 3", answer=3) == 0.0


def test_format_reward():
    assert format_reward("p", "work\nAnswer: 42") == 1.0
    assert format_reward("p", "42") == 1.0
    assert format_reward("p", "so \\boxed{4}") == 1.0
    assert format_reward("p", "Answer: 42\nand then chatter") == 0.0
    assert format_reward("p", "<think>x</think>ok", pattern=r"<think>.*</think>.*", where="response") == 1.0
    assert format_reward("p", "abc", pattern="b", match="search") == 1.0
    assert format_reward("p", "abc", pattern="b") == 0.0
    with pytest.raises(ValueError, match="flag"):
        format_reward("p", "x", flags="q")
