"""The whole numbers of options that are not config keys (eval's --batch-size, serve's --port, the tools' counts):
int() also read '1_0' as 10 and other scripts' digits ('５' as 5), which the config keys refuse; now every such
option takes ASCII digits only, as the config does, and refuses the rest in the parser's one line."""

from __future__ import annotations

import argparse

import pytest
from hypothesis import given, strategies as st

from grpo_engine.cli_types import bounded_int, positive_int

_ASCII_NUMBER = st.integers(-10**6, 10**6).map(str)


@given(number=_ASCII_NUMBER, sign=st.sampled_from(["", "+"]), pad=st.sampled_from(["", " "]))
def test_ascii_whole_numbers_read_as_themselves(number, sign, pad):
    parse = bounded_int(-10**6, 10**6)
    text = pad + (sign + number if not number.startswith("-") else number) + pad
    assert parse(text) == int(number)


@given(digits=st.text(st.characters(categories=["Nd"]), min_size=1, max_size=4).filter(lambda t: not t.isascii()),
       number=st.integers(1, 999))
def test_digits_of_other_scripts_and_underscores_are_refused(digits, number):
    for text in (digits, f"{number}_0", str(number) + digits, "1_000"):
        with pytest.raises(argparse.ArgumentTypeError) as refused:
            positive_int(text)
        assert "expected an integer from 1" in str(refused.value) and "\n" not in str(refused.value)
