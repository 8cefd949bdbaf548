"""Keyword arguments a function does not take, refused with the name it likely meant.

Python's own error ("got an unexpected keyword argument 'ref_logp'") names neither the argument meant nor, for a
constructor bound through a signature, the function. Every public entry point checks its keywords here first, so a
typo gets one line with the closest accepted name."""

from __future__ import annotations

import difflib
import functools
import inspect
from typing import Callable, Iterable, Mapping, Optional, TypeVar

_Function = TypeVar("_Function", bound=Callable)
LISTED_CHARACTERS = 200  # the accepted names listed when none is close, at most (one short line)


def accepted_keywords(function: Callable) -> Optional[tuple[str, ...]]:
    """The names `function` takes by keyword; None when it takes **kwargs (every name is then accepted)."""
    parameters = inspect.signature(function).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    by_keyword = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return tuple(p.name for p in parameters if p.name != "self" and p.kind in by_keyword)


def _spelling(name: str) -> str:
    # the forms a name takes on its way through a config file, a command line or a dict of keywords: capitals
    # (RETURN_LOGPROBS was as far from return_logprobs as any other word), hyphens, spaces around it
    return name.strip().lower().replace("-", "_")


def closest_name(name: str, accepted: Iterable[str], cutoff: float = 0.6) -> Optional[str]:
    """The accepted name `name` most likely meant (a typo of it, in any case, with hyphens for underscores), or
    None."""
    by_spelling = {_spelling(each): each for each in accepted}
    close = difflib.get_close_matches(_spelling(name), tuple(by_spelling), n=1, cutoff=cutoff)
    return by_spelling[close[0]] if close else None


def refuse_unknown_keywords(owner: str, accepted: Optional[Iterable[str]], given: Mapping[str, object]) -> None:
    """TypeError naming the first keyword of `given` that is not `accepted` (None: any is), and the closest
    accepted one."""
    if accepted is None:
        return
    accepted = tuple(accepted)
    for name in given:
        if name not in accepted:
            close = closest_name(name, accepted)
            listed = ", ".join(accepted)
            listed = listed if len(listed) <= LISTED_CHARACTERS else listed[:LISTED_CHARACTERS - 3] + "..."
            hint = f"; did you mean {close!r}?" if close else f"; it takes {listed}"
            raise TypeError(f"{owner}() got an unexpected keyword argument {name!r:.60}{hint}")


def keywords_checked(function: _Function) -> _Function:
    """`function`, its unknown keywords refused by refuse_unknown_keywords before it runs (an __init__ or a method
    is named by its class: `LogitTransform()`, `FusedLinearGRPOLoss.forward()`)."""
    accepted = accepted_keywords(function)
    if accepted is None:
        return function
    owner = function.__qualname__.removesuffix(".__init__")

    @functools.wraps(function)
    def call(*args, **kwargs):
        refuse_unknown_keywords(owner, accepted, kwargs)
        return function(*args, **kwargs)

    return call  # type: ignore[return-value]
