from __future__ import annotations

from kvgraft.generalization.leakage import answer_in_text, leakage, leakage_for, normalize_tokens
from kvgraft.generalization.problems import Problem

QUERY = Problem(
    id="q",
    problem=(
        "Janet's ducks lay 16 eggs per day. She eats three for breakfast every morning and bakes muffins for her "
        "friends every day with four. She sells the remainder at the farmers' market daily for $2 per fresh duck egg. "
        "How much in dollars does she make every day at the farmers' market?"
    ),
    answer="18",
    solution="Janet sells 16 - 3 - 4 = 9 duck eggs a day. She makes 9 * 2 = $18 every day at the farmer's market.",
)

OTHER = (
    "Problem: A farmer has 24 cows. Every day each cow gives 3 litres of milk, and she sells the milk at the market "
    "for $2 per litre. How much does she make every day?\n"
    "Solution: The cows give 24 * 3 = 72 litres per day. She makes 72 * 2 = $144 every day.\nAnswer: 144"
)


def test_tokens_follow_the_janitor() -> None:
    assert normalize_tokens("Janet’s DUCKS, lay 16-eggs!") == ["janets", "ducks", "lay", "16eggs"]


def test_planted_problem_with_other_case_and_punctuation() -> None:
    mangled = QUERY.problem.upper().replace(".", ";").replace("'", "").replace("?", "!!")
    entry = f"Some preamble about cooking. {mangled} And then a different story follows here."
    r = leakage(entry, problem=QUERY.problem, answer=None)
    assert r.problem_in_entry and r.contaminated and r.text_overlap
    assert r.problem_n == 13 and r.problem_ngrams == len(normalize_tokens(QUERY.problem)) - 12
    assert not r.answer_in_entry and not r.solution_in_entry


def test_partial_problem_single_13gram_counts() -> None:
    words = normalize_tokens(QUERY.problem)
    entry = "unrelated words " + " ".join(words[20:33]) + " more unrelated words"
    r = leakage_for(entry, QUERY)
    assert r.problem_in_entry and r.problem_ngrams == 1
    twelve = "unrelated words " + " ".join(words[20:32]) + " more unrelated words"
    assert not leakage_for(twelve, QUERY).problem_in_entry


def test_planted_solution_and_answer() -> None:
    # re-punctuated and re-cased: '16-3-4' deletes to one token, so only the 13-grams after it survive
    entry = "Reference: JANET SELLS 16-3-4 = 9 duck eggs a day; she makes 9 * 2 = $18 every day at the farmer’s market!"
    r = leakage_for(entry, QUERY)
    assert r.answer_in_entry and r.solution_in_entry and r.contaminated
    verbatim = f"Notes. {QUERY.solution} End."
    r2 = leakage_for(verbatim, QUERY)
    assert r2.solution_in_entry and r2.answer_in_entry and r2.contaminated
    assert 0 < r.solution_ngrams < r2.solution_ngrams == len(normalize_tokens(QUERY.solution or "")) - 12
    assert not r.problem_in_entry


def test_answer_embedded() -> None:
    assert answer_in_text("18", "so the total is 18.")
    assert answer_in_text("18", "Answer: $18")
    assert answer_in_text("1000", "she paid $1,000 in total")
    assert answer_in_text("1,000", "she paid 1000.00 dollars")
    assert answer_in_text("0.5", "half, i.e. \\frac{1}{2}")
    assert answer_in_text("336^\\circ", "the arcs sum to 336 degrees")
    assert answer_in_text("-3", "x = -3")
    assert answer_in_text("x=2, y=1", "so $x = 2, y = 1$ is the only solution")
    assert answer_in_text("No", "No, because 7 is odd.")


def test_answer_inside_a_longer_number_is_clean() -> None:
    for text in ["In 2018 there were 180 ducks", "the price is 18.5 dollars", "call 1-800-318-1234", "3.18 metres", "x18y"]:
        assert not answer_in_text("18", text.replace("x18y", "x 118 y")), text
    assert not answer_in_text("-3", "5 + 3 = 8")
    assert not answer_in_text("No", "Now we note nothing")
    assert not answer_in_text("x=2, y=1", "so x=2, y=10 works")
    assert not answer_in_text("", "anything 0")


def test_clean_control_sharing_common_words() -> None:
    r = leakage_for(OTHER, QUERY)
    # shares 'every day', 'at the market', 'she makes', '$2 per' ... but no 13-gram and not the number 18
    assert not r.problem_in_entry and not r.solution_in_entry and not r.answer_in_entry
    assert not r.contaminated and r.problem_ngrams == 0 and r.solution_ngrams == 0
    assert r.as_dict()["text_overlap"] is False


def test_short_problem_uses_whole_problem() -> None:
    short = Problem("s", "What is seven times six?", "42", None)
    r = leakage_for("Quiz: WHAT IS SEVEN TIMES SIX? Think.", short)
    assert r.problem_in_entry and r.problem_n == 5 and r.problem_ngrams == 1
    assert not leakage_for("What is seven times eight?", short).problem_in_entry
    assert leakage_for("nothing", short).solution_n == 0
