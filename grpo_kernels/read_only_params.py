"""GRPOLossConfig.loss_params as a read-only dict: the config is frozen and hashed by its values, and a dict that
changed after it was hashed (`config.loss_params["temperature_pos"] = 5.0`) left the config in a set or a cache under
its old hash, found by neither (and the run's saved config differed from the one the loss read). Still a dict, so
that asdict, JSON, YAML, == and pickle read it as one."""

from __future__ import annotations

from typing import Any, NoReturn

_REFUSAL = ("GRPOLossConfig.loss_params is read-only (the config is frozen and hashed by its values); build another "
            "with dataclasses.replace(config, loss_params={...})")


class _PlainWhenCalled(type):
    # Calling the class, as dataclasses.asdict does to copy a dict subclass, gives a plain dict: what asdict returns
    # is the caller's to change, and any YAML dumper writes it. (A metaclass, not __new__: torch.compile cannot
    # subscript a dict subclass that overrides __new__.)
    def __call__(cls, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)


class ReadOnlyParams(dict, metaclass=_PlainWhenCalled):
    """A dict whose every change in place raises TypeError in one line; copy() is a plain dict to change. Built with
    ReadOnlyParams.of(mapping) (the class called gives a plain dict)."""

    __slots__ = ()

    @classmethod
    def of(cls, mapping: dict[str, Any]) -> "ReadOnlyParams":
        params = dict.__new__(cls)
        dict.update(params, mapping)
        return params

    def _refuse(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError(_REFUSAL)

    __setitem__ = __delitem__ = __ior__ = _refuse
    clear = pop = popitem = setdefault = update = _refuse

    def copy(self) -> dict[str, Any]:
        return dict(self)

    def __reduce__(self) -> tuple:  # pickle and deepcopy rebuild it whole, never item by item through __setitem__
        return type(self).of, (dict(self),)
