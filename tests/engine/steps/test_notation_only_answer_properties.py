"""An answer of notation alone (`$ $`, `\\text{}`, `\\left\\right`, `\\,`, `%`, `\\quad`, `~`, `\\phantom{1}`, `{}`: what
normalize_answer drops) is no value: as a reference it is no answer (the row is left unscored, as a blank one is), and
as a completion's boxed answer it matches nothing, its own notation neither. Before, both normalized to '' and '' == '' scored
`\\boxed{$ $}` correct against the reference `$ $`."""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

from grpo_engine.config import RewardsConfig
from grpo_engine.steps.rewards import answers_match, load_reward_functions

MARKS = ["$", "\\text{}", "\\text{ }", "\\textbf{}", "\\mathrm{}", "\\mbox{}", "\\left", "\\right", "\\,", "\\;",
         "\\!", "\\ ", "%", "\\%", "^\\circ", "^{\\circ}", " ", "\t",
         # LaTeX's other spacing, placeholders, style switches, delimiters, fonts and empty groups: each alone, boxed
         # and as the reference, scored correct
         "\\quad", "\\qquad", "~", "\\:", "\\enspace", "\\hspace{1em}", "\\hspace*{2pt}", "\\phantom{1}",
         "\\hphantom{x}", "\\displaystyle", "\\scriptstyle", "\\(", "\\)", "\\[", "\\]", "{}", "{ }", "\\textit{}",
         "\\mathbf{}", "\\operatorname{}"]
NOTATION = st.lists(st.sampled_from(MARKS), min_size=1, max_size=5).map("".join).filter(lambda t: t.strip())
REFERENCES = st.one_of(NOTATION, NOTATION.map(lambda n: f"work #### {n}"), NOTATION.map(lambda n: f"\\boxed{{{n}}}"),
                       NOTATION.map(lambda n: f"x = {n}"))


def _math_accuracy():
    return load_reward_functions(RewardsConfig(functions=["math_accuracy"]), 16)[0].fn


@settings(max_examples=80, deadline=None)
@given(answer=REFERENCES, notation=NOTATION)
def test_a_reference_of_notation_alone_scores_no_completion(answer, notation):
    completions = [f"\\boxed{{{notation}}}", "\\boxed{3}", "no box"]
    scores = _math_accuracy()([""] * 3, completions, answer=[answer] * 3)
    assert scores == [None] * 3, (answer, scores)


@settings(max_examples=80, deadline=None)
@given(notation=NOTATION, other=NOTATION, value=st.integers(-99, 99))
def test_a_boxed_answer_of_notation_alone_matches_nothing(notation, other, value):
    assert not answers_match(notation, other)
    assert not answers_match(notation, str(value)) and not answers_match(str(value), notation)
    scores = _math_accuracy()([""] * 2, [f"\\boxed{{{notation}}}", f"\\boxed{{{value}}}"], answer=[str(value)] * 2)
    assert scores[0] != 1.0 and scores[1] == 1.0, scores
